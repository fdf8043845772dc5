"""Sweeps on a real coordinator and agent over mutual TLS: `tfcluster sweep start` runs a grid of four trials, never
more than max_concurrent at once, each a job with its parameters in its environment and command, each reporting an
evaluation through its events file; the coordinator is killed and started again on its state dir mid-sweep and the
sweep carries on; `sweep status` is sorted by the metric; `sweep stop` stops the running trials and starts no more;
another user may not see the sweep."""

from __future__ import annotations

import json
import time

import pytest

from harness import LocalCluster, job_processes, wait_until
from sweeptrials import early_stopping_file, sweep_file
from tfcluster import Cluster, PermissionDenied, Sweep
from tfcluster.states import ENDED_JOB_STATES

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = LocalCluster(root=tmp_path_factory.mktemp("sweeps"))
    try:
        cluster.start_coordinator()
        cluster.start_agents({"a": {}, "b": {}})
        yield cluster
    finally:
        cluster.teardown()


def live_trials(c: Cluster, sweep_id: str) -> list:
    return [j for j in c.jobs() if j.sweep == sweep_id and j.state not in ENDED_JOB_STATES]


def test_a_grid_sweep_runs_two_at_a_time_survives_a_coordinator_restart_and_is_sorted_by_its_metric(
        cluster, tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    sweep_id = cluster.cli("sweep", "start", str(sweep_file(tmp_path, "grid", 6, "[10, 30]")), check=True,
                           env=env).stdout.strip()
    most, restarted = 0, False
    with Cluster(cluster.address, cluster.admin_dir) as c:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            live = live_trials(c, sweep_id)
            most = max(most, len(live))
            if not restarted and any(j.state == "RUNNING" for j in live):
                cluster.coordinator.kill()  # kill -9 mid-sweep; the same state dir
                cluster.start_coordinator()
                restarted = True
                continue
            if Sweep(c, sweep_id).status().state != "RUNNING" and not live:
                break
            time.sleep(0.2)
        assert restarted
        ended = Sweep(c, sweep_id).wait(timeout=60)
        trial_jobs = {t.job_id: c.job(t.job_id).status() for t in ended.trials}
    assert most == 2, f"at most max_concurrent trials live at once, and two did run together (saw {most})"
    assert ended.state == "SUCCEEDED" and [t.state for t in ended.trials] == ["SUCCEEDED"] * 4, ended
    assert len(trial_jobs) == 4, "each trial submitted once, the restart notwithstanding"
    assert {j.sweep for j in trial_jobs.values()} == {sweep_id}
    assert sorted((j.sweep_parameters["A"], j.sweep_parameters["B"]) for j in trial_jobs.values()) == \
        [("1", "10"), ("1", "30"), ("2", "10"), ("2", "30")]
    shown = cluster.cli("sweep", "status", sweep_id, check=True).stdout.splitlines()
    rows = [line.split() for line in shown[2:]]
    assert [(r[1], r[2], r[4]) for r in rows] == [("2", "30", "0.6"), ("1", "30", "0.3"), ("2", "10", "0.2"),
                                                  ("1", "10", "0.1")], shown
    doc = json.loads(cluster.cli("sweep", "status", sweep_id, "--json", check=True).stdout)
    assert [t["best"] for t in doc["trials"]] == [0.6, 0.3, 0.2, 0.1] and doc["state"] == "SUCCEEDED"
    job = json.loads(cluster.cli("status", doc["trials"][0]["job"], "--json", check=True).stdout)["jobs"][0]
    assert (job["sweep"], job["sweep_parameters"]) == (sweep_id, {"A": "2", "B": "30"})


def test_sweep_stop_stops_the_running_trials_and_starts_no_more_and_others_may_not_see_it(cluster, tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    sweep_id = cluster.cli("sweep", "start", str(sweep_file(tmp_path, "long", 300, "[10, 30]")), check=True,
                           env=env).stdout.strip()
    with Cluster(cluster.address, cluster.admin_dir) as c:
        wait_until(lambda: [j.state for j in live_trials(c, sweep_id)] == ["RUNNING", "RUNNING"], 60,
                   what="both trials to run")
        running = [j.id for j in live_trials(c, sweep_id)]
        bob = cluster.root / "people" / "bob"
        cluster.cli("ca", "issue", "--dir", str(cluster.ca_dir), "--role", "user", "--name", "bob", "--out",
                    str(bob), check=True)
        with Cluster(cluster.address, bob) as as_bob:
            for refused in (lambda: Sweep(as_bob, sweep_id).status(), lambda: Sweep(as_bob, sweep_id).stop()):
                with pytest.raises(PermissionDenied, match=f"sweep {sweep_id} belongs to admin"):
                    refused()
            assert as_bob.sweeps() == []
        stopped = cluster.cli("sweep", "stop", sweep_id, check=True)
        assert "STOPPED" in stopped.stdout
        ended = Sweep(c, sweep_id).wait(timeout=60)
    assert ended.state == "STOPPED"
    assert [t.state for t in ended.trials] == ["STOPPED", "STOPPED", "", ""], "no trial started after the stop"
    for job_id in running:
        assert job_processes(job_id) == [], f"{job_id}'s processes are gone"


@pytest.mark.parametrize("rule, says", [
    ('early_stopping = "median"', "was below the median of the other trials' at the same step"),
    ('early_stopping = "asha"\ngrace_steps = 200\nreduction_factor = 2', "was not in the best 1/2 of the"),
])
def test_a_grid_of_six_trials_stops_the_poor_ones_early_and_ends_sorted_by_its_metric(cluster, tmp_path, rule, says):
    """Trials in table order, two at a time: the two good ones first, then poor ones the rule stops early."""
    name = "median" if "median" in rule else "asha"
    spec = early_stopping_file(tmp_path, name, rule, "[9, 8, 1, 7, 2, 3]")
    sweep_id = cluster.cli("sweep", "start", str(spec), check=True,
                           env={"XDG_CACHE_HOME": str(tmp_path / "cache")}).stdout.strip()
    with Cluster(cluster.address, cluster.admin_dir) as c:
        ended = Sweep(c, sweep_id).wait(timeout=180, poll_seconds=0.5)
        messages = {t.job_id: c.job(t.job_id).status().message for t in ended.trials}
    assert ended.state == "SUCCEEDED" and len(ended.trials) == 6, ended
    stopped = [t for t in ended.trials if t.stopped_early]
    assert stopped, "a poor trial was stopped by the rule"
    assert all(t.state == "STOPPED" and says in messages[t.job_id] for t in stopped), messages
    assert all(t.state == "SUCCEEDED" for t in ended.trials if not t.stopped_early)
    assert next(t for t in ended.trials if t.parameters["Q"] == "1").stopped_early, "the poorest is stopped"
    best = [t.best for t in ended.ranked()]
    assert best == sorted(best, reverse=True) and best[0] == pytest.approx(0.9), best
    rows = [line.split() for line in cluster.cli("sweep", "status", sweep_id, check=True).stdout.splitlines()[2:]]
    assert [float(r[3]) for r in rows] == pytest.approx(best, rel=1e-5), rows  # job, Q, state, best, ...
