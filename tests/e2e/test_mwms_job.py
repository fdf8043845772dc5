"""End to end: a real 2-worker MultiWorkerMirroredStrategy tf-keras job, submitted through the CLI."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap

import pytest

from harness import job_processes

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")]


def test_two_worker_mwms_keras_job_succeeds(make_cluster, tmp_path):
    cluster = make_cluster()
    cluster.start_agent("a", gpus=1, wait=False)
    cluster.start_agent("b", gpus=1)
    checkpoints = tmp_path / "ckpt"
    spec = tmp_path / "digits.toml"
    spec.write_text(textwrap.dedent(f"""
        name = "digits"
        strategy = "multi_worker_mirrored"
        command = ["{sys.executable}", "-m", "tfcluster.demo.train_digits"]
        checkpoint_dir = "{checkpoints}"
        env = {{ EPOCHS = "3" }}
        [roles.worker]
        count = 2
        gpus = 1
        [restart]
        max_restarts = 0
    """))
    result = cluster.cli("start", str(spec), "--wait", timeout=300)
    job_id = result.stdout.strip()
    job = cluster.job(job_id)
    logs = {t["index"]: cluster.cli("logs", job_id, f"worker:{t['index']}").stdout for t in job["tasks"]}
    assert result.returncode == 0, f"{job}\n{logs}"
    assert job["state"] == "SUCCEEDED"
    assert {t["node"] for t in job["tasks"]} == {"a", "b"}, "one worker per node"
    metrics = json.loads((checkpoints / "metrics.json").read_text())
    assert metrics["replicas"] == 2, "both workers trained in one synchronous group"
    assert metrics["accuracy"] > 0.8
    for index, text in logs.items():
        assert "Epoch 3/3" in text
        assert f"worker:{index} held-out loss" in text
    assert job_processes(job_id) == []
