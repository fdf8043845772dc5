"""Preemption through the coordinator's core with fake time (coresim.Sim): which jobs are taken from, what they
are charged, what their status says, that what they gave up waits for the job they stopped for, and that they
resume from where they were."""

from __future__ import annotations

import calendar
import time
from dataclasses import replace

import pytest
from coresim import Sim, info, keys, launches, make_spec, stops

from tfcluster import views, wire
from tfcluster.commands import SyncCheckpoints
from tfcluster.daemon.coordinator.core.model.job import describe_preemption
from tfcluster.daemon.coordinator.core.scheduling import preemption
from tfcluster.daemon.coordinator.store import documents
from tfcluster.render import render_status
from tfcluster.states import JobState, TaskState

LOW, HIGH = 10, 100


def submit(sim, name, rank, gpus=1, preemptible=True, owner="", workers=1, **restart):
    """A job of the priority class valued `rank` (what a policy resolves at submission), on `gpus` GPUs of one node
    (mirrored) or over `workers` workers of one GPU each; placed at once if it fits, else tried (and may preempt)."""
    strategy = dict(strategy="mirrored", gpus=gpus, worker=1) if workers == 1 else \
        dict(strategy="multi_worker_mirrored", gpus=1, worker=workers)
    spec = replace(make_spec(restart=restart or None, **strategy), name=name)
    job, commands = sim.c.submit(spec, sim.now, owner=owner)
    job.rank, job.preemptible = rank, preemptible
    sim.c.nodes.resources_changed()  # the class is known before the job is first tried: try it again with it
    return job, commands + sim.c.schedule(sim.now)


def started(sim, name, rank, seconds_later=10.0, **kw):
    """A job submitted and RUNNING, seconds_later than the previous one."""
    sim.now += seconds_later
    job, commands = submit(sim, name, rank, **kw)
    sim.running(job, commands)
    assert job.state == JobState.RUNNING, job.message
    return job


def two_nodes():
    return Sim(info("n1", 2), info("n2", 2))


# ---- who is preempted -------------------------------------------------------------------------------------

def test_the_most_recently_started_of_equally_few_victims_is_preempted_with_a_graceful_stop():
    sim = two_nodes()
    older = started(sim, "older", LOW, gpus=2)
    newer = started(sim, "newer", LOW, gpus=2)
    sim.now += 5
    high, commands = submit(sim, "high", HIGH, gpus=2, owner="alice")
    assert [s.attempt.job_id for s in stops(commands)] == [newer.id]
    assert stops(commands)[0].grace_seconds == newer.spec.stop_grace_seconds > 0  # SIGTERM first: the program saves
    assert older.state == JobState.RUNNING and newer.state == JobState.STOPPING
    assert high.state == JobState.PENDING and launches(commands) == []
    assert newer.preempted_by == high.id and newer.preempted_by_owner == "alice" and newer.preempted_at == sim.now
    assert newer.message == describe_preemption(high.id, "alice", sim.now)


def test_the_fewest_jobs_are_preempted_even_if_they_started_earlier():
    sim = two_nodes()
    big = started(sim, "big", LOW, gpus=2)  # n1, the oldest
    small = [started(sim, f"small{i}", LOW) for i in range(2)]  # both on n2
    assert {t.node for j in small for t in j.tasks} == {"n2"} and big.tasks[0].node == "n1"
    _, commands = submit(sim, "high", HIGH, gpus=2)
    assert [s.attempt.job_id for s in stops(commands)] == [big.id]
    assert all(j.state == JobState.RUNNING for j in small)


def test_several_jobs_are_preempted_when_no_fewer_make_room():
    sim = Sim(info("n1", 2))
    a, b = started(sim, "a", LOW), started(sim, "b", LOW)
    _, commands = submit(sim, "high", HIGH, gpus=2)
    assert sorted(s.attempt.job_id for s in stops(commands)) == sorted([a.id, b.id])


@pytest.mark.parametrize("rank, preemptible", [(HIGH, True), (LOW, False), (HIGH + 1, True)])
def test_equal_higher_or_non_preemptible_classes_are_never_preempted(rank, preemptible):
    sim = Sim(info("n1", 2))
    running = started(sim, "running", rank, gpus=2, preemptible=preemptible)
    high, commands = submit(sim, "high", HIGH, gpus=2)
    assert commands == [] and running.state == JobState.RUNNING and high.state == JobState.PENDING
    assert "waiting for resources" in high.message and running.preemptions == 0


def test_without_a_policy_every_job_is_of_one_class_and_nothing_is_preempted():
    sim = Sim(info("n1", 2))
    running = started(sim, "running", 0, gpus=2)
    waiting, commands = submit(sim, "waiting", 0, gpus=2)
    assert commands == [] and running.state == JobState.RUNNING and waiting.state == JobState.PENDING


def test_nothing_is_preempted_when_it_would_not_make_room():
    sim = two_nodes()
    started(sim, "n1-kept", HIGH, gpus=2)  # n1: a class as high as the waiting job's
    low = started(sim, "low", LOW)  # n2, beside a job that may not be preempted
    kept = started(sim, "n2-kept", LOW, preemptible=False)
    assert low.tasks[0].node == kept.tasks[0].node == "n2"
    high, commands = submit(sim, "high", HIGH, gpus=2)
    assert commands == [] and low.state == JobState.RUNNING and high.state == JobState.PENDING


def test_the_choice_stays_small_when_the_exact_search_runs_out(monkeypatch):
    monkeypatch.setattr(preemption, "SEARCH_BUDGET", 1)
    sim = Sim(info("n1", 2), info("n2", 2))
    jobs = [started(sim, f"one{i}", LOW) for i in range(4)]  # one GPU each, two per node
    high, _ = submit(sim, "high", 0, gpus=2)
    victims = preemption.choose_victims(replace(high, rank=HIGH), preemption.candidates(replace(high, rank=HIGH), jobs),
                                        sim.c.capacity(sim.now))
    # Greedy: the most recent ones until it fits (they alternate between the nodes: three), then without the
    # one on the other node, which it does not need.
    assert [t.node for j in jobs for t in j.tasks] == ["n1", "n2", "n1", "n2"]
    assert [v.id for v in victims] == [jobs[3].id, jobs[1].id]


# ---- what a preempted job goes through --------------------------------------------------------------------

def test_a_preempted_job_waits_in_the_queue_uncharged_and_resumes_with_its_next_attempt():
    sim = Sim(info("n1", 2))
    low = started(sim, "low", LOW, gpus=2, max_restarts=0)  # no restart budget at all
    high, commands = submit(sim, "high", HIGH, gpus=2, owner="alice")
    placed = sim.exit_stopped(low, commands)
    assert low.state == JobState.PENDING and low.restarts == 0 and low.preemptions == 1
    assert low.tasks[0].state == TaskState.STOPPED and low.last_failure is None
    assert low.message.startswith(f"preempted by alice's job {high.id} at ") and "waiting for resources" in low.message
    assert keys(launches(placed)) == ["worker:0"] and high.state == JobState.STARTING  # in the same event
    sim.running(high, placed)
    sim.now += 60
    again = sim.exit(high, "worker:0", 0)
    assert high.state == JobState.SUCCEEDED and low.state == JobState.STARTING
    assert [(a.attempt.job_id, a.attempt.number) for a in launches(again)] == [(low.id, 2)]
    assert low.message == "" and low.preempted_by == high.id  # the last preemption stays on record


def test_what_the_victims_gave_up_is_kept_for_the_preemptor_while_they_stop_and_after():
    sim = Sim(info("n1", 2))
    first, second = started(sim, "first", LOW), started(sim, "second", LOW)
    other, _ = submit(sim, "other", LOW)  # older than the preemptor: first in line for anything freed
    high, commands = submit(sim, "high", HIGH, gpus=2)
    assert sorted(s.attempt.job_id for s in stops(commands)) == sorted([first.id, second.id])
    one = [s for s in stops(commands) if s.attempt.job_id == first.id]
    assert sim.exit_stopped(first, one) == []  # one GPU free: neither the older job nor the victim takes it
    assert first.state == JobState.PENDING and other.state == JobState.PENDING
    sim.now += 30
    sim.heartbeat_all()
    assert launches(sim.c.tick(sim.now)) == []
    placed = sim.exit_stopped(second, [s for s in stops(commands) if s.attempt.job_id == second.id])
    assert {a.attempt.job_id for a in launches(placed)} == {high.id}
    assert not first.held_for and not second.held_for  # placed: nothing is kept any more


def test_the_preemptor_stopped_while_its_victims_stop_leaves_their_resources_to_them():
    sim = Sim(info("n1", 2))
    low = started(sim, "low", LOW, gpus=2)
    high, commands = submit(sim, "high", HIGH, gpus=2)
    sim.c.stop(high.id, sim.now)
    assert high.state == JobState.STOPPED
    placed = sim.exit_stopped(low, commands)
    assert low.state == JobState.STARTING and keys(launches(placed)) == ["worker:0"]


def test_a_preempted_job_placed_elsewhere_gets_its_host_local_checkpoints_copied_there():
    sim = Sim(*(replace(info(name, 2), peer_port=7071) for name in ("n1", "n2")))  # agents that take copies
    blocker = started(sim, "blocker", HIGH, gpus=2)  # n1
    low = started(sim, "low", LOW, workers=2)  # both workers on n2, checkpoints kept there
    assert {t.node for t in low.tasks} == {"n2"} and blocker.tasks[0].node == "n1"
    high, commands = submit(sim, "high", HIGH, gpus=2)
    sim.running(high, sim.exit_stopped(low, commands))
    assert high.state == JobState.RUNNING and low.state == JobState.PENDING
    resumed = sim.exit(blocker, "worker:0", 0)
    assert {t.node for t in low.tasks} == {"n1"} and low.state == JobState.STARTING
    sync = [c for c in resumed if isinstance(c, SyncCheckpoints)]
    assert [(s.node, s.target_nodes) for s in sync] == [("n2", ("n1",))] and launches(resumed) == []
    launched = sim.c.sync_done("n2", low.id, sync[0].sync_id, True, "", sim.now)
    assert keys(launches(launched)) == ["worker:0", "worker:1"]
    assert {a.attempt.number for a in launches(launched)} == {2}


def test_a_job_that_cannot_be_preempted_while_stopping_is_left_alone():
    sim = Sim(info("n1", 2))
    low = started(sim, "low", LOW, gpus=2)
    sim.c.stop(low.id, sim.now)  # its user stops it: it is STOPPING, not a candidate
    high, commands = submit(sim, "high", HIGH, gpus=2)
    assert stops(commands) == [] and low.preempted_by == "" and low.preemptions == 0
    placed = sim.exit_stopped(low, [s for s in stops(sim.c.stop(low.id, sim.now, graceful=False))])
    assert low.state == JobState.STOPPED and keys(launches(placed)) == ["worker:0"]


def test_a_job_whose_training_is_over_is_not_preempted_its_final_evaluation_ends_it():
    sim = Sim(info("n1", 2, ports=(20000, 20001)))  # the evaluator's port is one the waiting job needs
    sim.now += 10
    spec = replace(make_spec(strategy="multi_worker_mirrored", gpus=1, chief=1, evaluator={"count": 1, "gpus": 0}),
                   name="evaluating")
    job, commands = sim.c.submit(spec, sim.now)
    job.rank = LOW
    sim.running(job, sim.running(job, commands))
    sim.exit(job, "chief:0", 0)
    assert job.final_evaluation_until and job.state == JobState.RUNNING
    high, commands = submit(sim, "high", HIGH, workers=2)
    assert stops(commands) == [] and job.preemptions == 0 and high.state == JobState.PENDING


# ---- what it says -----------------------------------------------------------------------------------------

def test_the_status_line_names_the_preemptor_its_owner_and_the_time(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        at = calendar.timegm((2026, 3, 1, 14, 3, 30))
        assert describe_preemption("y-7-k3f9", "alice", at) == "preempted by alice's job y-7-k3f9 at 14:03"
        assert describe_preemption("y-7-k3f9", "", at) == "preempted by job y-7-k3f9 at 14:03"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_status_json_the_table_and_the_store_keep_who_preempted_the_job_and_when():
    sim = Sim(info("n1", 2))
    low = started(sim, "low", LOW, gpus=2)
    high, commands = submit(sim, "high", HIGH, gpus=2, owner="alice")
    saved = documents.job_from_docs(documents.dumps(documents.job_doc(low)),
                                  [documents.dumps(documents.task_doc(t)) for t in low.tasks], [])
    assert (saved.preempted_by, saved.held_for, saved.preempted_at) == (high.id, high.id, sim.now)
    sim.exit_stopped(low, commands)
    doc = views.job_doc(wire.job_status(low))
    assert (doc["preempted_by"], doc["preempted_by_owner"], doc["preempted_at"]) == (high.id, "alice", sim.now)
    assert doc["preemptions"] == 1 and doc["restarts"] == 0 and doc["message"].startswith("preempted by alice's job")
    untouched = views.job_doc(wire.job_status(high))
    assert untouched["preempted_by"] is None and untouched["preempted_at"] is None
    assert "0 (+1 preempted)" in render_status([], [wire.job_status(low)])


def test_a_preemptor_placed_by_a_pass_that_freed_more_than_it_needs_is_placed_once():
    """Both victims' tasks end in one store batch (one pass for both): the preemptor takes what was kept for it, and
    the queue after it does not place it again on what the other task freed."""
    sim = Sim(info("n1", 1), info("n2", 1))
    low = started(sim, "low", LOW, workers=2)  # a worker and its GPU on each node
    high, commands = submit(sim, "high", HIGH, gpus=1)
    assert {s.attempt.job_id for s in stops(commands)} == {low.id}
    sim.c.schedule_per_batch = True  # as the coordinator runs it: one pass for every event of a write
    sim.exit_stopped(low, commands)
    placed = sim.c.schedule(sim.now)
    assert [a.attempt.job_id for a in launches(placed)] == [high.id]
    assert high.state == JobState.STARTING and low.state == JobState.PENDING
