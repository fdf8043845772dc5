"""End to end: a 2-worker MultiWorkerMirroredStrategy tf-keras job whose evaluator is a SidecarEvaluator with
max_evaluations=None (examples/mwms_sidecar.py, as TensorFlow's tutorials write it). tf-keras's own never
exits: tfcluster reads its TensorBoard summaries and stops it once the final checkpoint is evaluated.
tfcluster's drop-in returns by itself. Either way the job succeeds seconds after training, not at the deadline,
and `status --json` holds the evaluation of the final checkpoint."""

from __future__ import annotations

import importlib.util
import json
import textwrap
import warnings
from pathlib import Path

import pytest

from harness import ROOT, job_processes
from tfcluster.daemon.coordinator.core.lifecycle.completion import EVALUATOR_EXIT_SECONDS

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")]

EPOCHS = 3
SUCCEEDED_AFTER_CHIEF_SECONDS = 30


@pytest.mark.parametrize("sidecar", ["tf-keras", "tfcluster"])
def test_sidecar_evaluator_ends_with_training_and_its_results_are_shown(make_cluster, tmp_path, sidecar):
    cluster = make_cluster()
    cluster.start_agents({"a": {}, "b": {}, "c": {}})
    # tf-keras's: host-local checkpoints (shipped to the evaluator's node) and a summary dir of its own;
    # the drop-in: shared checkpoints, summaries in the default <model dir>/eval.
    shared = tmp_path / "ckpt"
    summaries = tmp_path / "tensorboard"
    spec = tmp_path / "sidecar.toml"
    spec.write_text(textwrap.dedent(f"""
        name = "sidecar"
        strategy = "multi_worker_mirrored"
        command = ["python3", "mwms_sidecar.py"]
        workdir = "{ROOT / 'examples'}"
        {f'checkpoint_dir = "{shared}"' if sidecar == "tfcluster" else ""}
        env = {{ EPOCHS = "{EPOCHS}", SIDECAR = "{sidecar}" }}
        evaluator_deadline_seconds = 600
        [roles.worker]
        count = 2
        gpus = 0
        [roles.evaluator]
        gpus = 0
        {f'summary_dir = "{summaries}"' if sidecar == "tf-keras" else ""}
        [restart]
        max_restarts = 0
    """))
    result = cluster.cli("start", str(spec), "--wait", timeout=300)
    job_id = result.stdout.strip()
    job = json.loads(cluster.cli("status", job_id, "--json", check=True).stdout)["jobs"][0]
    tasks = {f"{t['type']}:{t['index']}": t for t in job["tasks"]}
    if job["state"] != "SUCCEEDED":
        logs = {key: cluster.cli("logs", job_id, key, "--tail", "30").stdout for key in tasks}
        pytest.fail(f"{job_id} ended {job['state']}: {job['message']}\n{json.dumps(logs, indent=1)}")

    chief = tasks["worker:0"]
    chief_status = cluster.agent_state_dir(chief["node"]) / "jobs" / job_id / "tasks" / "worker-0" / "attempt-1"
    chief_ended = json.loads((chief_status / "status.json").read_text())["finished"]
    assert job["finished"] - chief_ended < SUCCEEDED_AFTER_CHIEF_SECONDS, job["message"]

    final = f"ckpt-{EPOCHS}"
    latest = job["evaluation"]["latest"]
    assert latest is not None, "no evaluation reached tfcluster"
    assert Path(latest["checkpoint"]).name == final and latest["step"] > 0, latest
    assert set(latest["metrics"]) >= {"loss", "accuracy"} and latest["metrics"]["accuracy"] > 0.5, latest
    assert [Path(e["checkpoint"]).name for e in job["evaluation"]["history"]][-1] == final

    evaluator = tasks["evaluator:0"]
    if sidecar == "tf-keras":
        assert job["message"] == f"final evaluation of {final} done; stopped the evaluator"
        assert evaluator["state"] == "STOPPED" and evaluator["signal"] == 15, evaluator
        assert list(summaries.glob("validation/events.out.tfevents.*")), "SidecarEvaluator wrote no summaries"
    else:
        # The drop-in returns by itself once tfcluster says training is over and the final checkpoint is evaluated.
        # Its process then has a few seconds to exit (docs/jobs.md): unloading TensorFlow on a loaded machine
        # took longer once, and then the evaluator is stopped, its work done.
        log = cluster.cli("logs", job_id, "evaluator:0", check=True).stdout
        assert "SidecarEvaluator: training finished; the final checkpoint is evaluated" in log, log[-2000:]
        if job["message"] == "final evaluation done":
            assert evaluator["state"] == "SUCCEEDED" and evaluator["exit_code"] == 0, evaluator
        else:
            assert job["message"] == f"final evaluation of {final} done; stopped the evaluator", job["message"]
            assert evaluator["state"] == "STOPPED", evaluator
            warnings.warn(f"the drop-in SidecarEvaluator returned but its process did not exit within "
                          f"{EVALUATOR_EXIT_SECONDS:g} s: it was stopped")
        assert Path(latest["checkpoint"]) == shared / final
        assert list((shared / "eval" / "validation").glob("events.out.tfevents.*"))
    assert job_processes(job_id) == []
