"""A real etcd cluster on loopback: three members of the `etcd` binary (Debian's package etcd-server), each on
free ports with its data dir under a given dir, stopped by PID. `make demo-ha` and the tests both run on one.

With TlsFiles the members serve their client and peer URLs over HTTPS and take only clients (and peers) whose
certificate their CA signed (etcd's --client-cert-auth and --peer-client-cert-auth), as a production etcd runs.
"""

from __future__ import annotations

import functools
import json
import random
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = "no etcd binary: apt-get install etcd-server"


def etcd_binary() -> str | None:
    return shutil.which("etcd")


_handed_out: set[tuple[str, int]] = set()
# Ports handed out are taken from here, below the agents' ranges of the demo and the tests (20000 and up) and below
# the kernel's ephemeral ports (32768-60999 by default), which every outgoing connection takes its own port from:
# a port the kernel handed out as free could be some client's before the server given it had bound it.
QUIET_PORTS = (10000, 20000)
EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now and that this process has not handed out before. The kernel may give the
    same free port to two binds in a row (3 pairs in 20,000 on a test machine), and two servers given it would
    both listen: gRPC binds with SO_REUSEPORT, so a coordinator's port and its join port would share the
    connections, and a client would find ControlService missing on every other one. Taken at random among
    QUIET_PORTS, unless the kernel's ephemeral ports cover them."""
    quiet = not _ephemeral_overlaps(*QUIET_PORTS)
    while True:
        with socket.socket() as s:
            try:
                s.bind((host, random.randrange(*QUIET_PORTS) if quiet else 0))
            except OSError:  # taken: another one
                continue
            port = s.getsockname()[1]
        if (host, port) not in _handed_out:
            _handed_out.add((host, port))
            return port


@functools.cache
def ephemeral_ports() -> tuple[int, int]:
    """The first and last of the kernel's ephemeral ports (read once: a process hands out ports by the hundred)."""
    try:
        first, last = (int(n) for n in EPHEMERAL_PORTS.read_text().split())
        return first, last
    except (OSError, ValueError):
        return 32768, 60999  # the kernel's default


def _ephemeral_overlaps(low: int, high: int) -> bool:
    first, last = ephemeral_ports()
    return first < high and low <= last


@dataclass(frozen=True)
class TlsFiles:
    """etcd's own TLS as PEM files: the CA that signed every certificate; the members' certificate and key (one
    for all, naming 127.0.0.1, for both server and client auth: members are each other's clients); and a client
    certificate and key the members accept, which the health checks present."""
    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path

    def member_flags(self) -> list[str]:
        return ["--cert-file", str(self.cert), "--key-file", str(self.key), "--trusted-ca-file", str(self.ca),
                "--client-cert-auth", "--peer-cert-file", str(self.cert), "--peer-key-file", str(self.key),
                "--peer-trusted-ca-file", str(self.ca), "--peer-client-cert-auth"]

    def coordinator_flags(self) -> list[str]:
        """How a coordinator (`--store etcd://...`) reaches these members."""
        return ["--etcd-ca", str(self.ca), "--etcd-cert", str(self.client_cert), "--etcd-key", str(self.client_key)]

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


class Member:
    def __init__(self, name: str, data_dir: Path, scheme: str = "http"):
        self.name, self.data_dir, self.scheme = name, data_dir, scheme
        self.client_port, self.peer_port = free_port(), free_port()
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.peer_port}"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://{self.endpoint}"


class EtcdCluster:
    """Members started together; `endpoints` is what a store URL names."""

    def __init__(self, root: Path, size: int = 3, tls: TlsFiles | None = None):
        self.binary = etcd_binary()
        if self.binary is None:
            raise FileNotFoundError(INSTALL_HINT)
        self.root, self.tls = root, tls
        root.mkdir(parents=True, exist_ok=True)
        self.members = [Member(f"m{i}", root / f"m{i}", "https" if tls else "http") for i in range(size)]
        self.initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    @property
    def endpoints(self) -> str:
        return ",".join(m.endpoint for m in self.members)

    def url(self, prefix: str = "/tfcluster") -> str:
        return f"etcd://{self.endpoints}{prefix}"

    def start(self, member: Member) -> None:
        log = open(self.root / f"{member.name}.log", "ab")
        # Short heartbeat and election timeouts: on loopback a member that goes is replaced within a second.
        member.process = subprocess.Popen(
            [self.binary, "--name", member.name, "--data-dir", str(member.data_dir),
             "--listen-client-urls", member.client_url, "--advertise-client-urls", member.client_url,
             "--listen-peer-urls", member.peer_url, "--initial-advertise-peer-urls", member.peer_url,
             "--initial-cluster", self.initial, "--initial-cluster-state", "new",
             "--initial-cluster-token", self.root.name, "--heartbeat-interval", "50", "--election-timeout", "500",
             *(self.tls.member_flags() if self.tls else [])],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def start_all(self) -> "EtcdCluster":
        try:
            for member in self.members:
                self.start(member)
            self.wait_healthy()
        except BaseException:
            self.stop_all()
            raise
        return self

    def wait_healthy(self, timeout: float = 30) -> None:
        """Until a member says the cluster has a leader and commits."""
        deadline = time.monotonic() + timeout
        context = self.tls.client_context() if self.tls else None
        while time.monotonic() < deadline:
            for member in self.members:
                if member.process and member.process.poll() is None and _healthy(member, context):
                    return
            time.sleep(0.1)
        raise TimeoutError(f"etcd did not come up: see {self.root}/*.log")

    def healthy(self, member: Member) -> bool:
        """Whether the member answers that the cluster has a leader and commits."""
        return _healthy(member, self.tls.client_context() if self.tls else None)

    def leads(self, member: Member) -> bool:
        """Whether the member is etcd's own (raft) leader now."""
        status = self._status(member)
        return status.get("leader") == status["header"]["member_id"]

    def raft_term(self, member: Member | None = None) -> int:
        """etcd's election term as the member knows it (None: the first member that answers): it grows with every
        election etcd holds."""
        for m in [member] if member is not None else self.members:
            try:
                return int(self._status(m).get("raftTerm", 0))
            except (OSError, ValueError):
                if member is not None:
                    raise
        raise OSError("no etcd member answers")

    def _status(self, member: Member) -> dict:
        request = urllib.request.Request(f"{member.client_url}/v3/maintenance/status", data=b"{}", method="POST")
        context = self.tls.client_context() if self.tls else None
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return json.loads(response.read())

    def stop(self, member: Member, sig: int = signal.SIGKILL) -> None:
        if member.process and member.process.poll() is None:
            member.process.send_signal(sig)
            member.process.wait(timeout=30)

    def stop_all(self) -> None:
        for member in self.members:
            self.stop(member)


def _healthy(member: Member, context: ssl.SSLContext | None) -> bool:
    try:
        with urllib.request.urlopen(f"{member.client_url}/health", timeout=1, context=context) as response:
            return json.loads(response.read()).get("health") == "true"
    except (OSError, ValueError):
        return False
