"""Restarts through the coordinator's core with fake time (coresim.Sim): failures during a restart in place, and
the backoff before every kind of restart."""

from __future__ import annotations

from coresim import Sim, info, keys, launches, make_spec, stops

from tfcluster.commands import Launch
from tfcluster.daemon.coordinator.core.lifecycle.restart import RESTART
from tfcluster.states import JobState, TaskState


def ps_job(**restart):
    sim = Sim(info("n1"), info("n2"), info("n3"))
    spec = make_spec(strategy="parameter_server", chief=1, worker=2, ps={"count": 2, "gpus": 0},
                     evaluator={"count": 1, "gpus": 0}, restart=restart)
    job, actions = sim.submit(spec)
    sim.running(job, sim.running(job, actions))
    assert job.state == JobState.RUNNING
    return sim, job


def later(sim, seconds):
    """Time passes, every node beats; what the tick sends."""
    sim.now += seconds
    sim.heartbeat_all()
    return sim.c.tick(sim.now)


# ---- failures during a restart in place ---------------------------------------------------------------

def test_a_permanent_exit_during_a_restart_of_ps_and_chief_fails_the_job_naming_it():
    sim, job = ps_job(permanent_exit_codes=[7])
    stop = sim.exit(job, "ps:1", 1)
    assert keys(stop) == ["chief:0", "ps:0"] and job.restarting and job.restarts == 1
    more = sim.exit(job, "worker:0", 7)
    assert keys(more) == ["evaluator:0", "worker:1"]
    assert job.state == JobState.STOPPING and job.outcome == JobState.FAILED
    sim.exit_stopped(job, stop + more)
    assert job.state == JobState.FAILED, job.message
    assert job.message.startswith("worker:0 on ") and "exited with code 7" in job.message
    assert "permanent" in job.message
    assert job.last_failure.task == "worker:0" and job.last_failure.exit.exit_code == 7
    assert job.restarts == 1 and launches(stop + more) == []


def test_a_failure_during_a_restart_in_place_with_the_budget_spent_fails_the_job():
    sim, job = ps_job(max_restarts=1)
    stop = sim.exit(job, "chief:0", 1)
    more = sim.exit(job, "worker:1", None, signal=9)
    sim.exit_stopped(job, stop + more)
    assert job.state == JobState.FAILED and "budget spent (1 of 1)" in job.message
    assert job.last_failure.task == "worker:1"


def test_a_failure_during_a_restart_in_place_restarts_the_group_and_costs_one_more():
    sim, job = ps_job()
    stop = sim.exit(job, "chief:0", 1)
    more = sim.exit(job, "worker:0", 1)
    assert job.restarts == 2 and "it was restarting" in job.message
    relaunch = sim.exit_stopped(job, stop + more)
    assert job.state == JobState.STARTING and keys(relaunch) == ["evaluator:0", "ps:0", "ps:1", "worker:0", "worker:1"]


# ---- the backoff ------------------------------------------------------------------------------------

def test_backoff_before_a_restart_of_ps_and_chief_in_place():
    sim, job = ps_job(backoff_seconds=10)
    workers = {t.key: (t.attempt, t.state) for t in job.tasks if t.type == "worker"}
    stop = sim.exit(job, "ps:1", 1)
    assert "in 10 s (backoff_seconds)" in job.message
    assert sim.exit_stopped(job, stop) == [], "nothing launches before the backoff has passed"
    assert job.state == JobState.STARTING
    assert [t.state for t in job.tasks if t.type in ("ps", "chief")] == [TaskState.PENDING] * 3
    assert launches(later(sim, 5)) == []
    relaunch = launches(later(sim, 6))
    assert keys(relaunch) == ["ps:0", "ps:1"], "ps first, on their addresses; the chief once they listen"
    chief = sim.running(job, relaunch)
    assert keys(chief) == ["chief:0"]
    sim.running(job, chief)
    assert job.state == JobState.RUNNING and job.restarts == 1
    assert {t.key: (t.attempt, t.state) for t in job.tasks if t.type == "worker"} == workers


def test_backoff_before_a_worker_restarts_alone():
    sim, job = ps_job(backoff_seconds=10)
    assert sim.exit(job, "worker:1", 1) == []
    worker = job.task("worker", 1)
    assert job.state == JobState.RUNNING and worker.state == TaskState.PENDING and job.restarts == 1
    assert launches(later(sim, 9)) == []
    again = launches(later(sim, 2))
    assert keys(again) == ["worker:1"] and again[0].attempt.number == 2 and again[0].node == worker.node
    sim.running(job, again)
    assert worker.state == TaskState.RUNNING and job.state == JobState.RUNNING


def test_a_worker_waiting_for_its_backoff_on_a_node_that_is_lost_restarts_the_group():
    sim, job = ps_job(backoff_seconds=10)
    sim.exit(job, "worker:1", 1)
    node = job.task("worker", 1).node
    sim.now += 4
    sim.heartbeat_all(node)
    stop = sim.c.tick(sim.now)
    assert job.task("worker", 1).state == TaskState.LOST and job.state == JobState.STOPPING and job.outcome == RESTART
    assert stops(stop) and job.restarts == 2


def test_backoff_before_the_evaluator_restarts_and_none_after_a_preemption():
    sim, job = ps_job(backoff_seconds=10)
    assert sim.exit(job, "evaluator:0", 1) == []
    assert job.task("evaluator", 0).state == TaskState.PENDING and job.state == JobState.RUNNING
    again = launches(later(sim, 11))
    assert keys(again) == ["evaluator:0"] and job.evaluator_restarts == 1
    sim.running(job, again)
    at_once = sim.exit(job, "evaluator:0", 42)
    assert keys(at_once) == ["evaluator:0"] and isinstance(at_once[0], Launch)


def test_backoff_before_a_group_restart_and_none_after_a_preemption():
    sim = Sim(info("n1"), info("n2"))
    job, actions = sim.submit(make_spec(worker=2, restart={"backoff_seconds": 10}))
    sim.running(job, actions)
    stop = sim.exit(job, "worker:0", 1)
    assert sim.exit_stopped(job, stop) == [] and job.state == JobState.PENDING
    relaunch = launches(later(sim, 11))
    assert keys(relaunch) == ["worker:0", "worker:1"]
    sim.running(job, relaunch)
    stop = sim.exit(job, "worker:0", 42)
    assert keys(launches(sim.exit(job, "worker:1", 42))) == ["worker:0", "worker:1"], "preemption: at once"
    assert (job.restarts, job.preemptions) == (1, 1) and keys(stop) == ["worker:1"]


def test_an_evaluator_whose_port_was_taken_is_placed_on_another():
    sim, job = ps_job()
    evaluator = job.task("evaluator", 0)
    taken = (evaluator.node, evaluator.port)
    sim.report(job, "evaluator", 0, "FAILED_TO_START", message=f"port {taken[1]} is already in use",
               busy_port=taken[1])
    sim.c.schedule(sim.now)
    assert evaluator.state == TaskState.LAUNCHING and (evaluator.node, evaluator.port) != taken
    assert job.state == JobState.RUNNING and job.evaluator_restarts == 1


def test_a_worker_still_waiting_for_its_backoff_when_training_finishes_is_not_relaunched():
    sim, job = ps_job(backoff_seconds=10)
    sim.exit(job, "worker:1", 1)
    sim.exit(job, "chief:0", 0, final_checkpoint="ckpt-5")
    assert job.final_evaluation_until and launches(later(sim, 11)) == []
    stop = sim.exit(job, "evaluator:0", 0)
    assert keys(stop) == ["ps:0", "ps:1", "worker:0"] and job.task("worker", 1).state == TaskState.STOPPED
    sim.exit_stopped(job, stop)
    assert job.state == JobState.SUCCEEDED
