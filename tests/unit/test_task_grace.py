"""A silent node is LOST quickly, its tasks only when it matters (coresim.Sim, fake time): an agent that restarts
within the task grace comes back with its running tasks and their jobs lose nothing; a node that stays away
loses its tasks once the grace is over; a peer task's failure or a stop does not wait for the grace."""

from __future__ import annotations

from coresim import Sim, info, keys, launches, make_spec, report, stops

from tfcluster.daemon.coordinator.core.node_events import ANNOUNCED_RESTART_GRACE_SECONDS
from tfcluster.states import JobState, NodeState, TaskState

GRACE = 20.0


def mwms_on_two_nodes():
    sim = Sim(info("n1", 1), info("n2", 1), info("n3", 1), task_grace=GRACE)
    job, actions = sim.submit(make_spec(gpus=1, worker=2))
    sim.running(job, actions)
    assert job.state == JobState.RUNNING
    return sim, job


def silence(sim, node: str, seconds: float) -> list:
    """Every node but `node` heartbeats each second for `seconds`; the ticks' commands."""
    commands = []
    for _ in range(int(seconds)):
        sim.now += 1.0
        sim.heartbeat_all(node)
        commands += sim.c.tick(sim.now)
    return commands


def test_an_agent_back_within_the_grace_with_its_tasks_costs_its_job_nothing():
    sim, job = mwms_on_two_nodes()
    task = next(t for t in job.tasks if t.node == "n1")
    assert silence(sim, "n1", 6) == []
    assert sim.c.nodes["n1"].state == NodeState.LOST, "the node is LOST as fast as before"
    assert task.state == TaskState.RUNNING and job.state == JobState.RUNNING, "its task is not, yet"
    assert task.message.startswith("node n1 silent for 6 s: this task counts as lost in 17 s unless its agent")
    running = report(job.id, task.type, task.index, task.attempt, "RUNNING", pid=task.pid, listening=True)
    assert sim.c.register(info("n1", 1), [running], "session-n1-restarted", sim.now) == []
    assert sim.c.nodes["n1"].state == NodeState.READY
    assert job.state == JobState.RUNNING and job.restarts == 0 and task.attempt == 1 and task.message == ""
    assert silence(sim, "", GRACE + 5) == [], "nothing is lost later either"


def test_a_node_that_stays_away_loses_its_tasks_once_the_grace_is_over():
    sim, job = mwms_on_two_nodes()
    lost_after = sim.c.nodes.lost_after
    assert silence(sim, "n1", lost_after + GRACE - 1) == []
    assert job.state == JobState.RUNNING
    stop = silence(sim, "n1", 2)
    task = next(t for t in job.tasks if t.node == "n1")
    assert task.state == TaskState.LOST and "n1 lost (no heartbeat for" in task.message
    assert job.state == JobState.STOPPING and [s.node for s in stops(stop)] == ["n2"]


def test_an_agent_back_without_its_task_loses_it_at_once():
    sim, job = mwms_on_two_nodes()
    silence(sim, "n1", 5)
    stop = sim.c.register(info("n1", 1), [], "session-n1-restarted", sim.now)
    task = next(t for t in job.tasks if t.node == "n1")
    assert task.state == TaskState.LOST and "no longer has this task" in task.message
    assert job.state == JobState.STOPPING and keys(stops(stop)) == [t.key for t in job.tasks if t.node == "n2"]


def test_a_peer_task_failing_does_not_wait_for_the_grace():
    sim, job = mwms_on_two_nodes()
    silence(sim, "n1", 5)
    peer = next(t for t in job.tasks if t.node == "n2")
    sim.exit(job, peer.key, code=1)  # its collective with the silent worker broke
    assert job.state == JobState.STOPPING
    sim.now += 1
    sim.heartbeat_all("n1")
    relaunch = sim.c.tick(sim.now)  # the silent worker counts as lost now: the group is placed again at once
    assert job.restarts == 1 and sorted(a.node for a in launches(relaunch)) == ["n2", "n3"], relaunch


def test_stopping_a_job_does_not_wait_for_its_silent_node():
    sim, job = mwms_on_two_nodes()
    silence(sim, "n1", 5)
    sim.exit_stopped(job, sim.c.stop(job.id, sim.now))
    sim.now += 1
    sim.heartbeat_all("n1")
    sim.c.tick(sim.now)
    assert job.state == JobState.STOPPED


def test_an_agent_that_said_it_is_restarting_is_waited_for_longer():
    sim, job = mwms_on_two_nodes()
    sim.c.leaving("n1")
    assert silence(sim, "n1", sim.c.nodes.lost_after + GRACE + 10) == [] and job.state == JobState.RUNNING
    assert silence(sim, "n1", ANNOUNCED_RESTART_GRACE_SECONDS - GRACE) != []
    task = next(t for t in job.tasks if t.node == "n1")
    assert task.state == TaskState.LOST and job.state == JobState.STOPPING


def test_registering_again_ends_the_announced_restart():
    sim, job = mwms_on_two_nodes()
    sim.c.leaving("n1")
    task = next(t for t in job.tasks if t.node == "n1")
    running = report(job.id, task.type, task.index, task.attempt, "RUNNING", pid=task.pid, listening=True)
    sim.c.register(info("n1", 1), [running], "session-n1-restarted", sim.now)
    assert sim.c.nodes["n1"].seen.leaving is False
    silence(sim, "n1", sim.c.nodes.lost_after + GRACE + 2)
    assert task.state == TaskState.LOST, "a later silence gets the ordinary grace"
