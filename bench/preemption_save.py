"""The preemptor's wait, and the steps a preempted MultiWorkerMirroredStrategy job loses, with the save-first stop
signal and without it.

Two agents with one (pretend) GPU each; a low-class 2-worker tf-keras MWMS job is preempted by a high-class job
that needs one GPU once the victim has trained for `--after` seconds past its first epoch. Both programs pause
0.05 s after each step, so they train at the same pace. Modes (tests/preemptions.py):

  save-first  examples/mwms_preemption.py (task.preemption_handler) with [preemption] signal = "SIGUSR1": the
              workers save at the next step and exit 42; the preemptor starts as soon as they are gone; the
              victim resumes at the saved step.
  plain       examples/mwms_fit.py (Keras fit, BackupAndRestore each epoch) with the default SIGTERM, which
              TensorFlow's MWMS runtime swallows: the workers train on until SIGKILL at the end of the grace
              and resume from their last epoch backup.

Rounds alternate the modes. Per round: seconds from the preemptor's submission to its RUNNING state, the last
step the victim trained before it stopped, the step its second attempt resumed from, and the difference (steps
lost). The victim is stopped (--now) once it has resumed. Then min and median per mode.

    .venv/bin/python bench/preemption_save.py [--rounds 3] [--grace 20] [--after 10] [--modes save-first plain]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from harness import LocalCluster, wait_until  # noqa: E402
from preemptions import VICTIMS, preemption_cluster, preemptor_spec, victim_spec  # noqa: E402

FIRST_EPOCH_RE = re.compile(r"epoch 1/|Epoch 2/", re.I)
# The last step trained: mwms_preemption.py says where it saved; mwms_fit.py (paced) says each step it trained.
TRAINED_RE = re.compile(r"preemption checkpoint saved at step (\d+)|trained step (\d+)")
# Where attempt 2 starts: mwms_preemption.py says the step it resumed at; mwms_fit.py's first step after its
# backup was restored is that step + 1.
RESUMED_RE = re.compile(r"resumed at step (\d+)|trained step (\d+)")
MEASURES = ("preemptor_wait_s", "steps_lost")


def steps(pattern: re.Pattern, text: str) -> list[int]:
    return [int(a or b) for a, b in pattern.findall(text)]


def preempt_once(cluster: LocalCluster, folder: Path, mode: str, args) -> dict:
    """Runs the victim for `after` seconds once its first epoch ended, preempts it, waits until it resumed."""
    victim = cluster.cli("start", str(victim_spec(folder, mode, args.grace, args.epochs)), check=True).stdout.strip()

    def log(attempt: int) -> str:
        return cluster.cli("logs", victim, "worker:0", "--attempt", str(attempt)).stdout

    wait_until(lambda: FIRST_EPOCH_RE.search(log(1)), 300, interval=0.3, what="the first epoch")
    time.sleep(args.after)
    submitted = time.monotonic()
    preemptor = cluster.cli("start", str(preemptor_spec(folder)), check=True).stdout.strip()
    wait_until(lambda: cluster.job(preemptor)["state"] in ("RUNNING", "SUCCEEDED"), args.grace + 60, interval=0.1,
               what="the preemptor to run")
    waited = time.monotonic() - submitted
    wait_until(lambda: steps(RESUMED_RE, log(2)), 300, interval=0.5, what="the victim to resume")
    trained = steps(TRAINED_RE, log(1))[-1]
    resumed = steps(RESUMED_RE, log(2))[0] - (mode == "plain")
    job = cluster.job(victim)
    cluster.cli("stop", victim, "--now", check=True)
    cluster.wait_job(victim, timeout=60)
    return {"mode": mode, "preemptor_wait_s": round(waited, 1), "grace_s": args.grace, "trained_to": trained,
            "resumed_at": resumed, "steps_lost": trained - resumed, "restarts": job["restarts"],
            "preemptions": job["preemptions"]}


def summary(results: list[dict]) -> list[str]:
    lines = []
    for mode in dict.fromkeys(r["mode"] for r in results):
        for measure in MEASURES:
            values = [r[measure] for r in results if r["mode"] == mode]
            lines.append(f"{mode:10} {measure:16} min {min(values):6.1f}  median {statistics.median(values):6.1f}  "
                         f"({len(values)} rounds)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each mode, alternating")
    parser.add_argument("--grace", type=float, default=20.0)
    parser.add_argument("--after", type=float, default=10.0, help="seconds of training after the first epoch")
    parser.add_argument("--epochs", type=int, default=40, help="more than are trained before the victim is stopped")
    parser.add_argument("--modes", nargs="+", default=list(VICTIMS), choices=list(VICTIMS))
    args = parser.parse_args()
    results = []
    # Not under /tmp: each job sees a /tmp of its own, and its checkpoint dir must be the same path for all.
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-", dir="/var/tmp") as root:
        Path(root).chmod(0o755)
        with preemption_cluster(Path(root)) as cluster:
            for round_ in range(args.rounds):
                for mode in args.modes:
                    results.append(preempt_once(cluster, Path(root) / f"{mode}-{round_}", mode, args))
                    print(results[-1], flush=True)
    print("\n".join(summary(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
