"""What an agent restart costs running jobs (a benchmark, not a test): on a local cluster (a real coordinator and
two agents over mutual TLS, --lost-after 3) running a 2-worker multi_worker_mirrored job, with the machine's
cores kept busy by LOAD spinning processes, agent b is killed with -9 and started again DELAY seconds later
(by default just after its node is declared LOST, as a loaded host's systemd restart met it), ROUNDS times; then
b's host "dies" (its agent and its tasks killed, nothing started again) and the time until the job runs again on
a is measured.

Both with the task grace (--tasks-lost-after, 20 s by default) and, in the same run, with none (0: a LOST
node's tasks are lost with it, as before the grace): job restarts caused by the agent restarts in each, how
long each agent took to be back, and how long a dead host's job took to run again.

Prints a table and writes bench/agent_restart.json. Run with `make bench` or `python bench/agent_restart.py
[--rounds N] [--load N] [--delay S]` (`--delay 0`: started again at once).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from harness import LocalCluster, kill_group, wait_until  # noqa: E402

ROUNDS = 20
LOAD = 4  # spinning processes: a load of 4 on this 2-core machine, as the restart race was first seen at
DEFAULT_GRACE = 20.0
DELAY = 3.5  # --lost-after (3 s) and a little: the node is LOST when its agent comes back


def spin() -> None:
    while True:
        pass


def running(cluster: LocalCluster, job_id: str) -> dict | None:
    job = cluster.job(job_id)
    return job if job["state"] == "RUNNING" and all(t["state"] == "RUNNING" for t in job["tasks"]) else None


def registered(cluster: LocalCluster) -> int:
    """How many times agent b has registered so far (its log is kept across its restarts)."""
    return cluster.agents["b"].log().count("registered with ")


def one_cluster(grace: float, rounds: int, delay: float) -> dict:
    cluster = LocalCluster(root=Path(tempfile.mkdtemp(prefix="tfcluster-agent-restart-")), tasks_lost_after=grace)
    try:
        cluster.start_coordinator()
        cluster.start_agents({"a": {}, "b": {}})
        job = Spread(cluster)
        back = []
        for _ in range(rounds):
            job.ensure_on_b()
            registrations = registered(cluster)
            killed = time.monotonic()
            cluster.agents["b"].kill()
            time.sleep(delay)
            cluster.start_agent("b", wait=False)
            wait_until(lambda: registered(cluster) > registrations, 120, interval=0.02, what="b registered again")
            back.append(time.monotonic() - killed)
            wait_until(lambda: running(cluster, job.id), 120, interval=0.05, what="the job running")
        restarts = job.restarts()
        job.ensure_on_b()
        before = cluster.job(job.id)["restarts"]
        on_b = [t["pid"] for t in cluster.job(job.id)["tasks"] if t["node"] == "b"]
        died = time.monotonic()
        cluster.agents["b"].kill()
        for pid in on_b:
            kill_group(os.getpgid(pid))
        wait_until(lambda: (lambda j: j and j["restarts"] > before and {t["node"] for t in j["tasks"]} == {"a"})(
            running(cluster, job.id)), 180, interval=0.05, what="the job running again on a")
        return {"tasks_lost_after": grace, "rounds": rounds, "delay_s": delay, "job_restarts": restarts,
                "agent_back_s": {"median": round(statistics.median(back), 2), "max": round(max(back), 2)},
                "host_death_to_running_again_s": round(time.monotonic() - died, 1)}
    finally:
        cluster.teardown()


class Spread:
    """A 2-worker job with a task on each node; when a restart left it all on a (b was LOST as it was placed), it
    is replaced by a new one, its restarts kept, so that every round kills an agent with a task."""

    def __init__(self, cluster: LocalCluster):
        self.cluster, self.id, self.earlier = cluster, "", 0
        self.ensure_on_b()

    def ensure_on_b(self) -> None:
        if self.id:
            job = wait_until(lambda: running(self.cluster, self.id), 120, what="the job running")
            if any(t["node"] == "b" for t in job["tasks"]):
                return
            self.earlier += job["restarts"]
            self.cluster.cli("stop", "--now", self.id, check=True)
        self.id = self.cluster.cli("start", "--name", "steady", "--strategy", "multi_worker_mirrored", "--workers",
                                   "2", "--max-restarts", "1000", "--", "sleep", "3600", check=True).stdout.strip()
        job = wait_until(lambda: running(self.cluster, self.id), 60, what="the job running")
        assert {t["node"] for t in job["tasks"]} == {"a", "b"}, job

    def restarts(self) -> int:
        return self.earlier + self.cluster.job(self.id)["restarts"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--load", type=int, default=LOAD)
    parser.add_argument("--delay", type=float, default=DELAY)
    args = parser.parse_args()
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.load)]
    for p in spinners:
        p.start()
    try:
        results = [one_cluster(DEFAULT_GRACE, args.rounds, args.delay), one_cluster(0.0, args.rounds, args.delay)]
    finally:
        for p in spinners:
            os.kill(p.pid, signal.SIGKILL)
    print(f"agent b killed -9 and started again {args.delay:g} s later, {args.rounds} times, load {args.load} on "
          f"{os.cpu_count()} cores:")
    print(f"{'--tasks-lost-after':>20} {'job restarts':>13} {'agent back (median/max)':>24} {'dead host to running':>21}")
    for r in results:
        print(f"{r['tasks_lost_after']:>18g} s {r['job_restarts']:>13} "
              f"{r['agent_back_s']['median']:>12.2f} / {r['agent_back_s']['max']:<9.2f} s "
              f"{r['host_death_to_running_again_s']:>19.1f} s")
    grace, none = results
    print(f"job restarts per agent restart: {grace['job_restarts'] / args.rounds:.2f} with the grace, "
          f"{none['job_restarts'] / args.rounds:.2f} without")
    (ROOT / "bench" / "agent_restart.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
