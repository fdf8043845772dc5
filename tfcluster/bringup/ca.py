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
