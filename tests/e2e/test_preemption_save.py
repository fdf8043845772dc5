"""End to end with real TensorFlow: a high-class job preempts a 2-worker MultiWorkerMirroredStrategy job whose
custom loop saves on the job's stop signal (examples/mwms_preemption.py: task.preemption_handler, [preemption]
signal = "SIGUSR1"). Both workers save at the same step and exit 42 long before the 60 s grace; the preemptor
runs within seconds; the victim says the step it saved at, is charged nothing, and resumes at that step."""

from __future__ import annotations

import importlib.util
import re
import time
from pathlib import Path

import pytest

from harness import finish, wait_until
from preemptions import cluster, preemptor_spec, victim_spec  # noqa: F401  (cluster: the fixture)

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")]

GRACE_SECONDS = 60
# The preemptor holds its GPU this long, so that the victim is still waiting, its exits and message those of the
# preemption, when the test reads it; a 2 s preemptor could end and let the victim run again first on a slow box.
PREEMPTOR_SECONDS = 20


def test_a_preempted_mwms_job_saves_on_its_signal_frees_its_gpus_at_once_and_resumes_at_that_step(cluster, tmp_path):
    victim = cluster.cli("start", str(victim_spec(tmp_path / "victim", "save-first", GRACE_SECONDS, 4)),
                         check=True).stdout.strip()
    log = lambda attempt: cluster.cli("logs", victim, "worker:0", "--attempt", str(attempt)).stdout  # noqa: E731
    wait_until(lambda: "epoch 1/4" in cluster.task_output(victim, "worker:0"), 240, interval=0.3,
               what="the first epoch")
    submitted = time.monotonic()
    preemptor_toml = preemptor_spec(tmp_path, seconds=PREEMPTOR_SECONDS)
    preemptor = cluster.cli("start", str(preemptor_toml), check=True).stdout.strip()
    wait_until(lambda: cluster.job(preemptor)["state"] in ("RUNNING", "SUCCEEDED"), GRACE_SECONDS, interval=0.2,
               what="the preemptor to run")
    took = time.monotonic() - submitted
    wait_until(lambda: cluster.job(victim)["state"] != "STOPPING", 20, interval=0.2, what="both workers to exit")
    job = cluster.job(victim)
    print(f"preemptor RUNNING {took:.1f} s after its submission (grace {GRACE_SECONDS} s); victim: {job['message']}")
    assert took < 20, took
    assert [t["exit_code"] for t in job["tasks"]] == [42, 42], job["tasks"]
    saved = re.search(r"preempted by admin's job \S+ at \d\d:\d\d, saved at step (\d+)", job["message"])
    assert saved, job["message"]

    job = finish(cluster, victim)
    assert (job["restarts"], job["preemptions"]) == (0, 1)
    resumed = log(2)
    assert f"resumed at step {saved.group(1)}" in resumed and "epoch 4/4" in resumed, resumed
