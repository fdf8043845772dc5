"""What a host of the inventory should hold once `tfcluster up` is done: its files (with modes), its services and
the software in its virtualenv. Pure: the CA's files and the software's id come in, nothing is read here but the
unit templates shipped in this package."""

from __future__ import annotations

from tfcluster.bringup import etcd
from tfcluster.bringup.hostfiles import ENV_FILE, ETC, STATE_DIR, UNIT_DIR, Desired, File, Service, unit_text
from tfcluster.bringup.inventory import COORDINATOR_PORT, Host, Inventory, with_port
from tfcluster.credentials import CA_CERT, CA_KEY, NODE_CERT, SERVER_CERT, SERVER_KEY

CA_DIR = f"{ETC}/ca"                          # a coordinator's: the CA's key and the coordinator's certificate
AGENT_CA_CERT = f"{ETC}/{CA_CERT}"            # an agent's: trusts the coordinator it joins
JOIN_TOKEN_FILE = f"{ETC}/join-token"         # an agent's single-use token until it has joined (root-only)
AGENT_STATE_DIR = f"{STATE_DIR}/agent"        # as the agent unit names it
NODE_CERT_PATH = f"{AGENT_STATE_DIR}/tls/{NODE_CERT}"
WHEELHOUSE_DIR = "/var/cache/tfcluster-wheelhouse"   # on a host while it installs; removed after
COORDINATOR_UNIT, AGENT_UNIT = "tfcluster-coordinator.service", "tfcluster-agent.service"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def desired(inventory: Inventory, host: Host, ca_files: dict[str, bytes],
            etcd_tls: dict[str, bytes] | None = None, etcd_initial: tuple[str, str] | None = None) -> Desired:
    """ca_files: the CA directory's ca.crt, ca.key, coordinator.crt and coordinator.key, by name; etcd_tls: with
    three coordinators, a coordinator host's etcd files (etcd.add_member); etcd_initial: its member's initial
    cluster and state, where membership.initial says other than the inventory's."""
    wanted = Desired()
    wanted.files[ENV_FILE] = File(env_file(inventory, host), 0o600)
    if host.coordinator and inventory.on_etcd:
        etcd.add_member(wanted, inventory, host, etcd_tls, etcd_initial)
    if host.coordinator:
        for name in (CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY):
            wanted.files[f"{CA_DIR}/{name}"] = File(ca_files[name], 0o600)
        wanted.files[f"{UNIT_DIR}/{COORDINATOR_UNIT}"] = File(unit_text(COORDINATOR_UNIT), 0o644)
        wanted.services[COORDINATOR_UNIT] = Service((ENV_FILE, f"{UNIT_DIR}/{COORDINATOR_UNIT}",
                                                     *(f"{CA_DIR}/{n}" for n in (CA_CERT, CA_KEY, SERVER_CERT,
                                                                                 SERVER_KEY))))
    if host.agent:
        wanted.files[AGENT_CA_CERT] = File(ca_files[CA_CERT], 0o644)
        wanted.files[f"{UNIT_DIR}/{AGENT_UNIT}"] = File(unit_text(AGENT_UNIT), 0o644)
        wanted.services[AGENT_UNIT] = Service((ENV_FILE, f"{UNIT_DIR}/{AGENT_UNIT}", AGENT_CA_CERT))
    return wanted


def env_file(inventory: Inventory, host: Host) -> bytes:
    """The hosts's /etc/tfcluster/tfcluster.env (systemd's EnvironmentFile; systemd/tfcluster.env.example says
    what each variable does)."""
    values = {"PATH": f"{inventory.software.prefix}/bin:{SYSTEM_PATH}",
              "TFCLUSTER_COORDINATOR": inventory.coordinator_address}
    if host.coordinator:
        values |= {"TFCLUSTER_LISTEN": f"0.0.0.0:{COORDINATOR_PORT}", "TFCLUSTER_CA_DIR": CA_DIR}
        if inventory.on_etcd:
            # Each on the address it is known by, as its etcd member: a standby bound to every interface would
            # share the port of any other coordinator where two share an address space (gRPC binds with
            # SO_REUSEPORT), and answer for it.
            values["TFCLUSTER_LISTEN"] = with_port(etcd.address(host), COORDINATOR_PORT)
            values["TFCLUSTER_COORDINATOR_ARGS"] = etcd.coordinator_args(inventory, host)
    if host.agent:
        values |= {"TFCLUSTER_PORT_RANGE": host.port_range,
                   "TFCLUSTER_ADVERTISE_ADDRESS": host.advertise_address or "",
                   "TFCLUSTER_GPU_INVENTORY": "none" if host.gpus == 0 else "",
                   "TFCLUSTER_NODE_NAME": host.name or "",
                   "TFCLUSTER_CA_CERT": AGENT_CA_CERT,
                   "TFCLUSTER_JOIN_TOKEN_FILE": JOIN_TOKEN_FILE}
        if host.labels:  # the agent reads them as its --label flags (a node without labels has no line)
            values["TFCLUSTER_LABELS"] = " ".join(host.labels)
    lines = ["# Written by `tfcluster up` from its inventory: the next `tfcluster up` puts back what is changed here."]
    lines += [f"{name}={value}" for name, value in values.items()]
    return ("\n".join(lines) + "\n").encode()


def services(inventory: Inventory, host: Host) -> list[str]:
    """The units `up` runs on host, in the order they start (`down` stops them the other way round)."""
    return [s for s, on in ((etcd.ETCD_UNIT, host.coordinator and inventory.on_etcd),
                            (COORDINATOR_UNIT, host.coordinator), (AGENT_UNIT, host.agent)) if on]


def owned_paths(inventory: Inventory, host: Host) -> list[str]:
    """Every file `up` may write on host, for the probe to hash."""
    return [*etcd.owned_paths(), ENV_FILE, *(f"{CA_DIR}/{n}" for n in (CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY)),
            AGENT_CA_CERT, JOIN_TOKEN_FILE, f"{UNIT_DIR}/{COORDINATOR_UNIT}", f"{UNIT_DIR}/{AGENT_UNIT}"]
