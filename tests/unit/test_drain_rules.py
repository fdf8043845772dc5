"""Draining a node through the coordinator's core with fake time (coresim.Sim): nothing new goes there, what runs
there finishes there (or is requeued as a preemption, charged nothing), DRAINING turns DRAINED when it is empty,
the drain is saved with the node and shown by status, and resuming lets placement use the node again."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from coresim import Sim, info, launches, make_spec, stops

from tfcluster import views, wire
from tfcluster.daemon.coordinator.core.model.node import HEALTH_CHECK, Drain
from tfcluster.daemon.coordinator.store import documents
from tfcluster.render import render_status
from tfcluster.states import DrainState, JobState


def one_gpu_job(sim, name):
    spec = replace(make_spec(strategy="mirrored", gpus=1, worker=1), name=name)
    job, commands = sim.c.submit(spec, sim.now)
    sim.running(job, commands)
    return job


def drain(sim, node, requeue=False, reason="fan replacement"):
    return sim.c.drain(node, Drain(reason=reason, by="ops", since=sim.now), requeue, sim.now)


def test_a_drained_node_gets_nothing_new_while_what_runs_there_finishes_there():
    sim = Sim(info("n1", 1), info("n2", 1))
    first = one_gpu_job(sim, "first")
    busy = first.tasks[0].node
    other = ({"n1", "n2"} - {busy}).pop()
    assert stops(drain(sim, busy)) == [] and first.state == JobState.RUNNING
    assert sim.c.nodes.drain_state(busy) == DrainState.DRAINING
    second = one_gpu_job(sim, "second")
    assert second.tasks[0].node == other, "placement passes the drained node by"
    third, commands = sim.c.submit(replace(make_spec(strategy="mirrored", gpus=1, worker=1), name="third"), sim.now)
    assert third.state == JobState.PENDING and launches(commands) == [], "it waits rather than go to the drained node"
    assert "drained by ops: fan replacement" in third.message
    sim.now += 5
    sim.exit(first, "worker:0")
    assert first.state == JobState.SUCCEEDED
    assert sim.c.nodes.drain_state(busy) == DrainState.DRAINED
    assert third.state == JobState.PENDING, "a drained node stays out of placement once empty"
    commands = sim.c.resume(busy, sim.now)
    assert sim.c.nodes.drain_state(busy) is None
    assert [launch.node for launch in launches(commands)] == [busy] and third.state == JobState.STARTING


def test_requeue_stops_the_jobs_there_gracefully_and_places_them_elsewhere_charging_no_restart():
    sim = Sim(info("n1", 1), info("n2", 1))
    job = one_gpu_job(sim, "train")
    busy = job.tasks[0].node
    commands = drain(sim, busy, requeue=True)
    assert [s.attempt.job_id for s in stops(commands)] == [job.id]
    assert stops(commands)[0].grace_seconds == job.spec.stop_grace_seconds > 0  # SIGTERM first: the program saves
    assert job.state == JobState.STOPPING and f"node {busy} was drained by ops" in job.message
    placed = sim.exit_stopped(job, commands)
    assert [launch.node for launch in launches(placed)] != [busy] and len(launches(placed)) == 1
    assert job.restarts == 0 and job.preemptions == 1
    assert sim.c.nodes.drain_state(busy) == DrainState.DRAINED


def test_requeue_leaves_jobs_on_other_nodes_alone_and_a_drain_without_requeue_stops_nothing():
    sim = Sim(info("n1", 1), info("n2", 1))
    a, b = one_gpu_job(sim, "a"), one_gpu_job(sim, "b")
    commands = drain(sim, a.tasks[0].node, requeue=True)
    assert [s.attempt.job_id for s in stops(commands)] == [a.id] and b.state == JobState.RUNNING
    assert stops(drain(sim, b.tasks[0].node)) == [] and b.state == JobState.RUNNING


def test_draining_again_replaces_the_reason_and_resuming_a_node_not_drained_changes_nothing():
    sim = Sim(info("n1", 1))
    drain(sim, "n1", reason="first")
    drain(sim, "n1", reason="second")
    assert sim.c.nodes["n1"].drain.reason == "second"
    sim.c.resume("n1", sim.now)
    assert sim.c.resume("n1", sim.now) == [] and sim.c.nodes["n1"].drain is None
    with pytest.raises(KeyError):
        drain(sim, "nowhere")
    with pytest.raises(KeyError):
        sim.c.resume("nowhere", sim.now)


def test_the_drain_is_saved_with_the_node_and_outlives_its_agent_registering_again():
    sim = Sim(info("n1", 1))
    drain(sim, "n1")
    node = sim.c.nodes["n1"]
    assert node.unsaved, "the store writes the drain"
    assert documents.node_from_doc(json.dumps(documents.node_doc(node))).drain == node.drain
    before = documents.node_from_doc(json.dumps({"info": documents.plain(node.info), "state": "READY"}))
    assert before.drain is None, "a node saved by an earlier release is not drained"
    sim.now += 1
    sim.c.register(info("n1", 1), [], "session-2", sim.now)
    assert sim.c.nodes["n1"].drain == node.drain


def test_status_and_json_show_the_drain_with_who_why_since_and_whether_anything_still_runs():
    sim = Sim(info("n1", 1), info("n2", 1))
    job = one_gpu_job(sim, "train")
    busy = job.tasks[0].node
    drain(sim, busy)
    status = [wire.node_status(n, 0, sim.now, 0, sim.c.nodes.drain_state(n.name)) for n in sim.c.nodes.values()]
    docs = {d["name"]: d for d in map(views.node_doc, status)}
    assert docs[busy]["drain"] == {"reason": "fan replacement", "by": "ops", "since": sim.now, "state": "DRAINING"}
    assert docs[busy]["schedulable"] is False and docs[busy]["state"] == "READY"
    idle = ({"n1", "n2"} - {busy}).pop()
    assert docs[idle]["drain"] is None and docs[idle]["schedulable"] is True
    text = render_status(status, [])
    assert "DRAINING*" in text and f"* {busy} drained by ops" in text and "fan replacement" in text


def test_metrics_name_each_drained_node_with_its_state_who_and_why_and_count_the_requeue_as_drained():
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from tfcluster.daemon.coordinator.web.metrics import CoordinatorMetrics

    sim = Sim(info("n1", 1), info("n2", 1))
    metrics = CoordinatorMetrics(sim.c, clock=lambda: sim.now)
    sim.c.observer = metrics
    job = one_gpu_job(sim, "train")
    busy = job.tasks[0].node
    sim.exit_stopped(job, drain(sim, busy, requeue=True))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
               for s in family.samples}
    labels = (("by", "ops"), ("node", busy), ("reason", "fan replacement"), ("state", "DRAINED"))
    assert samples[("tfcluster_node_drained_since_seconds", labels)] == sim.now
    restarts = {k: v for k, v in samples.items() if k[0] == "tfcluster_job_restarts_total" and ("cause", "drained") in k[1]}
    assert list(restarts.values()) == [1.0], restarts



# ---- the agent's health check drains and lifts -------------------------------------------------------------

def test_a_node_whose_health_check_fails_at_registration_is_drained_before_anything_is_placed():
    sim = Sim()
    sim.c.register(info("n1", 1), [], "session-n1", sim.now, health_failure="ECC: 3 uncorrectable errors on GPU 0")
    job, commands = sim.c.submit(replace(make_spec(strategy="mirrored", gpus=1, worker=1), name="train"), sim.now)
    assert launches(commands) == [] and job.state == JobState.PENDING
    drain = sim.c.nodes["n1"].drain
    assert drain.by == HEALTH_CHECK and drain.reason == "ECC: 3 uncorrectable errors on GPU 0"
    assert "its health check failed: ECC" in job.message
    sim.now += 1
    sim.c.heartbeat("n1", "session-n1", sim.now)  # it passes again: the drain it made is lifted
    assert sim.c.nodes["n1"].drain is None
    assert [launch.node for launch in launches(sim.c.tick(sim.now))] == ["n1"]


def test_a_health_check_never_lifts_an_admins_drain_and_keeps_its_own_since_while_it_fails():
    sim = Sim(info("n1", 1))
    sim.c.heartbeat("n1", "session-n1", sim.now, health_failure="disk /scratch missing")
    since = sim.c.nodes["n1"].drain.since
    sim.now += 5
    sim.c.heartbeat("n1", "session-n1", sim.now, health_failure="disk /scratch read-only")
    assert sim.c.nodes["n1"].drain == Drain("disk /scratch read-only", HEALTH_CHECK, since)
    drain(sim, "n1", reason="RMA")  # an admin's drain takes over
    sim.now += 1
    sim.c.heartbeat("n1", "session-n1", sim.now)
    assert sim.c.nodes["n1"].drain.by == "ops", "the health check passing does not lift an admin's drain"
    sim.c.heartbeat("n1", "session-n1", sim.now, health_failure="still sick")
    assert sim.c.nodes["n1"].drain.reason == "RMA", "nor does failing replace it"
