"""The cluster's CA on the operator's machine: made once by the first `up` (in the operator dir, beside the
inventory), with a coordinator certificate naming every coordinator host, and the admin credentials `up` and the
operator use. Its key leaves this machine only for the coordinator hosts, which sign nodes' certificates."""

from __future__ import annotations

from pathlib import Path

from tfcluster.bringup.inventory import Inventory
from tfcluster.credentials import CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY

CHECK_PLACEHOLDER = b"(made by the first `tfcluster up`)"


def ca_dir(operator_dir: Path) -> Path:
    return operator_dir / "ca"


def admin_dir(operator_dir: Path) -> Path:
    return ca_dir(operator_dir) / "admin"


def files(operator_dir: Path, inventory: Inventory, create: bool) -> dict[str, bytes]:
    """The CA's files the coordinator hosts get, by name. Makes the CA when there is none (unless not create:
    then what would be made is stood for by a placeholder), and the coordinator's certificate again when it does
    not name every coordinator host."""
    from tfcluster import pki

    directory = ca_dir(operator_dir)
    names = [h.host for h in inventory.coordinators]
    if not (directory / CA_KEY).exists():
        if not create:
            return {name: CHECK_PLACEHOLDER for name in (CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY)}
        operator_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        pki.init_ca(directory, names)
    elif create and not set(names) <= set(pki.server_names(pki.load_cert(directory / SERVER_CERT))):
        known = pki.server_names(pki.load_cert(directory / SERVER_CERT))
        pki.write_coordinator_certificate(pki.Authority.load(directory, with_key=True), directory,
                                          [n for n in known if n != pki.COORDINATOR_NAME] + names)
    return {name: (directory / name).read_bytes() for name in (CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY)}


def etcd_dir(operator_dir: Path) -> Path:
    return operator_dir / "etcd-ca"


def etcd_files(operator_dir: Path, inventory: Inventory, create: bool) -> dict[str, dict[str, bytes]]:
    """With three coordinators: each coordinator host's etcd files (ca.crt, member.crt, member.key), by host.
    etcd's CA is made once, as is each member's certificate (naming the host and its address, for server and
    client auth); both are kept here so that the next `up` finds them unchanged (etcd.py says why a CA of its
    own). Not create: what would be made is stood for by a placeholder."""
    import datetime

    from tfcluster import pki
    from tfcluster.bringup.etcd import MEMBER_CERT, MEMBER_KEY, address

    if not inventory.on_etcd:
        return {}
    directory = etcd_dir(operator_dir)
    placeholder = {name: CHECK_PLACEHOLDER for name in (CA_CERT, MEMBER_CERT, MEMBER_KEY)}
    if not (directory / CA_KEY).exists():
        if not create:
            return {h.host: placeholder for h in inventory.coordinators}
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        authority = pki.Authority.create()
        pki.write_private(directory / CA_KEY, pki.key_pem(authority.key))
        (directory / CA_CERT).write_bytes(authority.pem)
    files = {}
    for host in inventory.coordinators:
        cert, key = directory / f"{host.host}.crt", directory / f"{host.host}.key"
        names = sorted({host.host, address(host)})
        if not cert.exists() or not set(names) <= set(pki.server_names(pki.load_cert(cert))):
            if not create:
                files[host.host] = placeholder
                continue
            issued = pki.Authority.load(directory, with_key=True).issue(
                f"etcd member {host.host}", pki.NODE, datetime.timedelta(days=pki.COORDINATOR_DAYS), names)
            pki.write_private(key, issued[0])
            cert.write_bytes(issued[1])
        files[host.host] = {CA_CERT: (directory / CA_CERT).read_bytes(), MEMBER_CERT: cert.read_bytes(),
                            MEMBER_KEY: key.read_bytes()}
    return files
