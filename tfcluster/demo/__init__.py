"""`tfcluster demo`: a whole cluster on this machine, and a real job on it.

An embedded coordinator and three agents (loopback, temporary state dirs, declared GPU inventories so
placement is visible) run in this process, over mutual TLS with a cluster CA made for the demo: the agents
join with a token as real nodes do. The job goes through the same gRPC API as `tfcluster start`:
a MultiWorkerMirroredStrategy job with two workers training a tf-keras model on scikit-learn's digits,
and the built-in evaluator evaluating each checkpoint they save.
Live status while it runs, then the metrics and the final status table; everything is torn down.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live

from tfcluster import pki, reach
from tfcluster.client import Client
from tfcluster.daemon.agent.agent import Agent, AgentConfig
from tfcluster.daemon.agent.session.discovery import host_info
from tfcluster.daemon.agent.session.identity import NodeIdentity
from tfcluster.daemon.coordinator.grpc_server import CoordinatorServer
from tfcluster.daemon.coordinator.process import BackgroundCoordinator
from tfcluster.model import Gpu
from tfcluster.render import rich_status
from tfcluster.security import Credentials
from tfcluster.specfile import parse_spec
from tfcluster.states import ENDED_JOB_STATES, JobState, NodeState

NODES = (("node-a", 2), ("node-b", 2), ("node-c", 1))  # name, declared GPUs
SCRATCH_PARENT_AS_ROOT = "/var/tmp"
SHARED_DIR_MODE = 0o1777
JOB_TIMEOUT_SECONDS = 600


def _free_port_block(size: int = 300) -> int:
    """A base port with `size` free ports after it (tasks lease ports from these ranges)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        base = 20000 + (base % 30000)
        if all(_port_free(p) for p in range(base, base + size, 50)):
            return base
    return 24000


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def scratch_root(prefix: str) -> Path:
    """A temporary dir for a demo cluster. Its tasks run as their job's own user with a private /tmp: as root,
    the dir is made outside /tmp (in /var/tmp) and traversable by them (0711)."""
    as_root = os.geteuid() == 0 and os.path.isdir(SCRATCH_PARENT_AS_ROOT)
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=SCRATCH_PARENT_AS_ROOT if as_root else None))
    root.chmod(0o711)
    return root


def open_for_tasks(console: Console) -> list[tuple[str, int]]:
    """As root, the job's tasks run under a user of their own, who must reach this Python and tfcluster: a Python
    installed under /root (pyenv, or any root-installed one) lies behind a directory that lets no other user
    through. Opens each such directory for traversal alone (o+x: others may pass, not list) and says so; returns
    (dir, mode before) for close_again."""
    if os.geteuid() != 0:
        return []  # tasks run as this very user
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    closed = list(dict.fromkeys(reach.closed_dirs(sys.executable) + reach.closed_dirs(package)))
    opened = []
    for directory in closed:
        mode = stat.S_IMODE(os.stat(directory).st_mode)
        os.chmod(directory, mode | stat.S_IXOTH)
        opened.append((directory, mode))
    if opened:
        console.print(f"The job's tasks run under a user of their own, who could not reach {sys.executable}: "
                      f"opened {', '.join(d for d, _ in opened)} for traversal (chmod o+x: other users may pass "
                      "through, not list) while the demo runs; put back as it was when it ends.", markup=False)
    return opened


def close_again(opened: list[tuple[str, int]]) -> None:
    for directory, mode in reversed(opened):
        try:
            os.chmod(directory, mode)
        except OSError:
            pass


def run_demo(epochs: int = 5, keep: bool = False, console: Console | None = None) -> int:
    console = console or Console()
    missing = [m for m in ("tensorflow", "tf_keras", "sklearn") if importlib.util.find_spec(m) is None]
    if missing:
        console.print(f"error: the demo trains a real model and needs {', '.join(missing)}: "
                      "pip install 'tfcluster[tf]'", markup=False)
        return 1
    opened = open_for_tasks(console)
    try:
        return _run(epochs, keep, console)
    finally:
        close_again(opened)


def _run(epochs: int, keep: bool, console: Console) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    root = scratch_root("tfcluster-demo-")
    # The job's tasks (its own user) write their checkpoints here, as into a shared scratch dir.
    (root / "checkpoints").mkdir(mode=0o700)
    (root / "checkpoints").chmod(SHARED_DIR_MODE)
    started = time.monotonic()
    pki.init_ca(root / "ca", [])
    server = BackgroundCoordinator(CoordinatorServer("127.0.0.1:0", root / "coordinator",
                                                     tls_dir=root / "ca")).start()
    agents: list[Agent] = []
    threads = []
    base = _free_port_block()
    try:
        with Client(server.address, Credentials.from_dir(root / "ca" / "admin")) as client:
            token, _ = client.create_join_token(600, reusable=True)
            for i, (name, gpu_count) in enumerate(NODES):
                agents.append(_join(server, name, gpu_count, token, root, base + 100 * i))
                threads.append(threading.Thread(target=agents[-1].run, name=f"agent-{name}", daemon=True))
                threads[-1].start()
            console.print(f"coordinator on {server.address} (mutual TLS, cluster CA in {root / 'ca'}); agents "
                          "joined with a token: " + ", ".join(f"{n} ({g} GPU{'s' if g != 1 else ''})" for n, g in NODES)
                          + f"; state in {root}")
            _wait_for_nodes(client, len(NODES))
            spec = parse_spec({
                "name": "digits", "strategy": "multi_worker_mirrored",
                "command": [sys.executable, "-m", "tfcluster.demo.train_digits"],
                "workdir": str(root), "checkpoint_dir": str(root / "checkpoints"),
                "env": {"EPOCHS": str(epochs)}, "stop_grace_seconds": 5,
                "roles": {"worker": {"count": 2, "gpus": 1},
                          "evaluator": {"gpus": 0, "entrypoint": "tfcluster.demo.digits:evaluation"}},
            }, source="demo")
            job_id = client.submit(spec)
            console.print(f"submitted {job_id}: multi_worker_mirrored, 2 workers with 1 GPU each, "
                          "and an evaluator following their checkpoints")
            job = _watch(client, job_id, console)
            return _report(client, job, root, time.monotonic() - started, console)
    finally:
        for agent in agents:
            agent.stop(stop_tasks=True, grace_seconds=5)
        for thread in threads:
            thread.join(timeout=5)
        server.stop()
        if keep:
            console.print(f"kept logs and checkpoints under {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _report(client: Client, job, root: Path, seconds: float, console: Console) -> int:
    """The final status and the model's metrics; the tasks' last lines when the job did not succeed."""
    final = client.status(job.id)
    console.print(rich_status(final.nodes, final.jobs, job_id=job.id))
    if job.state == JobState.SUCCEEDED:
        metrics = json.loads((root / "checkpoints" / "metrics.json").read_text())
        console.print(f"{job.id} SUCCEEDED in {seconds:.1f} s: held-out accuracy {metrics['accuracy']:.3f}, loss "
                      f"{metrics['loss']:.3f} ({metrics['test_examples']} test digits, {metrics['epochs']} epochs, "
                      f"{metrics['replicas']} replicas)")
        for e in final.jobs[0].evaluations:
            shown = ", ".join(f"{k} {v:.3f}" for k, v in sorted(e.metrics.items()))
            console.print(f"  evaluator: {Path(e.checkpoint).name} (step {e.step}): {shown}")
        return 0
    console.print(f"{job.id} ended {job.state}: {job.message}", markup=False)
    for task in job.tasks:
        tail = b"".join(client.logs(job.id, task.type, task.index, tail_lines=15)).decode(errors="replace")
        console.print(f"--- last lines of {task.type}:{task.index} ---\n{tail}", markup=False)
    return 1


def _join(server: BackgroundCoordinator, name: str, gpu_count: int, token: str, root: Path, base: int) -> Agent:
    """An agent for a demo node, with the certificate it got by joining through the coordinator's join port."""
    gpus = tuple(Gpu(index=g, uuid=f"GPU-demo-{name}-{g}", name="Demo GPU", memory_mib=16384) for g in range(gpu_count))
    identity = NodeIdentity(root / name, name, "127.0.0.1")
    credentials = identity.join(server.join_address, token, (root / "ca" / pki.CA_CERT).read_bytes())
    return Agent(AgentConfig(coordinator=server.address, name=name, address="127.0.0.1",
                             port_range=(base + 1, base + 99), gpus=gpus, host=host_info(), state_dir=root / name,
                             peer_port=base, credentials=credentials, identity=identity))


def _wait_for_nodes(client: Client, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(n.state == NodeState.READY for n in client.status().nodes) == count:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the demo's {count} agents did not register within {timeout:.0f} s")


def _watch(client: Client, job_id: str, console: Console):
    deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
    response = client.status(job_id)
    with Live(rich_status(response.nodes, response.jobs, job_id=job_id), console=console, refresh_per_second=4,
              transient=True) as live:
        while response.jobs[0].state not in ENDED_JOB_STATES:
            if time.monotonic() > deadline:
                client.stop(job_id, graceful=False)
            time.sleep(0.5)
            response = client.status(job_id)
            live.update(rich_status(response.nodes, response.jobs, job_id=job_id))
    return response.jobs[0]
