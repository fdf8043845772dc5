"""Commands on the hosts through OpenSSH's own client, so that the operator's ssh config, agent and known_hosts
apply as they do to any ssh. One master connection per host (ControlMaster) carries every later command, which
then costs a round trip instead of a handshake."""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from tfcluster.bringup.inventory import Host, Ssh

CONNECT_TIMEOUT_SECONDS = 10
COMMAND_TIMEOUT_SECONDS = 900   # a pip install of TensorFlow from a wheelhouse takes minutes


class SshError(Exception):
    """A command on a host could not run, or failed: the message says which host and what to do."""


@dataclass
class Result:
    returncode: int
    stdout: bytes
    stderr: str


class Connections:
    """SSH to the inventory's hosts, as its [ssh] says. Use as a context manager: the masters end with it."""

    def __init__(self, settings: Ssh):
        self.settings = settings
        self._dir = tempfile.TemporaryDirectory(prefix="tfcluster-ssh-")
        self._hosts: set[tuple[str, int]] = set()

    def __enter__(self) -> "Connections":
        return self

    def __exit__(self, *exc) -> None:
        for host, port in self._hosts:
            subprocess.run(self._ssh(host, port) + ["-O", "exit", host], capture_output=True, timeout=10)
        self._dir.cleanup()

    def _ssh(self, host: str, port: int) -> list[str]:
        s = self.settings
        argv = ["ssh", "-p", str(port), "-l", s.user, "-o", "BatchMode=yes",
                "-o", f"ConnectTimeout={CONNECT_TIMEOUT_SECONDS}", "-o", "ServerAliveInterval=15",
                "-o", "ControlMaster=auto", "-o", f"ControlPath={self._dir.name}/%C", "-o", "ControlPersist=120"]
        if s.identity_file:
            argv += ["-i", str(Path(s.identity_file).expanduser()), "-o", "IdentitiesOnly=yes"]
        for option in s.options:
            argv += ["-o", option]
        return argv

    def run(self, host: Host, command: str, stdin: bytes = b"", timeout: float = COMMAND_TIMEOUT_SECONDS) -> Result:
        """Runs a shell command on host as root (through `sudo -n` for another user)."""
        self._hosts.add((host.host, host.ssh_port))
        remote = f"sudo -n sh -c {shlex.quote(command)}" if self.settings.sudo else command
        try:
            done = subprocess.run(self._ssh(host.host, host.ssh_port) + ["--", host.host, remote], input=stdin,
                                  capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SshError(f"no answer in {timeout:.0f} s") from None
        stderr = done.stderr.decode(errors="replace").strip()
        if done.returncode == 255:
            raise SshError(f"ssh {self.settings.user}@{host.host} -p {host.ssh_port} failed: {stderr}; "
                           f"remedy: check that sshd runs there and takes the key "
                           f"{self.settings.identity_file or '(your ssh agent or default key)'}")
        if self.settings.sudo and "a password is required" in stderr:
            raise SshError(f"{self.settings.user} may not run `sudo -n` there; remedy: allow it without a "
                           f"password (sudoers NOPASSWD), or use user = \"root\"")
        return Result(done.returncode, done.stdout, stderr)

    def helper(self, host: Host, request: dict) -> dict:
        """Runs remote.py on host with request; its JSON answer."""
        source = resources.files("tfcluster.bringup").joinpath("remote.py").read_bytes()
        bootstrap = (f"import sys; exec(compile(sys.stdin.buffer.read({len(source)}), 'tfcluster-up', 'exec'), "
                     f"{{'__name__': '__main__'}})")
        done = self.run(host, f"python3 -c {shlex.quote(bootstrap)}", source + json.dumps(request).encode())
        if done.returncode == 127 or "python3: not found" in done.stderr:
            raise SshError("python3 is not installed there; remedy: install it (Debian: apt-get install python3 "
                           "python3-venv)")
        if done.returncode:
            raise SshError(f"the step runner failed: {done.stderr[-800:]}")
        return json.loads(done.stdout)

    def send_tree(self, host: Host, local: Path, remote_dir: str) -> None:
        """Copies the files of local into remote_dir on host (made, root-only), as one tar stream."""
        archive = subprocess.run(["tar", "-C", str(local), "-cf", "-", "."], capture_output=True, check=True).stdout
        quoted = shlex.quote(remote_dir)
        done = self.run(host, f"rm -rf {quoted} && mkdir -p -m 0700 {quoted} && tar -C {quoted} -xf -", archive)
        if done.returncode:
            raise SshError(f"copying {local} to {remote_dir} failed: {done.stderr}")
