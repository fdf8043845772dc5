"""`make demo-multihost` (python -m tfcluster.demo.multihost, as root): the demo across three hosts.

Builds three test hosts (network namespaces with their own IPs, see hosts.py), runs the coordinator on
the bridge address (over mutual TLS, with a cluster CA made for the run) and one agent per host as a separate
process that joins with a token, and runs a MultiWorkerMirroredStrategy
job with its chief, worker and evaluator on different hosts and no shared storage: the chief's agent
ships each checkpoint to the evaluator's host. Everything is torn down at the end.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live

from tfcluster import pki
from tfcluster.client import Client
from tfcluster.daemon.coordinator.grpc_server import CoordinatorServer
from tfcluster.daemon.coordinator.process import BackgroundCoordinator
from tfcluster.demo import scratch_root
from tfcluster.demo.hosts import TestHosts, unavailable
from tfcluster.render import rich_status
from tfcluster.security import Credentials
from tfcluster.specfile import parse_spec
from tfcluster.states import ENDED_JOB_STATES, JobState, NodeState

HOSTS = 3


def main() -> int:
    console = Console(width=None if sys.stdout.isatty() else 120)
    why = unavailable()
    if why:
        console.print(f"error: the multi-host demo builds network namespaces: {why}", markup=False)
        return 1
    if importlib.util.find_spec("tensorflow") is None:
        console.print("error: the demo trains a real model: pip install 'tfcluster[tf]'", markup=False)
        return 1
    root = scratch_root("tfcluster-multihost-")
    agents: list[subprocess.Popen] = []
    with TestHosts(HOSTS) as hosts:
        pki.init_ca(root / "ca", [hosts.coordinator_ip])
        server = BackgroundCoordinator(CoordinatorServer(f"{hosts.coordinator_ip}:0", root / "coordinator",
                                                         tls_dir=root / "ca")).start()
        admin = Credentials.from_dir(root / "ca" / "admin")
        try:
            with Client(server.address, admin) as client:
                token, _ = client.create_join_token(600, reusable=True)
            path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
            token_env = {"TFCLUSTER_JOIN_TOKEN": token}  # never on a command line: any user could read it there
            for i in range(1, HOSTS + 1):
                log = open(root / f"agent-h{i}.log", "ab")
                agents.append(subprocess.Popen(
                    [*hosts.prefix(i), sys.executable, "-m", "tfcluster.cli", "agent", "--coordinator",
                     server.address, "--name", f"h{i}", "--port-range", "21000-21099", "--gpu-inventory", "none",
                     "--state-dir", str(root / f"h{i}"), "--stop-tasks-on-exit",
                     "--join-address", server.join_address, "--ca-cert", str(root / "ca" / pki.CA_CERT)],
                    stdout=log, stderr=log, start_new_session=True, env={**os.environ, "PATH": path, **token_env}))
            console.print(f"hosts h1..h{HOSTS} at {hosts.ip(1)}..{hosts.ip(HOSTS)}; coordinator on {server.address}")
            return _run_job(console, Client(server.address, admin), root)
        finally:
            for agent in agents:
                os.killpg(agent.pid, signal.SIGTERM)
            for agent in agents:
                agent.wait(timeout=30)
            server.stop()
            shutil.rmtree(root, ignore_errors=True)


def _run_job(console: Console, client: Client, root: Path) -> int:
    with client:
        deadline = time.monotonic() + 60
        while sum(n.state == NodeState.READY for n in client.status().nodes) < HOSTS:
            if time.monotonic() > deadline:
                console.print("error: the agents did not register; see their logs", markup=False)
                return 1
            time.sleep(0.2)
        spec = parse_spec({
            "name": "digits", "strategy": "multi_worker_mirrored",
            "command": [sys.executable, "-m", "tfcluster.demo.train_digits"], "workdir": str(root),
            "env": {"EPOCHS": "5"}, "stop_grace_seconds": 5,
            "roles": {"chief": {"nodes": ["h1"]}, "worker": {"count": 1, "nodes": ["h2"]},
                      "evaluator": {"nodes": ["h3"], "entrypoint": "tfcluster.demo.digits:evaluation"}},
        }, source="demo")
        job_id = client.submit(spec)
        console.print(f"submitted {job_id}: chief on h1, worker on h2, evaluator on h3; checkpoints stay on "
                      f"their hosts and are shipped to h3")
        response = client.status(job_id)
        with Live(rich_status(response.nodes, response.jobs, job_id=job_id), console=console, refresh_per_second=4,
                  transient=True) as live:
            while response.jobs[0].state not in ENDED_JOB_STATES:
                time.sleep(0.5)
                response = client.status(job_id)
                live.update(rich_status(response.nodes, response.jobs, job_id=job_id))
        console.print(rich_status(response.nodes, response.jobs, job_id=job_id))
        job = response.jobs[0]
        for e in job.evaluations:
            shown = ", ".join(f"{k} {v:.3f}" for k, v in sorted(e.metrics.items()))
            console.print(f"  evaluated on h3: {Path(e.checkpoint).name} (step {e.step}): {shown}", markup=False)
        return 0 if job.state == JobState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
