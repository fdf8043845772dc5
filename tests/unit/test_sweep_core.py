"""Sweeps in the coordinator's pure core: a sweep submits its trials as jobs of its owner's, max_concurrent at a
time, stops a trial the median rule condemns, is stopped with its trials, and is read back from the store as it was
with its trials (a restarted or a new leader carries on)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.unit.coresim import Sim, info, launches, make_spec
from tfcluster.daemon.coordinator.core.cluster import Cluster, Unplaceable
from tfcluster.daemon.coordinator.store import migrate
from tfcluster.daemon.coordinator.store.open import open_store
from tfcluster.daemon.coordinator.store.documents import from_documents
from tfcluster.daemon.coordinator.store.records import Writer
from tfcluster.model import Evaluation
from tfcluster.states import JobState, SweepState
from tfcluster.sweepspec import SweepSpec

SWEEP = SweepSpec(method="grid", metric="accuracy", parameters={"LR": ("0.1", "0.01"), "BATCH": ("32", "64")},
                  max_concurrent=2, early_stopping="median", min_evaluations=2)


def start(sim: Sim, sweep: SweepSpec = SWEEP, gpus: int = 0, **roles):
    spec = replace(make_spec(gpus=gpus, **(roles or {"worker": 1})), command=("python", "train.py", "--lr={LR}"))
    sweep_record, actions = sim.c.start_sweep(spec, sweep, sim.now, "req-1", owner="alice", groups=("ml",))
    return sweep_record, actions


def live_trials(sim: Sim, sweep) -> list:
    return [sim.c.jobs[j] for j in sweep.jobs if not sim.c.jobs[j].ended]


def finish(sim: Sim, job) -> None:
    sim.running(job, [])
    for task in job.tasks:
        if task.state.value in ("LAUNCHING", "RUNNING"):
            if task.state.value == "LAUNCHING":
                sim.report(job, task.type, task.index, "RUNNING")
            sim.exit(job, task.key, 0)


def test_trials_are_jobs_of_the_owner_submitted_two_at_a_time_in_order():
    sim = Sim(info("n1"), info("n2"), info("n3"))
    sweep, actions = start(sim)
    assert len(sweep.jobs) == 2 and len(launches(actions)) == 2
    first = sim.c.jobs[sweep.jobs[0]]
    assert first.owner == "alice" and first.groups == ("ml",) and first.sweep == sweep.id
    assert first.sweep_parameters == {"LR": "0.1", "BATCH": "32"}
    assert first.spec.env == {"LR": "0.1", "BATCH": "32"} and first.spec.command[-1] == "--lr=0.1"
    assert sim.c.start_sweep(first.spec, SWEEP, sim.now, "req-1")[0] is sweep, "a retried start gets the same sweep"
    sim.c.tick(sim.now)
    assert len(sweep.jobs) == 2, "never more than max_concurrent live"
    finish(sim, first)
    assert first.state == JobState.SUCCEEDED
    sim.c.tick(sim.now)
    assert len(sweep.jobs) == 3 and len(live_trials(sim, sweep)) == 2
    assert sim.c.jobs[sweep.jobs[2]].sweep_parameters == {"LR": "0.01", "BATCH": "32"}
    for job_id in sweep.jobs[1:]:
        finish(sim, sim.c.jobs[job_id])
    sim.c.tick(sim.now)
    finish(sim, sim.c.jobs[sweep.jobs[3]])
    sim.c.tick(sim.now)
    assert sweep.state == SweepState.SUCCEEDED and len(sweep.jobs) == 4


def evaluate(sim: Sim, job, step: int, value: float) -> None:
    evaluator = job.evaluator()
    sim.c.evaluation(evaluator.node, job.attempt_of(evaluator), Evaluation(f"ckpt-{step}", step,
                                                                          {"accuracy": value}, sim.now), sim.now)


def test_the_median_rule_stops_a_trial_and_says_why():
    sim = Sim(info("n1"), info("n2"), info("n3"), info("n4"))
    sweep, actions = start(sim, replace(SWEEP, max_concurrent=4), worker=1, evaluator=1)
    jobs = [sim.c.jobs[j] for j in sweep.jobs]
    for job in jobs:
        sim.running(job, [a for a in actions if a.attempt.job_id == job.id])
    for job, values in zip(jobs, [(0.5, 0.7), (0.6, 0.8), (0.2, 0.3), (0.7, 0.9)]):
        for step, value in zip((100, 200), values):
            evaluate(sim, job, step, value)
    sim.c.tick(sim.now)
    assert sweep.stopped_early == (), "trials running side by side never stop one another"
    for job in jobs[:2]:
        sim.c.stop(job.id, sim.now)
        for task in job.tasks:
            sim.report(job, task.type, task.index, "EXITED", exit_code=None, signal=15)
    assert jobs[0].ended and jobs[1].ended
    sim.c.tick(sim.now)
    assert sweep.stopped_early == (jobs[2].id,), "0.3 at step 200 is below the ended trials' median (0.75)"
    assert jobs[2].state == JobState.STOPPING and "stopped early" in jobs[2].message
    rows = {r["job_id"]: r for r in sim.c.trial_rows(sweep)}
    assert rows[jobs[3].id]["best"] == 0.9 and rows[jobs[3].id]["best_step"] == 200
    assert rows[jobs[2].id]["stopped_early"]


def test_stopping_a_sweep_stops_its_live_trials_and_submits_no_more():
    sim = Sim(info("n1"), info("n2"))
    sweep, _ = start(sim)
    sim.c.stop_sweep(sweep.id, sim.now)
    assert sweep.state == SweepState.STOPPED
    assert all(sim.c.jobs[j].state in (JobState.STOPPING, JobState.STOPPED) for j in sweep.jobs)
    sim.c.tick(sim.now)
    assert len(sweep.jobs) == 2


def test_a_sweep_whose_trials_can_never_be_placed_is_refused_and_not_kept():
    sim = Sim(info("n1"))
    with pytest.raises(Unplaceable):
        start(sim, worker=1, gpus=1)
    assert not sim.c.sweeps.by_id and not sim.c.jobs.live


def test_a_sweep_is_read_back_from_the_store_with_its_trials(tmp_path):
    sim = Sim(info("n1"), info("n2"), info("n3"))
    sweep, _ = start(sim)
    store = open_store("", tmp_path)
    try:
        writer = Writer()
        batch = writer.collect(sim.c.changes)
        assert ("sweep", sweep.id) in batch.writes
        writer.written(batch, store.write(list(batch.writes.values())))
        state = from_documents(migrate.upgrade(store))
    finally:
        store.close()
    back = Cluster()
    for job in state.jobs:
        back.add_job(job)
    for sweep_back in state.sweeps:
        back.add_sweep(sweep_back)
    again = back.sweeps.by_id[sweep.id]
    assert (again.spec, again.sweep, again.parameters, again.jobs, again.owner, again.state) == \
        (sweep.spec, sweep.sweep, sweep.parameters, sweep.jobs, sweep.owner, sweep.state)
    assert back.jobs[sweep.jobs[0]].sweep_parameters == {"LR": "0.1", "BATCH": "32"}
    assert back.trials_of(again) == sim.c.trials_of(sweep)
