"""End to end: a Keras job reading its input through the tf.data service (examples/data_service_fit.py) on three
agents: the dispatcher beside training on one, a data worker on each of the others. One data worker's process
group is killed mid-training; it is restarted alone while training runs on, and the job ends SUCCEEDED with
training never restarted and every epoch trained."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import sys
import textwrap

import pytest

from harness import ROOT, finish, wait_until

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")]

EPOCHS = 5
# Long enough that the restarted data worker (TensorFlow's import alone takes seconds on a loaded machine) serves
# while training still runs: with 2 s, training once ended first and the worker was stopped before it served.
EPOCH_PAUSE_SECONDS = 5


def task_of(job: dict, key: str) -> dict:
    return next(t for t in job["tasks"] if f"{t['type']}:{t['index']}" == key)


def test_a_data_worker_killed_mid_training_restarts_alone_and_training_succeeds(make_cluster, tmp_path):
    cluster = make_cluster()
    cluster.start_agents({name: {} for name in ("a", "b", "c")})
    spec = tmp_path / "data_service.toml"
    spec.write_text(textwrap.dedent(f"""
        name = "data-service"
        strategy = "mirrored"
        workdir = "{ROOT / 'examples'}"
        command = ["{sys.executable}", "data_service_fit.py"]
        env = {{ EPOCHS = "{EPOCHS}", EPOCH_PAUSE_SECONDS = "{EPOCH_PAUSE_SECONDS}" }}
        stop_grace_seconds = 2
        [roles.worker]
        nodes = ["a"]
        [roles.dispatcher]
        nodes = ["a"]
        [roles.data_worker]
        count = 2
        nodes = ["b", "c"]
        [restart]
        max_restarts = 0
    """))
    job_id = cluster.cli("start", str(spec), check=True).stdout.strip()

    def log(key: str, attempt: int = 0) -> str:
        return cluster.cli("logs", job_id, key, *(["--attempt", str(attempt)] if attempt else [])).stdout

    wait_until(lambda: "(epoch 1)" in log("worker:0"), 180, interval=0.5, what="one epoch trained")
    victim = task_of(cluster.job(job_id), "data_worker:1")
    assert victim["node"] == "c" and victim["attempt"] == 1 and victim["tf_config"] == ""
    os.killpg(victim["pid"], signal.SIGKILL)

    def restarted() -> bool:
        job = cluster.job(job_id)
        again = task_of(job, "data_worker:1")
        return again["attempt"] == 2 and again["state"] == "RUNNING" and job["state"] == "RUNNING"
    wait_until(restarted, 60, interval=0.5, what="the data worker restarted alone")
    wait_until(lambda: "serving" in log("data_worker:1", 2), 60, interval=0.5, what="the restarted data worker to serve")
    assert task_of(cluster.job(job_id), "worker:0")["attempt"] == 1, "training was not restarted"

    job = finish(cluster, job_id, timeout=240)
    assert job["restarts"] == 0 and task_of(job, "worker:0")["attempt"] == 1
    assert {t["state"] for t in job["tasks"] if t["type"] != "worker"} == {"STOPPED"}, job["tasks"]
    saved = [int(n) for n in re.findall(r"\(epoch (\d+)\)", log("worker:0"))]
    assert saved == list(range(1, EPOCHS + 1))
    assert "journal in" in log("dispatcher:0") and "serving" in log("data_worker:1", 2)
