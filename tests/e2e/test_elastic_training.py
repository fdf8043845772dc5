"""End to end: an elastic tf-keras MultiWorkerMirroredStrategy job (`count = "2..3"`) with BackupAndRestore
starts at 2 workers while another job holds the third GPU, grows to 3 once that job stops and resumes at 3 from
the epoch after the last one it backed up at 2, shrinks back to 2 when the third node is lost and resumes again
after its last backup; it ends SUCCEEDED with every epoch trained, no restart charged."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import textwrap

import pytest

from gpuholder import hold_gpu
from harness import finish, wait_until

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")]

EPOCHS = 8


def epochs_saved(log: str) -> list[int]:
    """The epochs the chief said it saved (the demo's SaveEveryEpoch, just before BackupAndRestore's backup)."""
    return [int(n) for n in re.findall(r"^saved .* \(epoch (\d+)\)$", log, re.MULTILINE)]


def epochs_begun(log: str) -> list[int]:
    return [int(n) for n in re.findall(rf"^Epoch (\d+)/{EPOCHS}$", log, re.MULTILINE)]


def test_elastic_keras_job_grows_then_shrinks_and_resumes_each_time_after_its_last_backup(make_cluster, tmp_path):
    cluster = make_cluster()
    cluster.start_agents({name: {"gpus": 1} for name in ("a", "b", "c")})
    blocker = hold_gpu(cluster, tmp_path, "c")

    checkpoints = tmp_path / "ckpt"
    spec = tmp_path / "elastic.toml"
    # tf-keras MWMS workers swallow SIGTERM: the grow's stop ends them at the grace's SIGKILL, mostly during the
    # pause after an epoch, and BackupAndRestore resumes after the last epoch it backed up.
    spec.write_text(textwrap.dedent(f"""
        name = "elastic-digits"
        strategy = "multi_worker_mirrored"
        command = ["{sys.executable}", "-m", "tfcluster.demo.train_digits"]
        checkpoint_dir = "{checkpoints}"
        env = {{ EPOCHS = "{EPOCHS}", EPOCH_PAUSE_SECONDS = "3" }}
        stop_grace_seconds = 1
        [roles.worker]
        count = "2..3"
        gpus = 1
        [restart]
        max_restarts = 0
        [elastic]
        resize_interval_seconds = 1
    """))
    job_id = cluster.cli("start", str(spec), check=True).stdout.strip()
    assert cluster.job(job_id)["workers"]["current"] == 2

    def chief_log(attempt: int = 0) -> str:
        return cluster.cli("logs", job_id, "worker:0", *(["--attempt", str(attempt)] if attempt else [])).stdout

    wait_until(lambda: 2 in epochs_saved(chief_log()), 180, interval=0.5, what="two epochs trained at 2 workers")
    cluster.cli("stop", blocker, check=True)

    wait_until(lambda: epochs_saved(chief_log(2)), 180, interval=0.5, what="an epoch trained at 3 workers")
    cluster.lose_node("c")  # its agent and its worker killed -9: the group shrinks to 2, uncharged

    job = finish(cluster, job_id, timeout=300)
    assert job["workers"] == {"min": 2, "max": 3, "current": 2, "resizes": 2}
    assert job["restarts"] == 0 and job["preemptions"] == 0
    assert {t["node"] for t in job["tasks"]} == {"a", "b"}
    runs = [chief_log(attempt) for attempt in (1, 2, 3)]  # at 2, at 3, at 2 again
    repeated = []
    for before, after in zip(runs, runs[1:]):
        last, resumed = max(epochs_saved(before)), epochs_begun(after)[0]
        # The epoch after the last one backed up. A stop that lands between an epoch's checkpoint and its backup
        # (SaveEveryEpoch's docstring) makes the next run train that one epoch again, and nothing earlier.
        assert resumed in (last + 1, last), f"resumed at epoch {resumed} after saving {last}:\n{after}"
        repeated += [last] if resumed == last else []
    saved = [epoch for run in runs for epoch in epochs_saved(run)]
    assert sorted(saved) == sorted(list(range(1, EPOCHS + 1)) + repeated), f"an epoch lost or trained twice: {saved}"
    metrics = json.loads((checkpoints / "metrics.json").read_text())
    assert metrics["replicas"] == 2, "it finished training with the 2 workers left, in one synchronous group"
