"""A host whose init is systemd, for what only a real systemd shows (notify units, the watchdog, restarts,
KillMode=process): a Debian container booted by systemd-nspawn (Debian's systemd-container), with OpenSSH's sshd
on its address, reached as a machine an operator reaches over SSH.

    with SystemdHost(tmp_path, "10.79.0.2") as host:
        host.ssh(["systemctl", "is-system-running"])     # runs in the container, as root, over SSH
        host.operator(["tfcluster", "status"])           # runs here, in the container's network

This machine need not run systemd itself: nspawn starts the container's systemd as PID 1 of a PID namespace of its
own (--register=no: no machined to register with). The container's root is an overlay of a Debian root file system
made once by debootstrap from Debian's archive and kept in ROOTFS_CACHE; what the container writes lands in the
test's dir. It runs in a network namespace of its own whose loopback carries its address, where the operator's
commands run too. On exit the container is halted (or every process in its namespace killed by pid), the overlay
unmounted and the namespace deleted. Needs root, systemd-container, debootstrap, iproute2 and overlayfs;
`unavailable()` says why not.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

from harness import wait_until
from privatehosts import kill_all_in
from sshhosts import SSH_OPTIONS
from tfcluster.demo.hosts import ip
from tfcluster.demo.hosts import unavailable as netns_unavailable

SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
# What `tfcluster up` needs of a host (python3 with venv, sshd), and systemd to boot it.
PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "openssh-server", "procps", "iproute2")
ROOTFS_CACHE = Path("/var/cache/tfcluster-tests")
BOOT_SECONDS = 90


def unavailable() -> str | None:
    why = netns_unavailable()
    if why:
        return why
    for tool, package in (("systemd-nspawn", "systemd-container"), ("debootstrap", "debootstrap"),
                          ("ssh", "openssh-client")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian: apt-get install {package})"
    return None


def rootfs() -> Path:
    """A Debian root file system with PACKAGES, made on first use (about a minute) and kept for the next runs."""
    key = hashlib.sha256(" ".join((SUITE, MIRROR, *PACKAGES)).encode()).hexdigest()[:12]
    made = ROOTFS_CACHE / f"systemd-{SUITE}-{key}"
    if (made / "usr" / "lib" / "systemd" / "systemd").exists():
        return made
    building = made.with_name(made.name + f".building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
                           str(building), MIRROR], capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        raise RuntimeError(f"debootstrap failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    shutil.rmtree(made, ignore_errors=True)
    building.rename(made)
    return made


class SystemdHost:
    __test__ = False  # not a pytest test class

    def __init__(self, root: Path, address: str, name: str = "sdhost"):
        self.root, self.address, self.name = root, address, name
        self.netns = f"tfc{os.getpid()}-systemd"
        self.merged, self.key = root / "rootfs", root / "id_ed25519"
        self.container: subprocess.Popen | None = None

    def operator(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """argv run on this machine, in the container's network (as the operator's machine would reach it)."""
        return subprocess.run(["ip", "netns", "exec", self.netns, *argv], **kwargs)

    def ssh(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        """argv run in the container, as root, over SSH; its output as text."""
        options = [f"-o{o}" for o in SSH_OPTIONS]
        return self.operator(["ssh", "-i", str(self.key), *options, f"root@{self.address}", shlex.join(argv)],
                             capture_output=True, text=True, timeout=timeout)

    def __enter__(self) -> "SystemdHost":
        try:
            self._up()
        except BaseException:
            self._down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._down()

    def _up(self) -> None:
        lower = rootfs()
        ip("netns", "add", self.netns)
        ip("-n", self.netns, "link", "set", "lo", "up")
        ip("-n", self.netns, "addr", "add", f"{self.address}/32", "dev", "lo")
        upper, work = self.root / "upper", self.root / "work"
        for d in (upper, work, self.merged):
            d.mkdir(parents=True)
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}",
                        str(self.merged)], check=True, capture_output=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        ssh_dir = self.merged / "root" / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        (ssh_dir / "authorized_keys").write_bytes(self.key.with_suffix(".pub").read_bytes())
        (self.merged / "etc" / "hostname").write_text(self.name + "\n")
        log = open(self.root / "container.log", "wb")
        self.container = subprocess.Popen(
            ["systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "--boot", f"--machine={self.name}",
             f"--directory={self.merged}", f"--network-namespace-path=/run/netns/{self.netns}", "--console=read-only"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()
        wait_until(self._booted, BOOT_SECONDS, what=f"the container's systemd to boot (log: {self.root}/container.log)")

    def _booted(self) -> bool:
        if self.container.poll() is not None:
            raise RuntimeError(f"systemd-nspawn exited: {(self.root / 'container.log').read_text()[-3000:]}")
        try:  # "running", or "degraded" where a unit a container cannot run failed (none of ours)
            state = self.ssh(["systemctl", "is-system-running", "--wait"], timeout=30).stdout.strip()
        except subprocess.TimeoutExpired:
            return False
        return state in ("running", "degraded")

    def _down(self) -> None:
        try:
            if self.container is not None and self.container.poll() is None:
                self.container.send_signal(signal.SIGTERM)  # nspawn halts the container: systemd stops its units
                try:
                    self.container.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
            wait_until(lambda: not kill_all_in(self.netns), 30, what=f"every process in {self.netns} killed")
            if self.container is not None:
                self.container.wait(timeout=10)
        finally:
            if self.merged.is_mount():
                subprocess.run(["umount", "--lazy", str(self.merged)], check=False)
            ip("netns", "del", self.netns, check=False)
