"""Hosts on this machine that see their own files, for commands written for separate machines.

    with PrivateHosts(root, ["coordinator", "node1"], ["10.0.0.1", "10.0.0.11"]) as hosts:
        subprocess.run([*hosts.prefix("node1"), "hostname"])   # runs "on" node1: prints node1

The hosts share one network namespace of their own, whose loopback carries the addresses given (as /32s): they
reach each other there, and the addresses collide with nothing outside. Each host is a mount and UTS namespace,
kept alive by a holder process, with its own hostname (its name) and its own view of the private dirs: overlays
of this machine's dirs whose writes land in root/NAME, so what a command writes to /etc or /var/lib on one host
the other does not see, and this machine never does. Everything is torn down on exit, also when the body fails:
every process in the namespace is killed by pid, which ends the holders and with them the mounts, and the
namespace is deleted. Needs root, iproute2, util-linux and overlayfs; `unavailable()` says why not.
"""

from __future__ import annotations

import itertools
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from harness import wait_until
from tfcluster.demo.hosts import ip
from tfcluster.demo.hosts import unavailable as netns_unavailable

_serial = itertools.count(1)


def unavailable() -> str | None:
    """Why private hosts cannot be built here, or None."""
    why = netns_unavailable()
    if why:
        return why
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"util-linux's `{tool}` is not installed"
    with tempfile.TemporaryDirectory() as scratch:
        lower, upper, work, merged = (Path(scratch) / d for d in ("lower", "upper", "work", "merged"))
        for d in (lower, upper, work, merged):
            d.mkdir()
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount", "-t", "overlay", "overlay",
                                "-o", f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)],
                               capture_output=True, text=True)
    if probe.returncode != 0:
        return f"overlayfs cannot be mounted here: {probe.stderr.strip()}"
    return None



def pids_in(netns: str) -> list[int]:
    return [int(p) for p in ip("netns", "pids", netns, check=False).stdout.split()]


def kill_all_in(netns: str) -> list[int]:
    """Sends SIGKILL to every process in the network namespace; returns those it found."""
    found = pids_in(netns)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return found


class PrivateHosts:
    __test__ = False  # not a pytest test class

    def __init__(self, root: Path, names: list[str], addresses: list[str],
                 private_dirs: tuple[str, ...] = ("/etc", "/var/lib")):
        self.root, self.names, self.addresses, self.private_dirs = root, names, addresses, private_dirs
        self.netns = f"tfc{os.getpid()}-private{next(_serial)}"
        self.holders: dict[str, subprocess.Popen] = {}

    def prefix(self, name: str) -> list[str]:
        """The argv prefix that runs a program on host name, in its dir cwd(name)."""
        return ["nsenter", f"--target={self.holders[name].pid}", "--mount", "--uts", "--net",
                f"--wd={self.cwd(name)}", "--"]

    def cwd(self, name: str) -> Path:
        """A directory of the host's own, empty until a command writes there (outside the private dirs: the
        test reads it too)."""
        return self.root / name / "cwd"

    def __enter__(self) -> "PrivateHosts":
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        ip("netns", "add", self.netns)
        ip("-n", self.netns, "link", "set", "lo", "up")
        for address in self.addresses:
            ip("-n", self.netns, "addr", "add", f"{address}/32", "dev", "lo")
        for name in self.names:
            self.holders[name] = self._hold(name)
        wait_until(lambda: all(self._ready(name) for name in self.names), 30, what="the hosts' namespaces")

    def _hold(self, name: str) -> subprocess.Popen:
        """A process that makes the host's namespaces (mounting its overlays, setting its hostname) and then
        sleeps in them, so they last until it is killed."""
        script = ["set -e", f"hostname {shlex.quote(name)}"]
        for directory in self.private_dirs:
            upper, work = self._overlay_dirs(name, directory)
            options = f"lowerdir={directory},upperdir={upper},workdir={work}"
            script.append(f"mount -t overlay overlay -o {shlex.quote(options)} {shlex.quote(directory)}")
        script.append("exec sleep infinity")
        self.cwd(name).mkdir(parents=True)
        log = open(self.root / name / "holder.log", "wb")
        holder = subprocess.Popen(["ip", "netns", "exec", self.netns, "unshare", "--mount", "--uts", "--propagation",
                                   "private", "sh", "-c", "\n".join(script)], stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=log, start_new_session=True)
        log.close()
        return holder

    def _overlay_dirs(self, name: str, directory: str) -> tuple[Path, Path]:
        """The upper and work dirs of the host's overlay of directory; the upper one has the directory's owner and
        mode, which the overlay's top takes from it (a task running as another user must still pass /root)."""
        base = self.root / name / directory.strip("/").replace("/", "-")
        upper, work = base / "upper", base / "work"
        upper.mkdir(parents=True)
        work.mkdir()
        real = os.stat(directory)
        os.chown(upper, real.st_uid, real.st_gid)
        upper.chmod(real.st_mode & 0o7777)
        return upper, work

    def _ready(self, name: str) -> bool:
        """The holder got as far as its sleep: each exec before it (ip, unshare, sh) has made its namespace."""
        holder = self.holders[name]
        if holder.poll() is not None:
            raise RuntimeError(f"host {name} could not be set up:\n{(self.root / name / 'holder.log').read_text()}")
        return Path(f"/proc/{holder.pid}/comm").read_text().strip() == "sleep"

    def pids(self) -> list[int]:
        return pids_in(self.netns)

    def _kill_all(self) -> list[int]:
        return kill_all_in(self.netns)

    def down(self) -> None:
        # Until none is left: a daemon killed in this pass may have started a process just before.
        try:
            wait_until(lambda: not self._kill_all(), 30, what=f"every process in {self.netns} killed")
            for holder in self.holders.values():
                holder.wait(timeout=10)
        finally:
            ip("netns", "del", self.netns, check=False)
