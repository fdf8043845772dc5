"""What watching a task's process tree costs its shim (treewatch.py): CPU per second per watched task, at the
cadence a quiet task gets (one sample a second) and at the fastest (ten a second, a task nearing its limit
fast), against the same process sitting idle for the same time (the baseline, measured in the same run).

The watched task is a small tree like a training task's: a parent and four children (data-loader workers), all
asleep. A sample reads the tree's members; looking for members anew (every few seconds) reads every process's
/proc entry, so its cost grows with the processes on the node, whose count is printed with the figures.

Prints a table and writes bench/memwatch.json. Run with `python bench/memwatch.py`.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tfcluster.daemon.agent.shim import treewatch  # noqa: E402
from tfcluster.daemon.agent.shim.treewatch import TreeWatch  # noqa: E402

SECONDS = 10.0
TREE = "import subprocess, sys, time\n" \
       "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']) for _ in range(4)]\n" \
       "time.sleep(600)\n"


def cpu_of_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_per_second(watch: TreeWatch | None) -> float:
    """This process's CPU per second over SECONDS, with the watch running (None: idle, the baseline)."""
    began_cpu, began = cpu_of_self(), time.monotonic()
    if watch is not None:
        watch.start()
    time.sleep(SECONDS)
    if watch is not None:
        watch._done.set()
        watch._thread.join()
    return (cpu_of_self() - began_cpu) / (time.monotonic() - began)


def main() -> None:
    task = subprocess.Popen([sys.executable, "-c", TREE])
    try:
        while len(psutil.Process(task.pid).children()) < 4:
            time.sleep(0.1)
        baseline = cpu_per_second(None)
        quiet = cpu_per_second(TreeWatch(task.pid))
        treewatch.SAMPLE_SECONDS = treewatch.FASTEST_SAMPLE_SECONDS  # every sample at the fastest cadence
        fast = cpu_per_second(TreeWatch(task.pid))
        samples, began = 200, time.process_time()
        watch = TreeWatch(task.pid)
        for _ in range(samples):
            watch.sample()
        per_sample = (time.process_time() - began) / samples
        began = time.process_time()
        for _ in range(samples):
            treewatch._tree(task.pid)
        per_scan = (time.process_time() - began) / samples
    finally:
        for child in psutil.Process(task.pid).children():
            child.kill()
        task.kill()
        task.wait()
    results = {
        "node_processes": len(psutil.pids()),
        "watched_tree_processes": 5,
        "cpu_per_sample_ms": round(per_sample * 1000, 3),
        "cpu_per_member_scan_ms": round(per_scan * 1000, 3),
        "idle_baseline_cpu_ms_per_s": round(baseline * 1000, 3),
        "watch_1hz_cpu_ms_per_s": round(quiet * 1000, 3),
        "watch_1hz_over_baseline_ms_per_s": round((quiet - baseline) * 1000, 3),
        "watch_10hz_cpu_ms_per_s": round(fast * 1000, 3),
        "watch_10hz_over_baseline_ms_per_s": round((fast - baseline) * 1000, 3),
    }
    for name, value in results.items():
        print(f"{name:36} {value}")
    (Path(__file__).parent / "memwatch.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
