"""End to end with real TensorFlow: a 2-worker MultiWorkerMirroredStrategy job whose program imports Keras 3
(`import keras`, what it is since TF 2.16) before asking tfcluster for its strategy. tfcluster.task's guard makes
each worker exit with code 78 and a line naming the fix, before any collective starts; the coordinator fails the
job at once, its restart budget untouched, and status shows that line."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest

from harness import running_cluster

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra"),
              pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="needs Keras 3 installed")]

PROGRAM = """
import keras  # Keras 3, not tf-keras: does not work with MultiWorkerMirroredStrategy

from tfcluster import task

strategy = task.make_strategy()
print("training with Keras", keras.__version__, flush=True)
"""


def test_an_mwms_program_importing_keras_3_fails_at_once_naming_the_fix_without_a_restart(tmp_path_factory, tmp_path):
    (tmp_path / "train.py").write_text(PROGRAM)
    spec = tmp_path / "keras3.toml"
    spec.write_text(textwrap.dedent(f"""
        name = "keras3"
        strategy = "multi_worker_mirrored"
        workdir = "{tmp_path}"
        command = ["{sys.executable}", "train.py"]
        [restart]
        max_restarts = 3
        backoff_seconds = 0
        [roles.worker]
        count = 2
    """))
    with running_cluster(tmp_path_factory.mktemp("keras3"), {"a": {}, "b": {}}) as cluster:
        job_id = cluster.cli("start", str(spec), check=True).stdout.strip()
        job = cluster.wait_job(job_id, timeout=120)
        table = cluster.cli("status", job_id, check=True).stdout

    failure = job["last_failure"]
    assert (job["state"], job["restarts"]) == ("FAILED", 0), (job["state"], job["restarts"], job["message"])
    assert failure["exit_code"] == 78 and "not restarted" in job["message"], (failure, job["message"])
    guard = failure["log_tail"][-1]
    assert guard.startswith("tfcluster: this program imported keras 3.") and "multi_worker_mirrored" in guard, guard
    assert "Fix: pip install tf-keras and keep TF_USE_LEGACY_KERAS=1" in guard, guard
    assert guard in table
    assert all(t["attempt"] == 1 for t in job["tasks"]), job["tasks"]
