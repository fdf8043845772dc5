"""The etcd cluster under three coordinators: one member on each coordinator host, run by the unit
tfcluster-etcd.service from the host's own etcd (Debian's package etcd-server, /usr/bin/etcd), with TLS for peers
and clients from a CA of etcd's own that `up` makes beside the cluster's (docs/operators.md#three-coordinators).

Why a CA of its own: the cluster CA signs every node's certificate, and etcd with client-certificate auth takes
any certificate its CA signed; with the cluster CA, every agent's key would open the store. etcd's CA signs only
one certificate per coordinator host, which its member serves and peers with, and its coordinator presents to
etcd as a client. Its key stays on the operator's machine.

Pure: the certificates come in; the text of the host's files goes out.
"""

from __future__ import annotations

import hashlib

from tfcluster.bringup.hostfiles import ETC, STATE_DIR, UNIT_DIR, Desired, File, Service, unit_text
from tfcluster.bringup.inventory import Host, Inventory, with_port
from tfcluster.credentials import CA_CERT

ETCD_BINARY = "/usr/bin/etcd"                  # as the unit runs it
INSTALL_REMEDY = "apt-get install etcd-server (Debian and Ubuntu; it provides /usr/bin/etcd)"
ETCD_UNIT = "tfcluster-etcd.service"
ETCD_ENV_FILE = f"{ETC}/etcd.env"
TLS_DIR = f"{ETC}/etcd"
MEMBER_CERT, MEMBER_KEY = "member.crt", "member.key"
DATA_DIR = f"{STATE_DIR}/etcd"                 # as the unit names it
CLIENT_PORT, PEER_PORT = 2379, 2380
STORE_PREFIX = "/tfcluster"
READY_SECONDS = 180   # a member waits this long for the others (they install in parallel) before `up` fails


def address(host: Host) -> str:
    """The IP address the member listens on and is reached at (etcd listens on addresses, not names)."""
    return host.advertise_address or host.host


def _url(host: Host, port: int) -> str:
    return f"https://{with_port(address(host), port)}"


def store_url(inventory: Inventory) -> str:
    endpoints = ",".join(with_port(address(h), CLIENT_PORT) for h in inventory.coordinators)
    return f"etcd://{endpoints}{STORE_PREFIX}"


def member_name(host: Host) -> str:
    return host.host


def peer_url(host: Host) -> str:
    """What etcd knows a member by: membership.py tells the inventory's hosts from etcd's members with it."""
    return _url(host, PEER_PORT)


def initial_cluster(inventory: Inventory) -> str:
    """ETCD_INITIAL_CLUSTER: the members etcd is made with, `name=peer URL` each."""
    return ",".join(f"{member_name(h)}={peer_url(h)}" for h in inventory.coordinators)


def client(host: Host) -> dict:
    """What remote.py needs to call the member on host as its own client (its URL, etcd's CA, its certificate)."""
    return {"client_url": _url(host, CLIENT_PORT), "ca": f"{TLS_DIR}/{CA_CERT}", "cert": f"{TLS_DIR}/{MEMBER_CERT}",
            "key": f"{TLS_DIR}/{MEMBER_KEY}"}


def members_probe(host: Host) -> dict:
    """The probe's request for the member list (answered where the host holds a member's data)."""
    return {**client(host), "data_dir": DATA_DIR}


def member_add(through: Host, host: Host) -> dict:
    """remote.py's action that adds host's member, made through the member on `through`."""
    return {"kind": "etcd_member", **client(through), "path": "/v3/cluster/member/add",
            "body": {"peerURLs": [peer_url(host)]}}


def member_remove(through: Host, member_id: str) -> dict:
    return {"kind": "etcd_member", **client(through), "path": "/v3/cluster/member/remove", "body": {"ID": member_id}}


def coordinator_args(inventory: Inventory, host: Host) -> str:
    """The coordinator's flags for the store (TFCLUSTER_COORDINATOR_ARGS): the three members, the member's
    certificate as its client certificate, and the name agents and clients reach it by when it leads."""
    return f"--store {store_url(inventory)} {' '.join(client_flags())} --advertise-address {host.host}"


def client_flags() -> list[str]:
    """A coordinator host's flags for reaching etcd as a client: the member's certificate."""
    return ["--etcd-ca", f"{TLS_DIR}/{CA_CERT}", "--etcd-cert", f"{TLS_DIR}/{MEMBER_CERT}", "--etcd-key",
            f"{TLS_DIR}/{MEMBER_KEY}"]


def env_file(inventory: Inventory, host: Host, etcd_ca: bytes, initial: tuple[str, str] | None = None) -> bytes:
    """etcd's configuration, as the ETCD_* variables etcd reads (the data dir is on the unit's command line).
    The initial cluster and its state count only at a member's first start: a member whose data dir exists
    joins with what it holds, so a second `up`, or a restart, never initialises it again. initial: (cluster,
    state) where they are not the inventory's coordinators and `new` (membership.initial says which)."""
    cluster, state = initial or (initial_cluster(inventory), "new")
    tls = {"ETCD_CERT_FILE": f"{TLS_DIR}/{MEMBER_CERT}", "ETCD_KEY_FILE": f"{TLS_DIR}/{MEMBER_KEY}",
           "ETCD_TRUSTED_CA_FILE": f"{TLS_DIR}/{CA_CERT}", "ETCD_CLIENT_CERT_AUTH": "true"}
    values = {"ETCD_NAME": member_name(host),
              "ETCD_LISTEN_CLIENT_URLS": _url(host, CLIENT_PORT),
              "ETCD_ADVERTISE_CLIENT_URLS": _url(host, CLIENT_PORT),
              "ETCD_LISTEN_PEER_URLS": _url(host, PEER_PORT),
              "ETCD_INITIAL_ADVERTISE_PEER_URLS": _url(host, PEER_PORT),
              "ETCD_INITIAL_CLUSTER": cluster,
              "ETCD_INITIAL_CLUSTER_STATE": state,
              # Unique to this cluster's etcd CA: members of another cluster never take these for peers.
              "ETCD_INITIAL_CLUSTER_TOKEN": "tfcluster-" + hashlib.sha256(etcd_ca).hexdigest()[:16],
              **tls, **{k.replace("ETCD_", "ETCD_PEER_", 1): v for k, v in tls.items()},
              # etcd would also check that a peer connects from an address its certificate names; a host with
              # several addresses may pick another. etcd's CA signs members' certificates alone, so the
              # signature already says a member connects.
              "ETCD_EXPERIMENTAL_PEER_SKIP_CLIENT_SAN_VERIFICATION": "true"}
    lines = ["# Written by `tfcluster up` from its inventory: the next `tfcluster up` puts back what is changed here."]
    lines += [f"{name}={value}" for name, value in values.items()]
    return ("\n".join(lines) + "\n").encode()


def add_member(wanted: Desired, inventory: Inventory, host: Host, tls: dict[str, bytes],
               initial: tuple[str, str] | None = None) -> None:
    """The member's files and its service, to start before the coordinator. tls: ca.crt, member.crt, member.key."""
    wanted.files[f"{TLS_DIR}/{CA_CERT}"] = File(tls[CA_CERT], 0o644)
    wanted.files[f"{TLS_DIR}/{MEMBER_CERT}"] = File(tls[MEMBER_CERT], 0o644)
    wanted.files[f"{TLS_DIR}/{MEMBER_KEY}"] = File(tls[MEMBER_KEY], 0o600)
    wanted.files[ETCD_ENV_FILE] = File(env_file(inventory, host, tls[CA_CERT], initial), 0o600)
    wanted.files[f"{UNIT_DIR}/{ETCD_UNIT}"] = File(unit_text(ETCD_UNIT), 0o644)
    wanted.services[ETCD_UNIT] = Service(
        reads=(ETCD_ENV_FILE, f"{UNIT_DIR}/{ETCD_UNIT}", *(f"{TLS_DIR}/{n}" for n in (CA_CERT, MEMBER_CERT,
                                                                                        MEMBER_KEY))),
        env_file=ETCD_ENV_FILE, uses_software=False,
        ready={"kind": "wait_etcd", "url": f"{_url(host, CLIENT_PORT)}/health", **client(host),
               "seconds": READY_SECONDS})


def owned_paths() -> list[str]:
    return [ETCD_ENV_FILE, f"{UNIT_DIR}/{ETCD_UNIT}", *(f"{TLS_DIR}/{n}" for n in (CA_CERT, MEMBER_CERT, MEMBER_KEY))]
