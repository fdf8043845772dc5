"""What running trials as a sweep costs over starting the same jobs one by one: a sweep's scheduling overhead per
trial, against plain starts measured in the same run.

A coordinator and two CPU agents (LocalCluster). Each round runs N tiny jobs (one task of `true`) both ways, the
order alternating between rounds:

  plain  N `Cluster.start` calls of the spec, all submitted at once, then waited for: the floor.
  sweep  one `Cluster.sweep` of the same spec with a parameter of N values and max_concurrent = N: the
         coordinator submits every trial itself, watches each end and ends the sweep.

Per round and mode: seconds from the first submission until every job has ended (a sweep: until the sweep has
ended), per job. Then min and median per mode, the ratio of the medians, and the overhead per trial.

    .venv/bin/python bench/sweep_overhead.py [--trials 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from harness import running_cluster  # noqa: E402

from tfcluster import Cluster  # noqa: E402

MODES = ("plain", "sweep")


def tiny(name: str) -> dict:
    return {"name": name, "strategy": "mirrored", "command": ["true"], "gpus": 0, "roles": {"worker": {"count": 1}}}


def plain(cluster: Cluster, trials: int, round_: int) -> float:
    started = time.monotonic()
    jobs = [cluster.start(tiny(f"plain-{round_}-{i}")) for i in range(trials)]
    for job in jobs:
        job.wait(timeout=300)
    return time.monotonic() - started


def sweep(cluster: Cluster, trials: int, round_: int) -> float:
    spec = {**tiny(f"sweep-{round_}"), "sweep": {"metric": "accuracy", "max_concurrent": trials,
                                                "parameters": {"TRIAL": list(range(trials))}}}
    started = time.monotonic()
    status = cluster.sweep(spec).wait(timeout=300, poll_seconds=0.05)
    seconds = time.monotonic() - started
    assert status.state == "SUCCEEDED" and len(status.trials) == trials, status
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-", dir="/var/tmp") as root:
        Path(root).chmod(0o755)
        with running_cluster(Path(root), {"a": {}, "b": {}}) as local:
            with Cluster(local.address, local.admin_dir) as cluster:
                for round_ in range(args.rounds):
                    for mode in (MODES if round_ % 2 == 0 else MODES[::-1]):
                        took = (plain if mode == "plain" else sweep)(cluster, args.trials, round_)
                        seconds[mode].append(took)
                        print(f"round {round_} {mode:5} {took:6.2f} s  {took / args.trials * 1000:6.1f} ms a job",
                              flush=True)
    medians = {mode: statistics.median(values) for mode, values in seconds.items()}
    for mode, values in seconds.items():
        print(f"{mode:5} {args.trials} jobs: min {min(values):6.2f} s  median {medians[mode]:6.2f} s  "
              f"({medians[mode] / args.trials * 1000:.1f} ms a job)")
    overhead = (medians["sweep"] - medians["plain"]) / args.trials * 1000
    print(f"sweep / plain (medians): {medians['sweep'] / medians['plain']:.2f}x; {overhead:+.1f} ms a trial")
    return 0


if __name__ == "__main__":
    sys.exit(main())
