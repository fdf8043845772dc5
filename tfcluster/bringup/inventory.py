"""The inventory `tfcluster up` reads (examples/cluster.toml), strictly: every key known, every value checked, and an error that names the file, the key
and the host it is about (docs/operators.md shows the format)."""

from __future__ import annotations

import ipaddress
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from tfcluster.labels import label_problem
from tfcluster.model import NODE_NAME_RE

TOP_KEYS = ("ssh", "software", "coordinators", "nodes")
SSH_KEYS = ("user", "identity_file", "port", "options")
SOFTWARE_KEYS = ("source", "extras", "prefix", "index_url")
COORDINATOR_KEYS = ("host", "name", "ssh_port")
NODE_KEYS = ("host", "name", "port_range", "advertise_address", "gpus", "labels", "ssh_port")
SOURCES = ("wheelhouse", "index")
COORDINATOR_PORT = 7070
HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:_-]{0,252}")
EXTRA_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
USER_RE = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")


class InventoryError(Exception):
    def __init__(self, source: str, key: str, message: str):
        super().__init__(f"{source}: {key}: {message}" if key else f"{source}: {message}")


@dataclass(frozen=True)
class Ssh:
    user: str = "root"
    identity_file: str | None = None
    port: int = 22
    options: tuple[str, ...] = ()   # more `-o NAME=VALUE` for ssh, e.g. "StrictHostKeyChecking=accept-new"

    @property
    def sudo(self) -> bool:
        """Commands on the hosts run under `sudo -n` unless the SSH user is root."""
        return self.user != "root"


@dataclass(frozen=True)
class Software:
    source: str = "wheelhouse"
    extras: tuple[str, ...] = ("tf",)
    prefix: str = "/opt/tfcluster"
    index_url: str | None = None

    def requirement(self, version: str) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        return f"tfcluster{extras}=={version}"


@dataclass(frozen=True)
class Host:
    """One machine of the inventory: a coordinator, a node (an agent), or both when it is listed in each."""
    host: str                       # what SSH connects to
    ssh_port: int
    coordinator: bool = False
    agent: bool = False
    name: str | None = None         # the node's name; default: the host's hostname
    port_range: str = "20000-20999"
    advertise_address: str | None = None
    gpus: int | None = None         # None: whatever NVML finds ("auto")
    labels: tuple[str, ...] = ()    # the node's labels (tfcluster/labels.py), given to its agent

    @property
    def roles(self) -> str:
        return "+".join(r for r, on in (("coordinator", self.coordinator), ("agent", self.agent)) if on)


@dataclass(frozen=True)
class Inventory:
    source: str
    ssh: Ssh
    software: Software
    hosts: tuple[Host, ...] = field(default_factory=tuple)

    @property
    def coordinators(self) -> tuple[Host, ...]:
        return tuple(h for h in self.hosts if h.coordinator)

    @property
    def agents(self) -> tuple[Host, ...]:
        return tuple(h for h in self.hosts if h.agent)

    @property
    def on_etcd(self) -> bool:
        """Three coordinators keep the cluster's records in an etcd cluster of their three hosts (etcd.py)."""
        return len(self.coordinators) == 3

    @property
    def coordinator_address(self) -> str:
        """What agents and the operator dial: every coordinator, comma-separated."""
        return ",".join(with_port(h.host, COORDINATOR_PORT) for h in self.coordinators)


def with_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def load(path: Path) -> Inventory:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise InventoryError(str(path), "", e.strerror or str(e)) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InventoryError(str(path), "", f"not valid TOML: {e}") from None
    return parse(data, str(path))


def parse(data: dict[str, Any], source: str = "cluster.toml") -> Inventory:
    reader = _Reader(source)
    reader.table(data, "", TOP_KEYS)
    ssh = _ssh(reader, data.get("ssh", {}))
    software = _software(reader, data.get("software", {}))
    coordinators = reader.array(data.get("coordinators"), "coordinators")
    if len(coordinators) == 2:
        raise reader.fail("coordinators", "expected one coordinator, or three (on etcd), got 2: the etcd members "
                                          "on two hosts keep no quorum when either goes (a majority of two is "
                                          "both), so two are no safer than one; list one, or three")
    if len(coordinators) not in (1, 3):
        raise reader.fail("coordinators", f"expected one coordinator, or three (on etcd), got {len(coordinators)}")
    hosts: dict[str, Host] = {}
    for i, entry in enumerate(coordinators):
        key = f"coordinators[{i}]"
        reader.table(entry, key, COORDINATOR_KEYS)
        host = _host_name(reader, entry, key)
        if host in hosts:
            raise reader.fail(f"{key}.host", f"{host} is listed twice in [[coordinators]]")
        hosts[host] = Host(host, _port(reader, entry.get("ssh_port", ssh.port), f"{key}.ssh_port"),
                           coordinator=True, name=_name(reader, entry, key))
    for i, entry in enumerate(reader.array(data.get("nodes", []), "nodes", allow_empty=True)):
        key = f"nodes[{i}]"
        reader.table(entry, key, NODE_KEYS)
        host = _host_name(reader, entry, key)
        known = hosts.get(host)
        if known is not None and known.agent:
            raise reader.fail(f"{key}.host", f"{host} is listed twice in [[nodes]]")
        hosts[host] = _node(reader, entry, key, host, ssh, known)
    _check_names(reader, list(hosts.values()))
    return Inventory(source, ssh, software, tuple(hosts.values()))


def _ssh(reader: "_Reader", table: Any) -> Ssh:
    reader.table(table, "ssh", SSH_KEYS)
    user = reader.string(table.get("user", "root"), "ssh.user")
    if not USER_RE.fullmatch(user):
        raise reader.fail("ssh.user", f"expected a user name such as root or ops, got {user!r}")
    identity = table.get("identity_file")
    identity = reader.string(identity, "ssh.identity_file") if identity is not None else None
    options = tuple(reader.string(o, "ssh.options") for o in reader.array(table.get("options", []), "ssh.options",
                                                                          allow_empty=True))
    for option in options:
        if "=" not in option or option.startswith("-"):
            raise reader.fail("ssh.options", f"expected NAME=VALUE as for ssh -o, got {option!r}")
    return Ssh(user, identity, _port(reader, table.get("port", 22), "ssh.port"), options)


def _software(reader: "_Reader", table: Any) -> Software:
    reader.table(table, "software", SOFTWARE_KEYS)
    index_url = table.get("index_url")
    source = reader.string(table.get("source", "index" if index_url else "wheelhouse"), "software.source")
    if source not in SOURCES:
        raise reader.fail("software.source", f"expected one of {', '.join(SOURCES)}, got {source!r}")
    if source == "index" and not index_url:
        raise reader.fail("software.index_url", "source = \"index\" needs the index's URL")
    if source == "wheelhouse" and index_url:
        raise reader.fail("software.index_url", "goes with source = \"index\" (a wheelhouse needs no index)")
    extras = tuple(reader.string(e, "software.extras")
                   for e in reader.array(table.get("extras", ["tf"]), "software.extras", allow_empty=True))
    for extra in extras:
        if not EXTRA_RE.fullmatch(extra):
            raise reader.fail("software.extras", f"expected extras' names such as \"tf\", got {extra!r}")
    prefix = reader.string(table.get("prefix", Software.prefix), "software.prefix")
    if not prefix.startswith("/") or prefix.rstrip("/") in ("", "/usr", "/opt", "/etc", "/var") or "'" in prefix:
        raise reader.fail("software.prefix", f"expected an absolute path of a directory of its own, got {prefix!r}")
    return Software(source, extras, prefix.rstrip("/"), reader.string(index_url, "software.index_url")
                    if index_url else None)


def _node(reader: "_Reader", entry: dict, key: str, host: str, ssh: Ssh, known: Host | None) -> Host:
    labels = tuple(reader.array(entry.get("labels", []), f"{key}.labels", allow_empty=True))
    problem = label_problem(labels)
    if problem:
        raise reader.fail(f"{key}.labels", f"{host}: {problem}")
    port_range = reader.string(entry.get("port_range", Host.port_range), f"{key}.port_range")
    match = re.fullmatch(r"(\d{1,5})-(\d{1,5})", port_range)
    if not match or not 1024 <= int(match[1]) < int(match[2]) <= 65535:
        raise reader.fail(f"{key}.port_range", f"{host}: expected FIRST-LAST with 1024 <= FIRST < LAST <= 65535, "
                                               f"got {port_range!r}")
    advertise = entry.get("advertise_address")
    if advertise is not None:
        try:
            ipaddress.ip_address(reader.string(advertise, f"{key}.advertise_address"))
        except ValueError:
            raise reader.fail(f"{key}.advertise_address", f"{host}: expected an IP address, got {advertise!r}") \
                from None
    gpus = entry.get("gpus", "auto")
    if gpus == "auto":
        gpus = None
    elif isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise reader.fail(f"{key}.gpus", f"{host}: expected \"auto\" or the number of GPUs `up` should find "
                                         f"there, got {gpus!r}")
    name = _name(reader, entry, key)
    if known is not None and name is not None and known.name not in (None, name):
        raise reader.fail(f"{key}.name", f"{host} is named {known.name!r} in [[coordinators]]")
    return Host(host, _port(reader, entry.get("ssh_port", known.ssh_port if known else ssh.port), f"{key}.ssh_port"),
                coordinator=known is not None, agent=True, name=name or (known.name if known else None),
                port_range=port_range, advertise_address=advertise, gpus=gpus, labels=labels)


def _host_name(reader: "_Reader", entry: dict, key: str) -> str:
    if "host" not in entry:
        raise reader.fail(f"{key}.host", "missing: the name or address SSH connects to")
    host = reader.string(entry["host"], f"{key}.host")
    if not HOST_RE.fullmatch(host):
        raise reader.fail(f"{key}.host", f"expected a host name or an IP address, got {host!r}")
    return host


def _name(reader: "_Reader", entry: dict, key: str) -> str | None:
    name = entry.get("name")
    if name is not None and not NODE_NAME_RE.fullmatch(reader.string(name, f"{key}.name")):
        raise reader.fail(f"{key}.name", f"expected letters, digits, '.', '_' or '-' (at most 253), got {name!r}")
    return name


def _port(reader: "_Reader", value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise reader.fail(key, f"expected a TCP port (1-65535), got {value!r}")
    return value


def _check_names(reader: "_Reader", hosts: list[Host]) -> None:
    seen: dict[str, str] = {}
    for h in hosts:
        if h.name is not None and h.name in seen:
            raise reader.fail("nodes", f"{h.host} and {seen[h.name]} are both named {h.name!r}")
        if h.name is not None:
            seen[h.name] = h.host


class _Reader:
    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, message: str) -> InventoryError:
        return InventoryError(self.source, key, message)

    def table(self, value: Any, key: str, allowed: tuple[str, ...]) -> dict:
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a table, got {type(value).__name__}")
        for name in value:
            if name not in allowed:
                raise self.fail(f"{key}.{name}" if key else name,
                                f"unknown key (expected one of: {', '.join(allowed)})")
        return value

    def array(self, value: Any, key: str, allow_empty: bool = False) -> list:
        if value is None:
            raise self.fail(key, "missing")
        if not isinstance(value, list) or (not value and not allow_empty):
            raise self.fail(key, f"expected a non-empty array, got {value!r}")
        return value

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"expected a non-empty string, got {value!r}")
        return value
