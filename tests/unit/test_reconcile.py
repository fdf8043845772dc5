"""Reconcile: every lost message between coordinator and agent heals from the heartbeats that follow."""

from __future__ import annotations

from dataclasses import replace

from coresim import Sim, info, keys, launches, make_spec, report, stops

from tfcluster.commands import FinishTraining, Stop, SyncCheckpoints
from tfcluster.daemon.coordinator.core.cluster import RESEND_AFTER_SECONDS
from tfcluster.model import Attempt, TaskProgress
from tfcluster.states import JobState, TaskState


def beat(sim, node, *running):
    """A heartbeat from node listing the attempts its agent runs; returns what reconcile sends."""
    n = sim.c.nodes[node]
    return sim.c.heartbeat(node, n.seen.session_id, sim.now, [TaskProgress(a) for a in running])


def attempt(job, task):
    return job.attempt_of(task)


def later(sim, seconds=RESEND_AFTER_SECONDS):
    sim.now += seconds


def beat_all(sim, job):
    """Every node's agent heartbeats, listing the job's live tasks there as running (nothing was lost)."""
    for node in sim.c.nodes:
        beat(sim, node, *(attempt(job, t) for t in job.tasks if t.node == node and t.live))


def two_workers():
    sim = Sim(info("n1"), info("n2"))
    job, actions = sim.submit(make_spec(worker=2, restart={"max_restarts": 3}))
    return sim, job, actions


def test_a_lost_launch_is_sent_again_until_the_task_reports():
    sim, job, actions = two_workers()
    w = job.task(actions[0].attempt.type, actions[0].attempt.index)
    assert beat(sim, w.node) == [], "not before resend_after has passed"
    later(sim)
    again = beat(sim, w.node)
    assert again == [actions[0]], "the same launch, same attempt"
    assert beat(sim, w.node) == [], "and not on every heartbeat"
    later(sim)
    assert beat(sim, w.node) == [actions[0]]
    sim.report(job, w.type, w.index, "RUNNING")
    later(sim)
    assert beat(sim, w.node, attempt(job, w)) == []


def test_a_lost_running_report_heals_by_asking_again():
    # The agent runs the task (its heartbeats say so) but the RUNNING report never arrived: the launch is sent
    # again and the agent, which has the attempt, answers with its current report.
    sim, job, actions = two_workers()
    w = job.task("worker", 0)
    later(sim)
    assert keys(beat(sim, w.node, attempt(job, w))) == ["worker:0"]
    assert w.state == TaskState.LAUNCHING


def test_a_lost_exit_report_heals():
    sim, job, actions = two_workers()
    sim.running(job, actions)
    w0, w1 = job.task("worker", 0), job.task("worker", 1)
    assert beat(sim, w0.node, attempt(job, w0)) == []
    # worker:0 ended; its exit report was lost: the agent no longer lists it.
    assert beat(sim, w0.node) == [], "one heartbeat without it may be a report still on its way"
    later(sim)
    asked = beat(sim, w0.node)
    assert launches(asked) and asked[0].attempt == attempt(job, w0), "asked again: the agent re-sends the exit"
    sim.exit(job, "worker:0", 0)
    assert w0.state == TaskState.SUCCEEDED
    assert beat(sim, w1.node, attempt(job, w1)) == []


def test_a_stop_that_did_not_take_effect_is_sent_again_with_the_latest_grace():
    sim, job, actions = two_workers()
    sim.running(job, actions)
    first = sim.c.stop(job.id, sim.now)
    assert {s.grace_seconds for s in first} == {30.0}
    w0 = job.task("worker", 0)
    later(sim)
    assert beat(sim, w0.node, attempt(job, w0)) == [Stop(w0.node, attempt(job, w0), 30.0)]
    now = sim.c.stop(job.id, sim.now, graceful=False)
    assert {s.grace_seconds for s in now} == {0.0}, "stop --now after a graceful stop escalates at once"
    later(sim)
    assert beat(sim, w0.node, attempt(job, w0)) == [Stop(w0.node, attempt(job, w0), 0.0)]


def test_an_attempt_nobody_wants_is_stopped_and_so_is_a_task_of_an_ended_job():
    sim, job, actions = two_workers()
    sim.running(job, actions)
    w0 = job.task("worker", 0)
    stale = Attempt(job.id, "worker", 0, w0.attempt - 1 + 5)
    unknown = Attempt("removed-7", "worker", 0, 1)
    sent = beat(sim, w0.node, attempt(job, w0), stale, unknown)
    assert {s.attempt for s in stops(sent)} == {stale, unknown}
    assert next(s for s in sent if s.attempt == unknown).grace_seconds == 0.0
    assert beat(sim, w0.node, attempt(job, w0), stale, unknown) == [], "not every heartbeat"
    later(sim)
    assert len(stops(beat(sim, w0.node, attempt(job, w0), stale, unknown))) == 2
    # The job fails for good while an agent still runs a task of it: reconcile stops that task.
    sim.c.stop(job.id, sim.now)
    sim.exit_stopped(job, [Stop(w0.node, attempt(job, w0), 30.0)])
    w1 = job.task("worker", 1)
    sim.exit_stopped(job, [Stop(w1.node, attempt(job, w1), 30.0)])
    assert job.state == JobState.STOPPED
    later(sim)
    assert stops(beat(sim, w0.node, attempt(job, w0))) == [Stop(w0.node, attempt(job, w0), 30.0)]


def test_lost_sync_done_and_lost_finish_training_are_asked_again():
    sim = Sim(*(replace(info(n), peer_port=19999) for n in ("n1", "n2", "n3")))
    spec = replace(make_spec(worker=2, evaluator={"count": 1, "nodes": ["n3"]}, restart={"max_restarts": 2}),
                   checkpoint_dir="")
    job, actions = sim.submit(spec)
    sim.running(job, actions)
    sync = [a for a in sim.exit_stopped(job, sim.exit(job, "worker:1", 1)) if isinstance(a, SyncCheckpoints)][0]
    assert sim.c.tick(sim.now) == [], "the copy is under way"
    later(sim)
    beat_all(sim, job)
    heal = [a for a in sim.c.tick(sim.now) if isinstance(a, SyncCheckpoints)]
    assert heal == [sync], "no answer: asked again (the agent answers again from what it kept)"
    relaunch = sim.c.sync_done(sync.node, job.id, sync.sync_id, True, "", sim.now)
    sim.running(job, relaunch)
    sim.exit(job, "worker:1", 0)
    finish = [a for a in sim.exit(job, "worker:0", 0, final_checkpoint="ckpt-9") if isinstance(a, FinishTraining)]
    assert finish and finish[0].final_checkpoint == "ckpt-9"
    later(sim)
    beat_all(sim, job)
    assert [a for a in sim.c.tick(sim.now) if isinstance(a, FinishTraining)] == finish
    sim.exit(job, "evaluator:0", 0)
    later(sim)
    beat_all(sim, job)
    assert sim.c.tick(sim.now) == [] and job.state == JobState.SUCCEEDED


def test_an_agent_of_0_1_is_not_asked_for_a_copy_twice():
    # It does not keep the answer: asked again, it would copy the whole dir again. Such an agent takes no new
    # tasks (it would run them as root), so it is the chief's node of a job placed before it was downgraded.
    sim = Sim(*(replace(info(n), peer_port=19999) for n in ("n1", "n2", "n3")))
    spec = replace(make_spec(worker=2, evaluator={"count": 1, "nodes": ["n3"]}, restart={"max_restarts": 2}),
                   checkpoint_dir="")
    job, actions = sim.submit(spec)
    sim.running(job, actions)
    source = sim.c.nodes[job.decisive_task().node]
    source.info = replace(source.info, agent_version="0.1.0")
    assert [a for a in sim.exit_stopped(job, sim.exit(job, "worker:1", 1)) if isinstance(a, SyncCheckpoints)]
    for _ in range(3):
        later(sim)
        beat_all(sim, job)
        assert [a for a in sim.c.tick(sim.now) if isinstance(a, SyncCheckpoints)] == []


def test_registration_answers_are_not_doubled_by_reconcile():
    sim, job, actions = two_workers()
    w = job.task("worker", 1)
    # The agent re-registers without the task it was told to launch: the launch goes again, once.
    again = sim.c.register(info(w.node), [], "s-2", sim.now)
    assert keys(again) == ["worker:1"]
    assert beat(sim, w.node) == []
    running = report(job.id, "worker", 1, w.attempt, "RUNNING", pid=3)
    assert sim.c.register(info(w.node), [running], "s-3", sim.now) == []


def test_a_task_stopped_before_its_launch_was_confirmed_and_not_running_is_over():
    sim, job, actions = two_workers()
    w = job.task(actions[0].attempt.type, actions[0].attempt.index)
    sim.running(job, [a for a in actions if a.attempt.task_key != w.key])
    assert w.state == TaskState.LAUNCHING
    sim.c.stop(job.id, sim.now)
    later(sim)
    assert beat(sim, w.node) == [], "not relaunched just to be stopped"
    assert w.state == TaskState.STOPPED and w.exit.message == "stopped before it started"
    # If it does turn up after all, it is stopped.
    sent = sim.c.report(w.node, report(job.id, w.type, w.index, w.attempt, "RUNNING", pid=5), sim.now)
    assert stops(sent) and stops(sent)[0].attempt == attempt(job, w)


def test_nodes_waiting_out_a_restart_grace_do_not_hide_a_new_node_that_dies():
    sim = Sim(info("n1"), info("n2"))
    for name in ("n1", "n2"):  # as loaded by a restarted coordinator: heard from "in the future"
        sim.c.nodes[name].seen.last_seen = sim.now + 10
    sim.c.register(info("n3"), [], "s-3", sim.now)
    later(sim, 4)
    sim.c.tick(sim.now)
    assert sim.c.nodes["n3"].state == "LOST" and sim.c.nodes["n1"].state == "READY"
    later(sim, 10)
    sim.c.tick(sim.now)
    assert sim.c.nodes["n1"].state == "LOST", "its grace over, it is lost too"


def test_a_busy_port_outside_the_nodes_range_is_not_taken_for_one_of_its_ports():
    sim, job, actions = two_workers()
    w = job.task("worker", 0)
    sim.c.report(w.node, report(job.id, "worker", 0, w.attempt, "FAILED_TO_START", message="busy", busy_port=80),
                 sim.now)
    assert sim.c.nodes[w.node].seen.busy_ports == {}
