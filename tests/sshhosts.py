"""Private hosts (privatehosts.py) that each run a real OpenSSH server, as machines an operator reaches over SSH.

    with SshHosts(tmp_path, {"coord": "10.0.0.1", "node1": "10.0.0.11"}) as hosts:
        hosts.operator(["ssh", "-i", str(hosts.key), "root@10.0.0.1", "hostname"])   # prints coord

Each host has its own /etc, /var/lib, /var/log, /var/cache, /run and /opt (what `tfcluster up` writes there stays on
that host) and an sshd on its address, port 22, taking root's logins with a key pair made for the test. The
operator's side runs in the hosts' network namespace with this machine's files. Needs root, sshd (Debian:
apt-get install openssh-server) and what PrivateHosts needs; `unavailable()` says why not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from harness import wait_until
from privatehosts import PrivateHosts
from privatehosts import unavailable as hosts_unavailable

SSHD = "/usr/sbin/sshd"
PRIVATE_DIRS = ("/etc", "/var/lib", "/var/log", "/var/cache", "/run", "/opt")
# What the operator's ssh is told: the hosts' keys are new to it each time, and none goes to ~/.ssh.
SSH_OPTIONS = ("StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null", "LogLevel=ERROR")


def host_wheelhouse() -> tuple[Path, str]:
    """The wheelhouse `up` would build for hosts of this machine's python3, built here where the operator's package
    index is reachable (the test hosts' network reaches none) into the cache `up` looks in first."""
    from tfcluster.bringup.inventory import Software
    from tfcluster.bringup.wheelhouse import wheelhouse

    host_python = subprocess.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    return wheelhouse(Software(extras=()), host_python, os.uname().machine)


def unavailable() -> str | None:
    why = hosts_unavailable()
    if why:
        return why
    if not Path(SSHD).exists() or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "OpenSSH's server and client are not installed (Debian: apt-get install openssh-server)"
    return None


class SshHosts:
    __test__ = False

    def __init__(self, root: Path, hosts: dict[str, str]):
        self.root, self.hosts = root, hosts
        self.private = PrivateHosts(root / "hosts", list(hosts), list(hosts.values()), PRIVATE_DIRS)
        self.key = root / "id_ed25519"
        self.sshd: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> "SshHosts":
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        self.private.__enter__()
        try:
            for name in self.hosts:
                self.start_sshd(name)
        except BaseException:
            self.private.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.private.__exit__(*exc)  # kills every process in the namespace, sshd and what it started included

    def start_sshd(self, name: str) -> None:
        """sshd on the host's address, with its own host key and config, root's key the test's."""
        directory = self.root / f"sshd-{name}"
        directory.mkdir()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / "host_key")], check=True)
        shutil.copy(self.key.with_suffix(".pub"), directory / "authorized_keys")
        config = directory / "sshd_config"
        config.write_text(f"ListenAddress {self.hosts[name]}:22\nHostKey {directory / 'host_key'}\n"
                          f"AuthorizedKeysFile {directory / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
                          "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                          "PidFile none\nMaxSessions 64\nMaxStartups 64\n")
        prefix = self.private.prefix(name)
        subprocess.run([*prefix, "mkdir", "-p", "-m", "0755", "/run/sshd"], check=True)
        log = open(directory / "sshd.log", "wb")
        self.sshd[name] = subprocess.Popen([*prefix, SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=log,
                                           stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        wait_until(lambda: self.listening(name), 20, what=f"sshd on {name}")

    def listening(self, name: str) -> bool:
        if self.sshd[name].poll() is not None:
            raise RuntimeError(f"sshd on {name} exited: {(self.root / f'sshd-{name}' / 'sshd.log').read_text()}")
        probe = subprocess.run(["ip", "netns", "exec", self.private.netns, "python3", "-c",
                                f"import socket; socket.create_connection(('{self.hosts[name]}', 22), 1)"],
                               capture_output=True)
        return probe.returncode == 0

    def operator(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Runs argv on the operator's side: in the hosts' network, with this machine's files."""
        return subprocess.run(["ip", "netns", "exec", self.private.netns, *argv], **kwargs)

    def on(self, name: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Runs argv on host name (not over SSH: to look at what is there)."""
        return subprocess.run([*self.private.prefix(name), *argv], **kwargs)
