"""`make demo-ha` (python -m tfcluster.demo.ha): a failover of the coordinator, on one machine.

Starts a three-member etcd cluster on loopback (see etcd.py), a cluster CA made with `tfcluster ca init`,
two coordinators on the same `--store etcd://...` (one leads, the other stands by; on loopback they reach etcd
over plain HTTP, given --etcd-insecure, where a production cluster gives etcd TLS: docs/ha.md) and two agents given both
coordinators' addresses, each a process of its own. It runs a small job of two workers, kills the leading
coordinator with kill -9 while the job runs, and shows how long until the standby serves and until both agents
have registered with it, then that the job succeeds with no restart and each task launched once. Every process it
started is stopped by its process group, and its temporary dir removed, also on Ctrl-C or a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from tfcluster.client import Client
from tfcluster.demo import scratch_root
from tfcluster.demo.etcd import INSTALL_HINT, EtcdCluster, etcd_binary, free_port
from tfcluster.security import Credentials
from tfcluster.specfile import parse_spec
from tfcluster.states import ENDED_JOB_STATES, JobState, NodeState

COORDINATORS = 2
AGENTS = ("node-a", "node-b")
JOB_SECONDS = 25  # each task's run: long enough that the leader is killed mid-job, with time to spare
KILL_AFTER_RUNNING_SECONDS = 3
# What the failover should take on one machine (docs/ha.md): over these, the demo says so and fails.
SERVE_WITHIN_SECONDS = 5
AGENTS_BACK_WITHIN_SECONDS = 10


class Failed(Exception):
    """The demo could not go on; the message says why and where to look."""


class HaDemo:
    """The demo's processes, each in a process group of its own, and the dir their state and logs are in."""

    def __init__(self, root: Path, console: Console):
        self.root, self.console = root, console
        self.etcd = EtcdCluster(root / "etcd")
        self.coordinators: dict[str, subprocess.Popen] = {}  # listen address -> process
        self.agents: dict[str, subprocess.Popen] = {}
        self.joins: list[str] = []
        self.killed: subprocess.Popen | None = None  # the leader the demo killed: its exit is no failure

    @property
    def addresses(self) -> str:
        return ",".join(self.coordinators)

    def spawn(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")
        # As a systemd unit's PATH would: the interpreter of the job's command is this one's.
        path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        proc = subprocess.Popen([sys.executable, "-m", "tfcluster.cli", *args], stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, cwd=self.root, start_new_session=True,
                                env={**os.environ, "PATH": path})
        log.close()
        return proc

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def client(self) -> Client:
        return Client(self.addresses, Credentials.from_dir(self.root / "ca" / "admin"))

    def start_cluster(self) -> None:
        self.etcd.start_all()
        self.console.print(f"etcd: 3 members on {self.etcd.endpoints}; state and logs in {self.root}", markup=False)
        self.console.print("  over plain HTTP on loopback: the coordinators are given --etcd-insecure (in production "
                           "etcd takes TLS: docs/ha.md)", markup=False)
        made = subprocess.run([sys.executable, "-m", "tfcluster.cli", "ca", "init", "--dir", str(self.root / "ca"),
                               "--san", "127.0.0.1"], capture_output=True, text=True)
        if made.returncode != 0:
            raise Failed(f"tfcluster ca init failed: {made.stderr.strip()}")
        for i in range(COORDINATORS):
            listen, join = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
            self.coordinators[listen] = self.spawn(
                f"coordinator{i}", "coordinator", "--listen", listen, "--join-listen", join,
                "--state-dir", str(self.root / f"coordinator{i}"), "--tls-dir", str(self.root / "ca"),
                "--store", self.etcd.url(), "--etcd-insecure")
            self.joins.append(join)
        leader = wait_for(self.leader, 30, "a coordinator to lead", self)
        self.console.print(f"coordinators on {' and '.join(self.coordinators)}, both on that store: "
                           f"{leader} leads, the other stands by", markup=False)
        self.start_agents()

    def start_agents(self) -> None:
        with self.client() as client:
            token, _ = client.create_join_token(600, reusable=True)
        token_file = self.root / "join.token"  # never on a command line: any user could read it there
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        # Tasks' port ranges of 100 each, under the kernel's ephemeral ports and apart from other agents' usual ones.
        first = 29000 + 200 * (free_port() % 15)
        for i, name in enumerate(AGENTS):
            base = first + 100 * i
            self.agents[name] = self.spawn(
                f"agent-{name}", "agent", "--coordinator", self.addresses, "--name", name,
                "--advertise-address", "127.0.0.1", "--port-range", f"{base}-{base + 99}",
                "--gpu-inventory", "none", "--state-dir", str(self.root / name), "--stop-tasks-on-exit",
                "--join-token-file", str(token_file), "--ca-cert", str(self.root / "ca" / "ca.crt"),
                "--join-address", ",".join(self.joins))
        wait_for(lambda: self.ready_nodes() == len(AGENTS), 60, "the agents to register", self)
        self.console.print(f"agents {' and '.join(AGENTS)} joined, each given both coordinators")

    def leader(self) -> str:
        """The leading coordinator's address as the coordinators answer; "" while none answers."""
        try:
            with self.client() as client:
                return client.status().summary.leader
        except Exception:  # none answers yet, or an election is under way
            return ""

    def ready_nodes(self) -> int:
        try:
            with self.client() as client:
                return sum(n.state == NodeState.READY for n in client.status().nodes)
        except Exception:
            return 0

    def check_alive(self) -> None:
        """A process that exited when it should run fails the demo at once, naming its log."""
        for name, proc in [*((f"agent-{n}", p) for n, p in self.agents.items()), *self._coordinator_names()]:
            if proc.poll() is not None and proc is not self.killed:
                raise Failed(f"{name} exited ({proc.returncode}): see {self.root / name}.log\n"
                             + "\n".join(self.log(name).splitlines()[-10:]))

    def _coordinator_names(self):
        return ((f"coordinator{i}", p) for i, p in enumerate(self.coordinators.values()))

    def stop(self) -> None:
        """Agents first, with SIGTERM (they stop their tasks: --stop-tasks-on-exit), then everything else with
        SIGKILL by process group, the tasks' own groups included, then etcd."""
        for proc in self.agents.values():
            _signal_group(proc, signal.SIGTERM)
        for proc in self.agents.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        for proc in [*self.agents.values(), *self.coordinators.values()]:
            _signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=10)
        for group in task_groups(self.root):
            _kill_group(group)
        self.etcd.stop_all()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        _kill_group(proc.pid, sig)


def _kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def task_groups(root: Path) -> list[int]:
    """The process groups of the tasks the agents under root started (each attempt's status.json names them)."""
    groups = []
    for status in root.glob("*/jobs/*/tasks/*/attempt-*/status.json"):
        try:
            data = json.loads(status.read_text())
        except (OSError, ValueError):
            continue
        groups += [g for g in (data.get("pgid"), data.get("shim_pid")) if g]
    return groups


def wait_for(predicate, timeout: float, what: str, demo: HaDemo, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        demo.check_alive()
        time.sleep(interval)
    raise Failed(f"timed out after {timeout:.0f} s waiting for {what}; the logs are in {demo.root}")


def run_failover(demo: HaDemo) -> int:
    console = demo.console
    launches = demo.root / "launches"
    launches.touch()
    launches.chmod(0o666)  # the tasks run as the job's own user
    command = f"import time; open({str(launches)!r}, 'a').write('launched\\n'); time.sleep({JOB_SECONDS})"
    spec = parse_spec({"name": "steady", "strategy": "multi_worker_mirrored", "command": [sys.executable, "-c", command],
                       "workdir": str(demo.root), "roles": {"worker": {"count": 2}}}, source="demo-ha")
    with demo.client() as client:
        job_id = client.submit(spec)
    wait_for(lambda: job_state(demo, job_id) == JobState.RUNNING, 60, f"{job_id} to run", demo)
    console.print(f"submitted {job_id}: 2 workers, each running {JOB_SECONDS} s; it runs")
    time.sleep(KILL_AFTER_RUNNING_SECONDS)
    old = demo.leader()
    demo.killed = demo.coordinators[old]
    _kill_group(demo.killed.pid)
    killed = time.monotonic()
    demo.killed.wait(timeout=10)
    console.print(f"kill -9 of the leader, {old}")
    new = wait_for(lambda: (lambda a: a if a and a != old else "")(demo.leader()), 30, "the standby to serve",
                   demo, interval=0.05)
    served = time.monotonic() - killed
    console.print(f"  the standby at {new} serves after {served:.1f} s")
    wait_for(lambda: all(f"registered with {new} " in demo.log(f"agent-{n}") for n in AGENTS), 60,
             "both agents to register with the new leader", demo, interval=0.05)
    back = time.monotonic() - killed
    console.print(f"  both agents registered with it, with their running tasks, after {back:.1f} s")
    job = wait_for(lambda: (lambda j: j if j.state in ENDED_JOB_STATES else None)(final_job(demo, job_id)),
                   JOB_SECONDS + 60, f"{job_id} to end", demo, interval=0.5)
    # Each task process started once: one line per task in launches, and no task at a second attempt.
    launched = launches.read_text().count("launched")
    once = launched == len(job.tasks) and all(t.attempt == 1 for t in job.tasks)
    console.print(f"{job_id} {job.state}: {job.restarts} restarts, {launched} task launches "
                  f"for {len(job.tasks)} tasks")
    ok = (job.state == JobState.SUCCEEDED and job.restarts == 0 and once
          and served <= SERVE_WITHIN_SECONDS and back <= AGENTS_BACK_WITHIN_SECONDS)
    console.print(f"summary: standby served {served:.1f} s after kill -9 (within {SERVE_WITHIN_SECONDS} s: "
                  f"{_yes(served <= SERVE_WITHIN_SECONDS)}), both agents back after {back:.1f} s (within "
                  f"{AGENTS_BACK_WITHIN_SECONDS} s: {_yes(back <= AGENTS_BACK_WITHIN_SECONDS)}), job "
                  f"{job.state} with {job.restarts} restarts, each task launched once: "
                  f"{_yes(once)}", markup=False)
    return 0 if ok else 1


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def final_job(demo: HaDemo, job_id: str):
    try:
        with demo.client() as client:
            return client.status(job_id).jobs[0]
    except Exception:
        return None


def job_state(demo: HaDemo, job_id: str):
    job = final_job(demo, job_id)
    return job.state if job is not None else None


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM cleans up as Ctrl-C does


def main() -> int:
    console = Console(width=None if sys.stdout.isatty() else 120)
    if etcd_binary() is None:
        console.print(f"error: the failover demo runs a real etcd cluster: {INSTALL_HINT}", markup=False)
        return 1
    signal.signal(signal.SIGTERM, _interrupt)
    root = scratch_root("tfcluster-ha-")
    demo = None
    try:
        demo = HaDemo(root, console)
        demo.start_cluster()
        return run_failover(demo)
    except Failed as e:
        console.print(f"error: {e}", markup=False)
        return 1
    except KeyboardInterrupt:
        console.print("interrupted; stopping everything", markup=False)
        return 130
    finally:
        if demo is not None:
            demo.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
