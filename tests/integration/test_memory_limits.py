"""A task's memory limit, kept by its shim watching the process tree (this machine's kernel has cgroup v1 only),
and what every attempt used: real shims, real processes allocating real memory."""

from __future__ import annotations

import os
import sys
import threading
import time

from tfcluster.commands import Launch
from tfcluster.daemon.agent.shim.taskfiles import ShimStatus
from tfcluster.daemon.agent.tasks.supervisor import Supervisor
from tfcluster.model import Attempt

MIB = 1 << 20
TASK_UID = 2_100_999_001  # the job's user, as the coordinator gives it (an agent that is not root ignores it)
# Grows by 50 MB every 0.1 s and says how much it holds each time, so the test can time the kill from when it
# crossed its limit.
HOG = """
import os, time
chunks = []
while True:
    chunks.append(bytearray(50_000_000))
    with open("/proc/self/statm") as f:
        print("rss", int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"), time.time(), flush=True)
    time.sleep(0.1)
"""
# Burns about a second of CPU in a child it reaps, and holds about 100 MB for a while.
BURN_AND_TOUCH = """
import subprocess, sys, time
subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1: pass"])
data = bytearray(100_000_000)
time.sleep(1.5)
"""


class Ended:
    def __init__(self) -> None:
        self.records: dict[Attempt, object] = {}
        self.changed = threading.Condition()

    def __call__(self, record) -> None:
        with self.changed:
            if record.exited.is_set():
                self.records[record.attempt] = record
                self.changed.notify_all()

    def wait(self, attempt: Attempt, timeout: float = 30):
        with self.changed:
            assert self.changed.wait_for(lambda: attempt in self.records, timeout), "the task did not end"
            return self.records[attempt]


def run(tmp_path, script: str, memory: int, job: str = "mem-1", progress: list | None = None):
    ended = Ended()
    supervisor = Supervisor(tmp_path, ended)
    attempt = Attempt(job, "worker", 1, 1)
    try:
        supervisor.launch(Launch("n", attempt, (sys.executable, "-c", script), {"PATH": os.environ["PATH"]},
                                 "/", 0, 1.0, uid=TASK_UID, gid=TASK_UID, memory_bytes=memory))
        while progress is not None and attempt not in ended.records:
            progress += supervisor.progress()
            time.sleep(0.3)
        return ended.wait(attempt)
    finally:
        supervisor.stop_all(0)
        supervisor.launcher.close()


def test_a_memory_hog_is_killed_with_its_limit_and_peak_soon_after_it_crosses(tmp_path):
    record = run(tmp_path, HOG, 200 * MIB)
    killed_at = ShimStatus.read(record.dir).finished
    exit = record.exit
    assert exit.signal == 9, exit
    assert exit.message.startswith("worker:1 exceeded its memory limit of 200 MiB (peak "), exit.message
    peak = exit.peak_rss_bytes
    assert 200 * MIB < peak < 600 * MIB
    assert exit.message == f"worker:1 exceeded its memory limit of 200 MiB (peak {peak / MIB:.1f} MiB)".replace(
        ".0 MiB", " MiB")
    # The hog's lines only: on a loaded machine the interpreter may write others (a MemoryError's, say).
    lines = [line.split() for line in exit.log_tail]
    samples = [(int(f[1]), float(f[2])) for f in lines if len(f) == 3 and f[0] == "rss"]
    assert samples, f"the hog said nothing of its memory: {exit.log_tail}"
    above = [t for rss, t in samples if rss > 200 * MIB]
    # The kill may come between an allocation and its line: then the hog crossed after its last line.
    crossed = min(above) if above else samples[-1][1]
    assert killed_at - crossed < 2.0, f"killed {killed_at - crossed:.2f} s after it crossed its limit"


def test_a_task_under_its_limit_is_left_alone_and_its_usage_is_measured(tmp_path):
    progress: list = []
    record = run(tmp_path, BURN_AND_TOUCH, 400 * MIB, progress=progress)
    exit = record.exit
    assert exit.exit_code == 0 and exit.message == "", exit
    assert 0.9 <= exit.cpu_seconds < 3.0, exit.cpu_seconds  # the child's second, reaped, counts
    assert 100_000_000 <= exit.peak_rss_bytes < 250 * MIB, exit.peak_rss_bytes
    live = [p for p in progress if p.rss_bytes]
    assert live, "heartbeats carried the running task's figures"
    assert max(p.peak_rss_bytes for p in live) >= 100_000_000
    assert all(p.peak_rss_bytes >= p.rss_bytes for p in live)


def test_without_a_limit_the_usage_is_still_measured(tmp_path):
    record = run(tmp_path, BURN_AND_TOUCH, 0)
    assert record.exit.exit_code == 0
    assert record.exit.cpu_seconds >= 0.9 and record.exit.peak_rss_bytes >= 100_000_000
