"""Test hosts on one machine: network namespaces joined by veth pairs to a bridge, each with its own IP.

    with TestHosts(3) as hosts:        # hosts.ip(i), hosts.coordinator_ip, hosts.prefix(i)
        ...                            # run a program "on" host i: hosts.prefix(i) + argv

The bridge (in the root namespace) carries the coordinator's address; host i has .10+i in a private
/24 chosen per run. Everything is torn down on exit, also when the body fails: processes in the
namespaces are killed, the namespaces (and their veth ends) and the bridge deleted. Needs root and
iproute2; `unavailable()` says why not when they are missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess


def unavailable() -> str | None:
    """Why test hosts cannot be built here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`ip ARGS...` (iproute2); raises RuntimeError with its message when it fails and check is set."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


class TestHosts:
    __test__ = False  # not a pytest test class

    def __init__(self, count: int):
        self.count = count
        tag = os.getpid() % 10000
        # A /24 of 10.213.0.0/16 per run, so two runs (or a leftover) never share addresses.
        self.subnet = f"10.213.{tag % 250 + 1}"
        self.bridge = f"tfcbr{tag}"
        self.names = [f"tfc{tag}-h{i}" for i in range(1, count + 1)]
        self.veths = [f"tfc{tag}v{i}" for i in range(1, count + 1)]
        self.coordinator_ip = f"{self.subnet}.1"

    def ip(self, i: int) -> str:
        """Host i's address (1-based)."""
        return f"{self.subnet}.{10 + i}"

    def prefix(self, i: int) -> list[str]:
        """The argv prefix that runs a program on host i."""
        return ["ip", "netns", "exec", self.names[i - 1]]

    def __enter__(self) -> "TestHosts":
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.coordinator_ip}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i, (name, veth) in enumerate(zip(self.names, self.veths), start=1):
            ip("netns", "add", name)
            ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
            ip("link", "set", f"{veth}p", "netns", name)
            ip("link", "set", veth, "master", self.bridge, "up")
            inside = ["netns", "exec", name, "ip"]
            ip(*inside, "link", "set", "lo", "up")
            ip(*inside, "link", "set", f"{veth}p", "name", "eth0")
            ip(*inside, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
            ip(*inside, "link", "set", "eth0", "up")
            ip(*inside, "route", "add", "default", "via", self.coordinator_ip)

    def link(self, i: int, up: bool) -> None:
        """Cuts (or restores) host i's link, as a pulled cable would."""
        ip("link", "set", self.veths[i - 1], "up" if up else "down")

    def pids(self, i: int) -> list[int]:
        result = ip("netns", "pids", self.names[i - 1], check=False)
        return [int(p) for p in result.stdout.split()]

    def down(self) -> None:
        for i, name in enumerate(self.names, start=1):
            for pid in self.pids(i):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            ip("netns", "del", name, check=False)
        for veth in self.veths:  # gone with its namespace, unless something still holds that open
            ip("link", "del", veth, check=False)
        ip("link", "del", self.bridge, check=False)
