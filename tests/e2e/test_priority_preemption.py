"""End to end with real TensorFlow: a job of a high priority class preempts a running MultiWorkerMirroredStrategy
tf-keras job of a low, preemptible class (examples/mwms_fit.py, BackupAndRestore). The preemptor runs within the
victim's grace + 2 s; the victim waits in the queue, uncharged, says who preempted it, resumes from its backup
once the preemptor is done, and ends with the same final checkpoint (epoch and step) as an undisturbed run.
The classes come from the coordinator's policy file (`--policy`)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from harness import ROOT, LocalCluster, final_checkpoint, finish, wait_until
from preemptions import cluster, preemptor_spec  # noqa: F401  (cluster: the fixture)

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")]

EXAMPLES = ROOT / "examples"
GRACE_SECONDS = 10


def low_spec(tmp_path: Path) -> tuple[Path, Path]:
    """examples/mwms_fit.toml, one GPU per worker (both nodes' GPUs), its checkpoints under tmp_path."""
    checkpoints = tmp_path / "ckpt"
    text = (EXAMPLES / "mwms_fit.toml").read_text()
    text = f'checkpoint_dir = "{checkpoints}"\n' + text
    text = text.replace('env = { EPOCHS = "4" }', 'env = { EPOCHS = "6", EPOCH_PAUSE_SECONDS = "1.5" }')
    text = text.replace("count = 2\ngpus = 0", "count = 2\ngpus = 1")
    assert str(checkpoints) in text and "EPOCH_PAUSE_SECONDS" in text and "gpus = 1" in text
    tmp_path.mkdir(exist_ok=True)
    tmp_path.chmod(0o777)  # the job's tasks run as a UID of its own, and make their checkpoint dir here
    spec = tmp_path / "low.toml"
    spec.write_text(f'workdir = "{EXAMPLES}"\npriority = "low"\nstop_grace_seconds = {GRACE_SECONDS}\n{text}')
    return spec, checkpoints


def submit(cluster: LocalCluster, spec: Path) -> str:
    return cluster.cli("start", str(spec), check=True).stdout.strip()


def test_a_high_job_preempts_a_low_mwms_job_which_resumes_and_ends_as_if_undisturbed(cluster, tmp_path):
    spec, _ = low_spec(tmp_path / "undisturbed")
    expected = final_checkpoint(finish(cluster, submit(cluster, spec)))

    spec, checkpoints = low_spec(tmp_path / "preempted")
    low_id = submit(cluster, spec)
    wait_until(lambda: (checkpoints / "ckpt-2.index").exists(), 240, interval=0.2, what="checkpoint 2")
    high_id = submit(cluster, preemptor_spec(tmp_path, seconds=10))  # long enough to read low while it waits
    wait_until(lambda: cluster.job(high_id)["state"] in ("RUNNING", "SUCCEEDED"), GRACE_SECONDS + 30, interval=0.2,
               what=f"{high_id} to run")
    took = time.time() - cluster.job(high_id)["created"]  # from its submission, not from the CLI's start
    low = cluster.job(low_id)
    print(f"preemptor RUNNING {took:.1f} s after its submission (grace {GRACE_SECONDS} s); the preempted tasks "
          f"ended: {[(t['type'], t['index'], t['state'], t['exit_code'], t['signal']) for t in low['tasks']]}")
    assert took <= GRACE_SECONDS + 2, took
    assert low["state"] in ("STOPPING", "PENDING") and low["preempted_by"] == high_id, low
    assert low["message"].startswith(f"preempted by admin's job {high_id} at "), low["message"]
    assert low["restarts"] == 0 and low["preemptions"] == 1
    assert finish(cluster, high_id)["preemptions"] == 0

    low = finish(cluster, low_id)
    assert low["restarts"] == 0 and low["preemptions"] == 1 and low["preempted_by"] == high_id
    assert all(t["attempt"] == 2 for t in low["tasks"] if t["type"] == "worker"), low["tasks"]
    history = [(e["checkpoint"].rsplit("/", 1)[-1], e["step"]) for e in low["evaluation"]["history"]]
    assert final_checkpoint(low) == expected, (low["message"], history, low["tasks"])
