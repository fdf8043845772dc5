"""What the coordinator's core does with the conditions an agent's GPU check sends (fake time, coresim.Sim): a sick
GPU is left out of placement with its reason in a waiting job's message, a throttled one is still placed on, a
condition that clears gives the GPU back, and status, its JSON and the metrics show them all. The conditions go
through the wire's own conversions, as they arrive in a RegisterRequest or a Heartbeat."""

from __future__ import annotations

from dataclasses import replace

from coresim import Sim, info, launches, make_spec

from tfcluster import conditions as kinds
from tfcluster import views, wire
from tfcluster.api.v1 import agent_pb2
from tfcluster.conditions import NodeCondition
from tfcluster.render import render_status
from tfcluster.states import JobState

ECC = NodeCondition(1, kinds.ECC_UNCORRECTABLE, "uncorrectable ECC errors: 2 since the driver loaded", 90.0)
HOT = NodeCondition(0, kinds.THROTTLED, "clocks throttled: HW thermal slowdown", 95.0)


def sent(*found):
    """The conditions as the coordinator reads them off an agent's heartbeat."""
    return wire.conditions_from_proto(agent_pb2.Heartbeat(conditions=wire.conditions_to_proto(found)))


def gpu_job(sim, gpus, name="train"):
    return sim.c.submit(replace(make_spec(strategy="mirrored", gpus=gpus, worker=1), name=name), sim.now)


def test_a_sick_gpu_is_left_out_with_its_reason_while_the_healthy_one_is_still_used():
    sim = Sim()
    sim.c.register(info("b", 2), [], "session-b", sim.now, conditions=sent(ECC))
    _, commands = gpu_job(sim, 1, "small")
    [launch] = launches(commands)
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "GPU-b-0"
    whole, commands = gpu_job(sim, 1, "next")
    assert launches(commands) == [] and whole.state == JobState.PENDING
    assert "GPU 1 of node b excluded: uncorrectable ECC errors: 2 since the driver loaded" in whole.message


def test_a_cleared_condition_gives_the_gpu_back_to_the_waiting_job():
    sim = Sim()
    sim.c.register(info("b", 2), [], "session-b", sim.now, conditions=sent(ECC))
    job, _ = gpu_job(sim, 2)
    sim.now += 1
    sim.c.heartbeat("b", "session-b", sim.now, conditions=sent(ECC))
    assert launches(sim.c.tick(sim.now)) == [] and job.state == JobState.PENDING
    sim.now += 1
    sim.c.heartbeat("b", "session-b", sim.now, conditions=sent())  # the GPU was reset: its count is 0 again
    [launch] = launches(sim.c.tick(sim.now))
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "GPU-b-0,GPU-b-1" and job.state != JobState.PENDING


def test_a_throttled_gpu_is_shown_but_still_placed_on():
    sim = Sim()
    sim.c.register(info("b", 1), [], "session-b", sim.now, conditions=sent(HOT))
    _, commands = gpu_job(sim, 1)
    [launch] = launches(commands)
    assert launch.node == "b" and launch.env["CUDA_VISIBLE_DEVICES"] == "GPU-b-0"


def test_a_lost_node_forgets_its_conditions_and_its_agent_says_them_again_when_it_registers():
    sim = Sim()
    sim.c.register(info("b", 2), [], "session-b", sim.now, conditions=sent(ECC))
    sim.now += 10
    sim.c.tick(sim.now)
    assert sim.c.nodes["b"].seen.conditions == ()
    sim.c.register(info("b", 2), [], "session-b2", sim.now, conditions=sent(ECC))
    assert sim.c.nodes["b"].seen.conditions == (ECC,)


def test_status_json_the_table_and_the_metrics_show_each_condition():
    from prometheus_client.exposition import generate_latest

    from tfcluster.daemon.coordinator.web.metrics import CoordinatorMetrics

    sim = Sim()
    sim.c.register(info("b", 2), [], "session-b", sim.now, conditions=sent(ECC, HOT))
    status = [wire.node_status(n, 0, sim.now) for n in sim.c.nodes.values()]
    [doc] = map(views.node_doc, status)
    assert doc["conditions"] == [
        {"gpu": 1, "kind": "ecc-uncorrectable", "message": ECC.message, "since": 90.0, "excludes": True},
        {"gpu": 0, "kind": "throttled", "message": HOT.message, "since": 95.0, "excludes": False}]
    text = render_status(status, [])
    assert "0:A100!, 1:A100!" in text
    assert f"! b GPU 1: {ECC.message} (ecc-uncorrectable" in text and "left out of placement" in text
    assert f"! b GPU 0: {HOT.message} (throttled" in text and "still placed on" in text
    metrics = generate_latest(CoordinatorMetrics(sim.c, clock=lambda: sim.now).registry).decode()
    assert 'tfcluster_gpu_conditions{gpu="1",kind="ecc-uncorrectable",node="b"} 1.0' in metrics
    assert 'tfcluster_gpu_conditions{gpu="0",kind="throttled",node="b"} 0.0' in metrics


def test_bad_conditions_from_an_agent_are_refused_with_what_was_wrong():
    import pytest

    with pytest.raises(ValueError, match="conditions: at most 64"):
        sent(*[HOT] * 65)
    with pytest.raises(ValueError, match="conditions.gpu: expected a GPU index below 256, got 300"):
        sent(replace(HOT, gpu=300))
    [node_wide] = sent(NodeCondition(None, kinds.NVML_UNAVAILABLE, "NVML does not answer\x1b[2J", 1.0))
    assert node_wide.gpu is None and not node_wide.excludes and "\x1b" not in node_wide.message
