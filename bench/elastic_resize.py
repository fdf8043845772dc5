"""From capacity freed to training at the new size: an elastic job's grow, against the same program restarted
from its checkpoint by hand.

Three agents with one (pretend) GPU each; a one-GPU job holds the third. The program is
examples/mwms_preemption.py (a MultiWorkerMirroredStrategy custom loop that saves on the job's stop signal,
SIGUSR1, and says `training at step N with R replicas` once its first step after a start is done). Modes:

  elastic  `[roles.worker] count = "2..3"`, resize_interval_seconds = 1: tfcluster grows the group itself once
           the third GPU frees (the workers save at the signal, the group is placed again at 3).
  by-hand  what a user does without elastic jobs, as fast as a script can: a fixed 2-worker job; once the GPU
           frees, `tfcluster stop JOB` (the workers save at the signal; it waits until they exited), the checkpoint
           dir opened to the new job's UID, then `tfcluster start` of the same spec at 3 workers with the same
           checkpoint_dir. A person's reaction
           time is not counted: this is the floor of doing it by hand.

Per round: seconds from the holder's stop to the first step trained at 3 replicas, and the step resumed at.
Rounds alternate the modes; then min and median per mode and the ratio of the medians.

    .venv/bin/python bench/elastic_resize.py [--rounds 3] [--after 5]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from gpuholder import hold_gpu  # noqa: E402
from harness import LocalCluster, running_cluster, wait_until  # noqa: E402

TRAINING_RE = re.compile(r"^training at step (\d+) with (\d+) replicas$", re.MULTILINE)
MODES = ("elastic", "by-hand")


def spec(folder: Path, count: str, name: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(textwrap.dedent(f"""
        name = "{name}"
        strategy = "multi_worker_mirrored"
        workdir = "{ROOT / 'examples'}"
        checkpoint_dir = "{folder / 'ckpt'}"
        command = ["{sys.executable}", "mwms_preemption.py"]
        env = {{ EPOCHS = "200", STEP_PAUSE_SECONDS = "0.05" }}
        [preemption]
        signal = "SIGUSR1"
        grace_seconds = 30
        [roles.worker]
        count = {count}
        gpus = 1
        [elastic]
        resize_interval_seconds = 1
    """))
    path.chmod(0o644)
    return path


def open_to_all(directory: Path) -> None:
    """What the user does by hand before the new job can write where the stopped one saved: each job's tasks run
    under a UID of their own (or the agents would run with --task-user owner)."""
    for root, dirs, files in os.walk(directory):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chmod(name, 0o777 if os.path.isdir(name) else 0o666)


def training(cluster: LocalCluster, job_id: str, attempt: int) -> tuple[int, int] | None:
    """(step, replicas) of the chief's first trained step in that attempt; None before it."""
    log = cluster.cli("logs", job_id, "worker:0", "--attempt", str(attempt)).stdout
    found = TRAINING_RE.search(log)
    return (int(found[1]), int(found[2])) if found else None


def one_round(cluster: LocalCluster, folder: Path, mode: str, after: float) -> dict:
    folder.mkdir(parents=True)
    folder.chmod(0o777)  # the job's tasks run as a UID of their own and make their checkpoint dir here
    holder = hold_gpu(cluster, folder, "c")
    first = cluster.cli("start", str(spec(folder, '"2..3"' if mode == "elastic" else "2", mode)),
                        check=True).stdout.strip()
    wait_until(lambda: training(cluster, first, 1), 300, interval=0.3, what="training at 2 workers")
    time.sleep(after)
    freed = time.monotonic()
    cluster.cli("stop", holder, check=True)
    if mode == "elastic":
        job, attempt = first, 2
    else:
        cluster.cli("stop", first, check=True)  # waits until every task exited, having saved
        open_to_all(folder / "ckpt")  # the new job runs under a UID of its own (counted: it is part of the chore)
        job, attempt = cluster.cli("start", str(spec(folder, "3", "by-hand-3")), check=True).stdout.strip(), 1
    try:
        step, replicas = wait_until(lambda: training(cluster, job, attempt), 300, interval=0.1,
                                    what="training at 3 workers")
    except AssertionError:
        state = cluster.job(job)
        raise SystemExit(f"{mode}: {job} never trained at 3 workers: {state['state']}: {state['message']}\n"
                         + cluster.cli("logs", job, "worker:0").stdout[-3000:]) from None
    seconds = time.monotonic() - freed
    for running in {first, job}:
        cluster.cli("stop", running, "--now", check=True)
    return {"mode": mode, "seconds": round(seconds, 2), "resumed_at_step": step, "replicas": replicas}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each mode, alternating")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--after", type=float, default=5.0, help="seconds of training at 2 before the GPU frees")
    args = parser.parse_args()
    results = []
    # Not under /tmp: each job sees a /tmp of its own, and its checkpoint dir must be the same path for all.
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-", dir="/var/tmp") as root:
        Path(root).chmod(0o755)
        with running_cluster(Path(root), {name: {"gpus": 1} for name in ("a", "b", "c")}) as cluster:
            for round_ in range(args.rounds):
                for mode in args.modes:
                    results.append(one_round(cluster, Path(root) / f"{mode}-{round_}", mode, args.after))
                    print(results[-1], flush=True)
    medians = {}
    for mode in args.modes:
        values = [r["seconds"] for r in results if r["mode"] == mode]
        medians[mode] = statistics.median(values)
        print(f"{mode:8} freed -> training at 3: min {min(values):6.2f} s  median {medians[mode]:6.2f} s  "
              f"({len(values)} rounds)")
    if len(medians) == 2:
        print(f"elastic / by hand (medians): {medians['elastic'] / medians['by-hand']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
