"""Control-plane benchmarks (not tests): figures a cluster operator cares about, measured on this machine.

- bring-up: coordinator start to N agents READY
- launch latency: `start` returning to every task RUNNING (a plain command, no TensorFlow)
- exit report latency: the last task's exit to the job's SUCCEEDED at the coordinator (shim, agent, stream)
- node-loss detection: kill -9 of an agent to its node being LOST (vs. the configured timeout)
- agent memory: RSS of an idle agent and of an agent supervising tasks
- CLI: `tfcluster status` against the live coordinator, wall time, against the floor measured in the same run
  (a Python that imports grpc and typer and does nothing else)

Prints a table and writes bench/results.json. Run with `make bench`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from harness import LocalCluster, wait_until  # noqa: E402
from report import show_and_save  # noqa: E402  (bench/, the folder of the script run)

AGENTS = 4
ROUNDS = 5
LOST_AFTER = 3.0
CLI_ROUNDS = 15


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms (min {min(values) * 1000:.0f}, max {max(values) * 1000:.0f})"


def wall(argv: list[str], env: dict[str, str]) -> float:
    began = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True, env={**os.environ, **env})
    return time.monotonic() - began


def cli_figures(cluster: LocalCluster) -> dict[str, str]:
    """`tfcluster status` and the floor, alternated so that both meet the same machine."""
    status, floor = [], []
    for _ in range(CLI_ROUNDS):
        status.append(wall([sys.executable, "-m", "tfcluster.cli", "status"], cluster.client_env()))
        floor.append(wall([sys.executable, "-c", "import grpc, typer"], {}))
    ratio = statistics.median(status) / statistics.median(floor)
    return {"cli_status": median_ms(status), "cli_floor_import_grpc_typer": median_ms(floor),
            "cli_status_over_floor": f"{ratio:.2f}x"}


def main() -> None:
    results: dict[str, object] = {}
    # Tasks run as their jobs' own users: the cluster lives where they can reach their files (not in /tmp, which a
    # task may see as its own).
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-", dir="/var/tmp") as tmp:
        os.chmod(tmp, 0o711)
        cluster = LocalCluster(root=Path(tmp), lost_after=LOST_AFTER)
        try:
            began = time.monotonic()
            cluster.start_coordinator()
            for i in range(AGENTS):
                cluster.start_agent(f"n{i}", gpus=2, wait=False)
            wait_until(lambda: sum(n["state"] == "READY" for n in cluster.status()["nodes"]) == AGENTS, 60,
                       interval=0.02, what="agents")
            results["bring_up_seconds"] = round(time.monotonic() - began, 3)

            idle_rss = [psutil.Process(a.proc.pid).memory_info().rss for a in cluster.agents.values()]
            results["agent_rss_idle_mib"] = round(max(idle_rss) / 2**20, 1)

            launch, exit_report = [], []
            for r in range(ROUNDS):
                t0 = time.monotonic()
                job_id = cluster.cli("start", "--name", f"bench{r}", "--strategy", "multi_worker_mirrored",
                                     "--workers", str(AGENTS), "--gpus-per-task", "1", "--",
                                     "sh", "-c", "sleep 1; date +%s.%N", check=True).stdout.strip()
                wait_until(lambda: cluster.job(job_id)["state"] != "STARTING", 30, interval=0.01, what="RUNNING")
                launch.append(time.monotonic() - t0)
                busy_rss = [psutil.Process(a.proc.pid).memory_info().rss for a in cluster.agents.values()]
                results["agent_rss_busy_mib"] = round(max(busy_rss) / 2**20, 1)
                job = cluster.wait_job(job_id, timeout=30)
                # Each task prints the time as its last act; the job ends when the last of them is reported.
                last_exit = max(float(cluster.cli("logs", job_id, f"worker:{i}", check=True).stdout)
                                for i in range(AGENTS))
                exit_report.append(job["finished"] - last_exit)
            results["launch_to_running"] = median_ms(launch)
            results["last_exit_to_job_succeeded"] = median_ms(exit_report)
            results.update(cli_figures(cluster))

            victim = cluster.agents["n0"]
            killed = time.monotonic()
            victim.kill()
            wait_until(lambda: cluster.node_state("n0") == "LOST", 30, interval=0.01, what="LOST")
            results["node_loss_detection_seconds"] = round(time.monotonic() - killed, 2)
            results["node_loss_timeout_seconds"] = LOST_AFTER
        finally:
            cluster.teardown()

    show_and_save(results, "results.json")


if __name__ == "__main__":
    main()
