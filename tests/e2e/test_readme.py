"""The README's Quick start works word for word, for a user who installed tfcluster in a virtualenv.

The test reads the Quick start's shell blocks from README.md when it runs and runs their commands in order, each
through bash, on two hosts with a private network between them: the coordinator host and a node, each with its own
/etc, /var/lib and home (see privatehosts.py), so the README's paths, addresses and ports are used unchanged and
nothing is written to this machine. What the README leaves to the reader (the CA's hash, the join token, the job id)
is filled in from what the commands before printed. The two daemons, which the README runs in a terminal of their
own, run in the background on their hosts. Every command must exit 0, the worker's log must show its training, the
job must end SUCCEEDED, and `tfcluster stop` on it then must leave it so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import ROOT, kill_group, wait_until
from privatehosts import PrivateHosts, unavailable
from tfcluster.states import ENDED_JOB_STATES

WHY_NOT = unavailable()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or ""),
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")]

README = ROOT / "README.md"
COORDINATOR_HOST, NODE = "coordinator", "node1"  # hostnames too: the agent names its node after its host
# The comments in a block that say where the commands after them run (until then: on the coordinator host).
HOST_COMMENTS = {"on the coordinator host": COORDINATOR_HOST, "on each node": NODE}
DAEMONS = ("tfcluster coordinator", "tfcluster agent")
ALONE = r"\A\S+(?=\n\Z)"  # all the command printed on stdout: one word
# What the README leaves to the reader, the command that prints it, and how to find it in what that one printed.
PLACEHOLDERS = {
    "sha256:...": ("tfcluster ca init", r"sha256:[0-9a-f]{64}"),  # "CA hash (for `tfcluster agent --ca-hash`): ..."
    "TOKEN": ("tfcluster token create", ALONE),
    "digits-1-k3f9": ("tfcluster start", ALONE),  # the job id
}
COMMAND_TIMEOUT = 60
FOLLOW_TIMEOUT = 180  # `tfcluster logs -f`: the whole training (5 epochs of a small model, two workers on 2 CPUs)


@dataclass
class Step:
    host: str
    exports: tuple[str, ...]  # the block's `export` lines on this host so far, as the user's shell holds them
    command: str


def quick_start_blocks() -> list[str]:
    """The shell code blocks of README.md's "## Quick start" section, in order."""
    section = re.search(r"^## Quick start\n(.*?)(?=^## |\Z)", README.read_text(), re.M | re.S)
    assert section, "README.md has no '## Quick start' section"
    return re.findall(r"^```(?:sh|bash|shell)\n(.*?)^```$", section.group(1), re.M | re.S)


def commands(block: str) -> list[str]:
    """A block's comment lines and commands, each command as bash reads it: a line with the lines its trailing
    backslashes continue it on, or with its here-document's body and end."""
    lines, found = block.splitlines(), []
    while lines:
        line = lines.pop(0)
        if not line.strip():
            continue
        command = [line]
        while command[-1].endswith("\\"):
            command.append(lines.pop(0))
        heredoc = re.search(r"(?<!<)<<-?(?!<)\s*(['\"]?)(\w+)\1", line)  # not a here-string (<<<)
        if heredoc:
            while command[-1].strip() != heredoc.group(2):
                command.append(lines.pop(0))
        found.append("\n".join(command).strip())
    return found


def steps(blocks: list[str]) -> list[Step]:
    """Every command of the blocks, with the host it runs on and the exports before it there."""
    found = []
    for block in blocks:
        host, exports = COORDINATOR_HOST, {COORDINATOR_HOST: [], NODE: []}
        for command in commands(block):
            if command.startswith("#"):
                host = next((h for said, h in HOST_COMMENTS.items() if said in command), host)
            elif command.startswith("export "):
                exports[host].append(command)
            else:
                found.append(Step(host, tuple(exports[host]), command))
    return found


def addresses(blocks: list[str]) -> list[str]:
    """The IPv4 addresses the blocks name for hosts (not 0.0.0.0, which a daemon listens on)."""
    named = re.findall(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])", "\n".join(blocks))
    return sorted(set(named) - {"0.0.0.0"})


def starts_with(command: str, words: str) -> bool:
    return command.split()[:len(words.split())] == words.split()


def user_environment() -> dict[str, str]:
    """The shell of a user whose virtualenv holds tfcluster: its bin first on PATH, as `activate` puts it. Nothing
    of this run's own: no import path, no tfcluster settings (the README's exports are the only ones)."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("TFCLUSTER_")}
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    return environment


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


class QuickStart:
    """Runs the steps on the hosts: fills in placeholders, starts the daemons and waits for them, checks what the
    README says a command does."""

    def __init__(self, hosts: PrivateHosts, root: Path):
        self.hosts, self.root = hosts, root
        self.values: dict[str, str] = {}  # placeholder -> what fills it in
        self.filled: set[str] = set()
        self.daemons: dict[str, subprocess.Popen] = {}  # "coordinator", "agent"
        self.admin: list[str] = []  # flags of the test's own `tfcluster status` calls, on status_host
        self.status_host = COORDINATOR_HOST
        self.job_id = ""
        self.checked: list[str] = []

    def run(self, step: Step) -> None:
        command = self.fill(step.command)
        # Skipped: the install is done, in the virtualenv of the test's own Python (installing from PyPI would
        # replace the checkout under test).
        if starts_with(command, "pip install"):
            return
        if any(starts_with(command, daemon) for daemon in DAEMONS):
            self.start_daemon(step.host, step.exports, command)
            return
        result = self.shell(step.host, step.exports, command)
        for placeholder, (printed_by, pattern) in PLACEHOLDERS.items():
            if starts_with(command, printed_by):
                found = re.search(pattern, result.stdout, re.M)
                assert found, self.failure(f"`{command}` printed no value for {placeholder}:\n{result.stdout}")
                self.values[placeholder] = found.group(0)
        if starts_with(command, "tfcluster start"):
            self.job_id = result.stdout.strip()
        if starts_with(command, "tfcluster logs"):
            self.check_training_log(command, result.stdout)
        if starts_with(command, "tfcluster stop"):
            job = self.job()
            assert job["state"] == "SUCCEEDED", self.failure(f"`{command}` left the ended job {job['state']}")
            self.checked.append("stopped")

    def fill(self, command: str) -> str:
        for placeholder, value in self.values.items():
            filled = re.sub(rf"(?<![\w-]){re.escape(placeholder)}(?![\w-])", lambda _: value, command)
            if filled != command:
                self.filled.add(placeholder)
                command = filled
        return command

    def shell(self, host: str, exports: tuple[str, ...], command: str,
              timeout: float = COMMAND_TIMEOUT) -> subprocess.CompletedProcess:
        if re.search(r"\s-f\b|--follow\b", command):
            timeout = FOLLOW_TIMEOUT
        try:
            result = subprocess.run([*self.hosts.prefix(host), "bash", "-c", "\n".join([*exports, command])],
                                    capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                                    env=user_environment())
        except subprocess.TimeoutExpired as e:
            said = "".join(o.decode(errors="replace") if isinstance(o, bytes) else o for o in (e.stdout, e.stderr) if o)
            pytest.fail(self.failure(f"`{command}` on {host} did not end in {timeout:.0f} s:\n{said}"))
        if result.returncode != 0:
            pytest.fail(self.failure(f"`{command}` on {host} exited {result.returncode}:\n"
                                     f"{result.stdout}{result.stderr}"))
        return result

    def start_daemon(self, host: str, exports: tuple[str, ...], command: str) -> None:
        """The daemon in the background on its host, in a process group of its own, its output kept; then waits
        until it serves: the coordinator answering, the node READY."""
        name = command.split()[1]
        if name == "agent":
            # The one change to the README's commands: this machine has no GPU, and the job asks for one for each
            # of its two workers, so the agent declares two (as the tests' agents do) instead of asking NVML.
            command += f" --gpu-inventory {self.gpu_inventory()}"
        log = open(self.root / f"{name}.log", "wb")
        self.daemons[name] = subprocess.Popen([*self.hosts.prefix(host), "bash", "-c", "\n".join([*exports, command])],
                                              stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                              start_new_session=True, env=user_environment())
        log.close()
        if name == "coordinator":
            self.status_host, self.admin = host, self.admin_flags(command)
            wait_until(lambda: self.serving(name) and self.status() is not None, 30, interval=0.5,
                       what="the coordinator to answer")
        else:
            wait_until(lambda: self.serving(name) and self.node_states() == ["READY"], 60, interval=0.5,
                       what="the node to be READY")

    def admin_flags(self, command: str) -> list[str]:
        """The test's own way in, as the admin on the coordinator host: the port the coordinator listens on, and the
        credentials `ca init` wrote beside its CA (DIR/admin)."""
        words = shlex.split(command)
        port = words[words.index("--listen") + 1].rpartition(":")[2]
        return ["--coordinator", f"localhost:{port}", "--tls-dir", f"{words[words.index('--tls-dir') + 1]}/admin"]

    def gpu_inventory(self) -> Path:
        path = self.root / "gpus.json"
        path.write_text(json.dumps([{"index": i, "uuid": f"GPU-readme-{i}", "name": "Test GPU", "memory_mib": 16384}
                                    for i in range(2)]))
        return path

    def serving(self, name: str) -> bool:
        code = self.daemons[name].poll()
        if code is not None:
            raise AssertionError(self.failure(f"`tfcluster {name}` exited {code}"))
        return True

    def status(self, job_id: str = "") -> dict | None:
        """`tfcluster status [JOB] --json` on the coordinator host, as the admin; None while it fails."""
        argv = ["tfcluster", "status", *([job_id] if job_id else []), "--json", *self.admin]
        result = subprocess.run([*self.hosts.prefix(self.status_host), *argv], capture_output=True, text=True,
                                timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL, env=user_environment())
        return json.loads(result.stdout) if result.returncode == 0 else None

    def node_states(self) -> list[str]:
        return [node["state"] for node in (self.status() or {"nodes": []})["nodes"]]

    def job(self) -> dict:
        status = self.status(self.job_id)
        assert status, self.failure(f"`tfcluster status {self.job_id}` failed")
        return status["jobs"][0]

    def ended_job(self) -> dict | None:
        job = self.job()
        return job if job["state"] in ENDED_JOB_STATES else None

    def check_training_log(self, command: str, log: str) -> None:
        """The followed log shows the task's training to its last epoch; once the job has ended, it SUCCEEDED."""
        task = next(word for word in command.split() if re.fullmatch(r"[a-z]+:\d+", word))
        assert re.search(r"^Epoch (\d+)/\1$", log, re.M), self.failure(f"no last epoch in {task}'s log:\n{log}")
        assert re.search(rf"^{task} trained \d+ epochs", log, re.M), self.failure(f"{task} did not finish:\n{log}")
        # The log ends with its task; the other worker may take a moment more.
        job = wait_until(self.ended_job, COMMAND_TIMEOUT, interval=0.5, what=f"{self.job_id} to end")
        assert job["state"] == "SUCCEEDED", self.failure(f"{self.job_id} ended {job['state']}: {job['message']}")
        self.checked += ["trained", "succeeded"]

    def failure(self, what: str) -> str:
        """what, with the end of each daemon's output."""
        logs = [f"--- tfcluster {name} (last lines) ---\n{tail(self.root / f'{name}.log')}" for name in self.daemons]
        return "\n".join([what, *logs])

    def stop_daemons(self) -> None:
        for process in self.daemons.values():
            kill_group(process.pid)
            process.wait(timeout=10)


def test_quick_start_runs_as_written(tmp_path):
    blocks = quick_start_blocks()
    # The home dir too: `tfcluster start` remembers the trees it packed in ~/.cache.
    private = ("/etc", "/var/lib", str(Path.home()))
    with PrivateHosts(tmp_path / "hosts", [COORDINATOR_HOST, NODE], addresses(blocks), private) as hosts:
        quick_start = QuickStart(hosts, tmp_path)
        try:
            for step in steps(blocks):
                quick_start.run(step)
        finally:
            quick_start.stop_daemons()
    assert sorted(quick_start.daemons) == ["agent", "coordinator"]
    assert quick_start.filled == set(PLACEHOLDERS), f"placeholders no longer in the README: " \
                                                    f"{sorted(set(PLACEHOLDERS) - quick_start.filled)}"
    assert quick_start.checked == ["trained", "succeeded", "stopped"], quick_start.checked
