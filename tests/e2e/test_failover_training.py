"""End to end: kill -9 of the leading coordinator while a real 2-worker MultiWorkerMirroredStrategy tf-keras job
trains. A standby serves within 5 s, both agents register with it within 10 s, and the job trains on untouched:
it succeeds with no restart, each worker launched once, every epoch run and the accuracy reached."""

from __future__ import annotations

import importlib.util
import json
import sys
import time

import pytest

from etcdcluster import needs_etcd
from hacluster import registrations
from harness import job_processes, wait_until

pytestmark = [pytest.mark.e2e, needs_etcd,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")]

EPOCHS = 4
# Each epoch is a fraction of a second of training here: the pause after each keeps the job training for
# longer than a failover takes, so the kill lands mid-training and the agents come back before the last epoch.
EPOCH_PAUSE_SECONDS = 2


def test_kill_9_of_the_leader_while_a_keras_job_trains(ha, tmp_path):
    ha.start_agents({"a": {"gpus": 1}, "b": {"gpus": 1}})
    checkpoints = tmp_path / "ckpt"
    job_id = ha.cli("start", "--name", "digits", "--strategy", "multi_worker_mirrored", "--workers", "2",
                    "--gpus-per-task", "1", "--checkpoint-dir", str(checkpoints), "--max-restarts", "0",
                    "--env", f"EPOCHS={EPOCHS}", "--env", f"EPOCH_PAUSE_SECONDS={EPOCH_PAUSE_SECONDS}",
                    "--", sys.executable, "-m", "tfcluster.demo.train_digits", check=True).stdout.strip()
    wait_until(lambda: list(checkpoints.rglob("ckpt-1.index")), 120, interval=0.2,
               what="the first epoch's checkpoint")
    old, term = ha.leader(), ha.etcd.raft_term()
    ha.leading().kill()
    killed = time.monotonic()
    new = ha.new_leader(old, 5, etcd_term=term)
    served = time.monotonic() - killed
    assert not list(checkpoints.rglob(f"ckpt-{EPOCHS}.index")), "the kill came while the job was training"
    # Within 10 s of the kill (at least 5 s after the standby served, had etcd's own election held it up).
    wait_until(lambda: all(registrations(ha, n, new) for n in ("a", "b")), max(10 - served, 5),
               interval=0.1, what="both agents registered with the new leader")
    print(f"standby served after {served:.2f} s; both agents registered again after {time.monotonic() - killed:.2f} s")

    job = ha.wait_job(job_id, timeout=180)
    logs = {t["index"]: ha.cli("logs", job_id, f"worker:{t['index']}", check=True).stdout for t in job["tasks"]}
    assert job["state"] == "SUCCEEDED" and job["restarts"] == 0, f"{job}\n{logs}"
    assert sorted(t["attempt"] for t in job["tasks"]) == [1, 1], "no task was launched again"
    launched = [line for name in ("a", "b") for line in ha.agents[name].log().splitlines()
                if " running as pid " in line]
    assert len(launched) == 2, f"each worker process started once: {launched}"
    assert {t["node"] for t in job["tasks"]} == {"a", "b"}
    metrics = json.loads((checkpoints / "metrics.json").read_text())
    assert metrics["replicas"] == 2, "both workers trained in one synchronous group"
    assert metrics["accuracy"] > 0.8
    for index, text in logs.items():
        assert text.count("Epoch 1/") == 1 and f"Epoch {EPOCHS}/{EPOCHS}" in text, text
        assert f"worker:{index} held-out loss" in text
    assert job_processes(job_id) == []
