"""What a burst of tiny jobs costs the coordinator's core when most of them wait (a benchmark, not a test).

The core alone, in this process, with fake time: two nodes of 100 ports, and jobs of 2 tasks that need nothing
but a port. Every launch reports RUNNING and then exit 0, the oldest launch first, as agents would report them.

- burst: all jobs submitted at once, so hundreds wait in the queue and every task's exit runs a scheduling pass
  over them (bench/cli.py's throughput figure submits this way, over the wire);
- floor: the same jobs submitted one at a time, each run to its end before the next: no queue, the same
  submissions, placements, launches, reports and ends;
- a long queue: the coordinator's periodic tick (every 0.2 s) with WAITING jobs in the queue, beside the same
  cluster's tick with none waiting: two nodes whose ports RUNNING jobs hold, and jobs that wait for them. Time
  alone changes nothing for a job that only waits, so the tick should cost about the same (its floor);
- burst under a quota: the burst again, under a policy with a GPU-hour quota on the jobs' owner, with the usage
  ledger holding LEDGER ended GPU jobs inside the quota's window (a day of short trials). Each scheduling pass
  asks how much of the quota is used: against the burst without a policy.

After each event the store's writer collects what changed (encoded, not stored), as the coordinator writes before
it sends commands. It prints the CPU per job of each and their ratio, and the job documents written per job, and
writes bench/queue_burst.json; the ratio's target is in bench/targets.py.

Usage: python bench/queue_burst.py [--jobs N]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from report import show_and_save  # noqa: E402  (bench/report.py)
from tfcluster import __version__  # noqa: E402
from tfcluster.commands import Launch  # noqa: E402
from tfcluster.daemon.coordinator.core.cluster import Cluster  # noqa: E402
from tfcluster.daemon.coordinator.core.model.accounting import Entry  # noqa: E402
from tfcluster.daemon.coordinator.core.scheduling import policy  # noqa: E402
from tfcluster.daemon.coordinator.rpc.coordinator import TICK_SECONDS  # noqa: E402
from tfcluster.daemon.coordinator.store.records import Writer  # noqa: E402
from tfcluster.model import NodeInfo, TaskExit, TaskReport  # noqa: E402
from tfcluster.specfile import parse_spec  # noqa: E402
from tfcluster.states import JobState  # noqa: E402

NODES = ("n1", "n2")
PORTS = (20000, 20099)
OWNER = "alice"
QUOTA = '[users.alice]\ngpu_hours = 1e9\nwindow = "7d"\n'
WAITING = 10_000
TICKS = 50
SPEC = parse_spec({"name": "tiny", "strategy": "multi_worker_mirrored", "command": ["true"], "workdir": "/",
                   "roles": {"worker": {"count": 2}}}, "bench")


class Core:
    """A Cluster with its nodes registered, and the agents' part played: each launch reports RUNNING, then 0. After
    each event the store's writer collects what changed, as the coordinator writes before it sends commands (the
    writes are counted and encoded, not stored)."""

    def __init__(self, ledger: int = 0) -> None:
        self.cluster = Cluster(lost_after_seconds=3600.0)
        self.writer = Writer()
        self.job_writes = 0
        self.now = 1000.0
        for i, name in enumerate(NODES):
            self.cluster.register(NodeInfo(name=name, address=f"10.0.0.{i + 1}", port_range=PORTS, gpus=(),
                                           state_dir=f"/state/{name}", agent_version=__version__),
                                  [], f"session-{name}", self.now)
        self.launches: collections.deque[Launch] = collections.deque()
        if ledger:  # ended a second apart, each having used a GPU for a minute, all within the quota's window
            self.cluster.set_policy(policy.parse(QUOTA, "bench", self.now))
            self.cluster.usage.load(Entry(f"trial-{i}", OWNER, ("vision",), self.now - i - 60, self.now - i, 60.0)
                                    for i in range(ledger))
        self._write()

    def submit(self) -> None:
        _, commands = self.cluster.submit(SPEC, self.now, owner=OWNER)
        self._keep(commands)

    def run_launched(self) -> None:
        """Every launch, the oldest first, runs and exits 0 (what that frees is placed meanwhile)."""
        while self.launches:
            launch = self.launches.popleft()
            self.now += 0.001
            for phase, exit in (("RUNNING", None), ("EXITED", TaskExit(exit_code=0))):
                report = TaskReport(launch.attempt, phase, pid=1, listening=True, exit=exit)
                self._keep(self.cluster.report(launch.node, report, self.now))

    def _keep(self, commands) -> None:
        self._write()
        self.launches.extend(c for c in commands if isinstance(c, Launch))

    def _write(self) -> None:
        batch = self.writer.collect(self.cluster.changes)
        self.job_writes += sum(1 for kind, _ in batch.writes if kind == "job")  # each record is saved as collected


def run(jobs: int, burst: bool, ledger: int = 0) -> tuple[float, float]:
    """The CPU per job (ms) and the job documents the store's writer wrote per job."""
    core = Core(ledger)
    began = time.process_time()
    for _ in range(jobs):
        core.submit()
        if not burst:
            core.run_launched()
    core.run_launched()
    took = time.process_time() - began
    states = collections.Counter(job.state for job in core.cluster.jobs.values())
    if states != {JobState.SUCCEEDED: jobs}:
        raise SystemExit(f"not every job SUCCEEDED: {dict(states)}")
    return took / jobs * 1000, core.job_writes / jobs


def tick_ms(waiting: int) -> float:
    """CPU per tick (ms) of a core whose ports 100 RUNNING jobs hold, with that many more jobs waiting for them."""
    core = Core()
    for _ in range(len(NODES) * (PORTS[1] - PORTS[0] + 1) // 2):
        core.submit()
    for launch in core.launches:
        report = TaskReport(launch.attempt, "RUNNING", pid=1, listening=True)
        core._keep(core.cluster.report(launch.node, report, core.now))
    core.cluster.schedule_per_batch = True  # as the daemon: a pass per batch of submissions, here one for all
    for _ in range(waiting):
        core.submit()
    core._keep(core.cluster.schedule(core.now))
    if len(core.cluster.jobs.to_place) != waiting:
        raise SystemExit(f"{len(core.cluster.jobs.to_place)} jobs wait, not {waiting}")
    began = time.process_time()
    for _ in range(TICKS):
        core.now += 0.2
        core._keep(core.cluster.tick(core.now))
    return (time.process_time() - began) / TICKS * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=600, help="Jobs in the burst (default 600: 500 of them wait).")
    parser.add_argument("--ledger", type=int, default=100_000,
                        help="Ended GPU jobs in the quota's window, for the burst under a quota (default 100,000).")
    parser.add_argument("--waiting", type=int, default=WAITING,
                        help=f"Jobs waiting in the queue, for the tick (default {WAITING:,}).")
    options = parser.parse_args()
    run(50, burst=True)  # warm: imports, the first allocations
    burst, floor, quota, long_queue, no_queue = [], [], [], [], []
    for _ in range(3):  # alternated, so all meet the same machine
        burst.append(run(options.jobs, burst=True))
        floor.append(run(options.jobs, burst=False))
        quota.append(run(options.jobs, burst=True, ledger=options.ledger))
        long_queue.append(tick_ms(options.waiting))
        no_queue.append(tick_ms(0))
    (burst_cpu, burst_writes), (floor_cpu, floor_writes) = min(burst), min(floor)
    quota_cpu = min(quota)[0]
    results = {"jobs": options.jobs, "burst_cpu_ms_per_job": round(burst_cpu, 3),
               "floor_one_at_a_time_cpu_ms_per_job": round(floor_cpu, 3),
               "burst_vs_one_at_a_time": round(burst_cpu / floor_cpu, 2),
               "burst_job_writes_per_job": round(burst_writes, 1),
               "floor_job_writes_per_job": round(floor_writes, 1),
               "burst_writes_vs_one_at_a_time": round(burst_writes / floor_writes, 2),
               "ledger_entries_in_quota_window": options.ledger,
               "burst_under_quota_cpu_ms_per_job": round(quota_cpu, 3),
               "quota_burst_vs_burst": round(quota_cpu / burst_cpu, 2),
               "waiting_jobs": options.waiting,
               "tick_with_queue_cpu_ms": round(min(long_queue), 2),
               "tick_floor_no_queue_cpu_ms": round(min(no_queue), 2),
               "tick_with_queue_vs_none": round(min(long_queue) / min(no_queue), 1),
               "tick_with_queue_cores": round(min(long_queue) / 1000 / TICK_SECONDS, 3)}
    show_and_save(results, "queue_burst.json")


if __name__ == "__main__":
    main()
