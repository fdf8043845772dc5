"""The shapes and places of what `tfcluster up` writes on a host, shared by desired.py (tfcluster's own files)
and etcd.py (an etcd member's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources

ETC = "/etc/tfcluster"
ENV_FILE = f"{ETC}/tfcluster.env"
UNIT_DIR = "/etc/systemd/system"
STATE_DIR = "/var/lib/tfcluster"


@dataclass(frozen=True)
class File:
    data: bytes
    mode: int


@dataclass(frozen=True)
class Service:
    reads: tuple[str, ...]              # the files whose change restarts it
    env_file: str = ENV_FILE            # its EnvironmentFile (for hosts without systemd)
    uses_software: bool = True          # restarted when tfcluster's software changes (etcd is the host's own)
    ready: dict | None = None           # a step that waits until it serves, before the next service starts


@dataclass
class Desired:
    """One host's wanted state; `services` in the order they start."""
    files: dict[str, File] = field(default_factory=dict)
    services: dict[str, Service] = field(default_factory=dict)


def unit_text(name: str) -> bytes:
    return resources.files("tfcluster.bringup").joinpath("units", name).read_bytes()
