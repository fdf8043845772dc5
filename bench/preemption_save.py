"""The preemptor's wait, and where a preempted MultiWorkerMirroredStrategy job resumes, with the save-first stop
signal and without it.

Two agents with one (pretend) GPU each; a low-class 2-worker tf-keras MWMS job is preempted by a high-class job
that needs one GPU once the victim has trained for `--after` seconds. Modes:

  save-first  examples/mwms_preemption.py (task.preemption_handler) with [preemption] signal = "SIGUSR1": the
              workers save at the next step and exit 42; the preemptor starts as soon as they are gone; the
              victim resumes at the saved step.
  plain       examples/mwms_fit.py (Keras fit, BackupAndRestore each epoch) with the default SIGTERM, which
              TensorFlow's MWMS runtime swallows: the workers train on until SIGKILL at the end of the grace
              and resume from their last epoch backup.

Printed per mode: seconds from the preemptor's submission to its RUNNING state, the victim's message, the step
it reported saving (save-first) and the step or epoch its second attempt resumed from.

    .venv/bin/python bench/preemption_save.py [--grace 20] [--after 15] [--modes save-first plain]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from harness import LocalCluster, wait_until  # noqa: E402

POLICY = """
[classes]
low = { value = 10, preemptible = true }
high = { value = 100, preemptible = false }

[defaults]
class = "low"
max_class = "high"
"""
RESUMED_RE = re.compile(r"resumed at step (\d+)|Epoch (\d+)/")


def victim_spec(folder: Path, mode: str, grace: float, epochs: int) -> Path:
    """The mode's example program on both nodes' GPUs, its checkpoints under folder."""
    program, stop_signal = ("mwms_preemption.py", "SIGUSR1") if mode == "save-first" else ("mwms_fit.py", "SIGTERM")
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o777)  # the job's tasks run as a UID of their own and make their checkpoint dir here
    spec = folder / "victim.toml"
    spec.write_text(textwrap.dedent(f"""
        name = "victim"
        strategy = "multi_worker_mirrored"
        priority = "low"
        workdir = "{ROOT / 'examples'}"
        checkpoint_dir = "{folder / 'ckpt'}"
        command = ["{sys.executable}", "{program}"]
        env = {{ EPOCHS = "{epochs}", STEP_PAUSE_SECONDS = "0.05", EPOCH_PAUSE_SECONDS = "1" }}
        [preemption]
        signal = "{stop_signal}"
        grace_seconds = {grace}
        [roles.worker]
        count = 2
        gpus = 1
    """))
    return spec


def preemptor_spec(folder: Path) -> Path:
    spec = folder / "preemptor.toml"
    spec.write_text(textwrap.dedent(f"""
        name = "urgent"
        strategy = "mirrored"
        priority = "high"
        command = ["{sys.executable}", "-c", "import time; time.sleep(2)"]
        [roles.worker]
        gpus = 1
    """))
    return spec


def preempt_once(cluster: LocalCluster, folder: Path, mode: str, grace: float, after: float, epochs: int) -> dict:
    """Runs the victim for `after` seconds once its first epoch ended, preempts it, lets both finish."""
    victim = cluster.cli("start", str(victim_spec(folder, mode, grace, epochs)), check=True).stdout.strip()

    def log(attempt: int) -> str:
        return cluster.cli("logs", victim, "worker:0", "--attempt", str(attempt)).stdout

    wait_until(lambda: re.search(r"epoch 1/|Epoch 2/", log(1), re.I), 300, interval=0.3, what="the first epoch")
    time.sleep(after)
    submitted = time.monotonic()
    preemptor = cluster.cli("start", str(preemptor_spec(folder)), check=True).stdout.strip()
    wait_until(lambda: cluster.job(preemptor)["state"] in ("RUNNING", "SUCCEEDED"), grace + 60, interval=0.1,
               what="the preemptor to run")
    waited = time.monotonic() - submitted
    done = cluster.wait_job(victim, timeout=600)
    resumed = RESUMED_RE.search(log(2))
    where = "" if resumed is None else f"step {resumed.group(1)}" if resumed.group(1) else f"epoch {resumed.group(2)}"
    first = [line for line in log(1).splitlines() if "saved at step" in line or line.startswith("Epoch ")]
    return {"mode": mode, "preemptor_wait_s": round(waited, 1), "grace_s": grace, "victim": done["state"],
            "stopped_after": first[-1] if first else "", "resumed_at": where,
            "restarts": done["restarts"], "preemptions": done["preemptions"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grace", type=float, default=20.0)
    parser.add_argument("--after", type=float, default=15.0, help="seconds of training after the first epoch")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--modes", nargs="+", default=["save-first", "plain"], choices=["save-first", "plain"])
    args = parser.parse_args()
    # Not under /tmp: each job sees a /tmp of its own, and its checkpoint dir must be the same path for all.
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-", dir="/var/tmp") as root:
        cluster = LocalCluster(root=Path(root))
        try:
            (Path(root) / "policy.toml").write_text(POLICY)
            cluster.start_coordinator("--policy", str(Path(root) / "policy.toml"))
            cluster.start_agents({"a": {"gpus": 1}, "b": {"gpus": 1}})
            for mode in args.modes:
                print(preempt_once(cluster, Path(root) / mode, mode, args.grace, args.after, args.epochs),
                      flush=True)
        finally:
            cluster.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
