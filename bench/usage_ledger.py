"""What the usage ledger keeps for a stream of short jobs (a benchmark, not a test).

The coordinator's ledger alone, in this process, with fake time: JOBS short jobs (5 s each) end at RATE a second,
owners and groups in turn, each recorded as the cluster records an ended job, the horizon and the folding of short
jobs into hours run as the coordinator's tick runs them. Measured with tracemalloc, against the same stream kept
one entry per job (the baseline: folding off), in the same run:
- the entries kept and the bytes the ledger holds at the end;
- the CPU per job of recording, folding and pruning;
- `tfcluster usage`'s totals over 7 days, and a 7-day quota's sums built anew (a coordinator's first pass), timed.
Prints a table and writes bench/usage_ledger.json; the ratio's target is in bench/targets.py.

Usage: python bench/usage_ledger.py [--jobs N] [--rate R]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from report import show_and_save  # noqa: E402  (bench/report.py)
from tfcluster.daemon.coordinator.core.model.accounting import Entry  # noqa: E402
from tfcluster.daemon.coordinator.core.model.ledger import Ledger  # noqa: E402

OWNERS = [(f"user{i}", (f"team{i % 5}",)) for i in range(20)]
T0 = 1_764_892_800.0
TICK_SECONDS = 10.0  # how often this bench runs the tick's part (the coordinator runs it every 0.2 s)
WEEK = 7 * 86400.0


def stream(jobs: int, rate: float, fold: bool) -> dict:
    ledger = Ledger()
    if not fold:
        ledger.fold_every = float("inf")
    gc.collect()
    tracemalloc.start()
    began, now, ticked = time.process_time(), T0, T0
    for number in range(jobs):
        now = T0 + number / rate
        owner, groups = OWNERS[number % len(OWNERS)]
        ledger.record(Entry(f"trial-{number}-abcd", owner, groups, now - 5.0, now, gpu_seconds=5.0, cpu_seconds=4.0,
                            peak_rss_bytes=1 << 30))
        if now - ticked >= TICK_SECONDS:
            ledger.prune(now)
            ledger.fold(now)
            ticked = now
    cpu = time.process_time() - began
    gc.collect()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    began = time.process_time()
    totals = ledger.totals(now - WEEK, now)
    usage_ms = (time.process_time() - began) * 1000
    began = time.process_time()
    ledger.gpu_seconds_within(WEEK, now + 1)
    window_ms = (time.process_time() - began) * 1000
    assert sum(t.jobs for k, t in totals.items() if not k.startswith("group:")) == jobs
    return {"entries": len(ledger), "bytes": held, "cpu_ms_per_job": cpu / jobs * 1000, "usage_ms": usage_ms,
            "window_ms": window_ms, "hours": (now - T0) / 3600}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=500_000, help="Short jobs in the stream (default 500,000).")
    parser.add_argument("--rate", type=float, default=10.0, help="Jobs ending a second (default 10).")
    options = parser.parse_args()
    folded = stream(options.jobs, options.rate, fold=True)
    kept = stream(options.jobs, options.rate, fold=False)
    results = {"jobs": options.jobs, "hours_of_jobs": round(folded["hours"], 1), "jobs_per_second": options.rate,
               "entries_kept_folded": folded["entries"], "entries_kept_one_per_job": kept["entries"],
               "bytes_per_job_folded": round(folded["bytes"] / options.jobs, 1),
               "bytes_per_job_one_per_job": round(kept["bytes"] / options.jobs, 1),
               "folded_vs_one_per_job_bytes": round(folded["bytes"] / kept["bytes"], 3),
               "cpu_ms_per_job_folded": round(folded["cpu_ms_per_job"], 4),
               "cpu_ms_per_job_one_per_job": round(kept["cpu_ms_per_job"], 4),
               "usage_7d_ms_folded": round(folded["usage_ms"], 1),
               "usage_7d_ms_one_per_job": round(kept["usage_ms"], 1),
               "quota_window_built_ms_folded": round(folded["window_ms"], 1),
               "quota_window_built_ms_one_per_job": round(kept["window_ms"], 1)}
    show_and_save(results, "usage_ledger.json")


if __name__ == "__main__":
    main()
