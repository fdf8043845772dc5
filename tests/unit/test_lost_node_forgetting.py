"""A node LOST for longer than --forget-lost-nodes-after is forgotten (coresim.Sim, fake time), unless a task of a job
not ended is still placed there or an admin drained it; how long it has been gone is saved, so a restarted
coordinator counts from when it was lost, not from its own start. A forgotten node's agent registers anew."""

from __future__ import annotations

import json

from coresim import Sim, info, make_spec

from tfcluster.daemon.coordinator.core.model.node import HEALTH_CHECK, Drain
from tfcluster.daemon.coordinator.store.api import Put
from tfcluster.daemon.coordinator.store.open import open_store
from tfcluster.daemon.coordinator.store.documents import dumps, node_doc
from tfcluster.daemon.coordinator.store.records import Writer
from tfcluster.states import JobState, NodeState, TaskState
from test_store import load, write

HOUR = 3600.0
FORGET = 24 * HOUR


def sim_with(*names: str, forget: float = FORGET, task_grace: float = 0.0, gpus: int = 0) -> Sim:
    sim = Sim(*(info(name, gpus) for name in names), task_grace=task_grace)
    sim.c.forget_lost_after = forget
    return sim


def pass_time(sim: Sim, seconds: float, silent: tuple[str, ...] = ("n1",), step: float = 1.0) -> None:
    """Every node but the silent ones heartbeats each step; the cluster ticks after each."""
    end = sim.now + seconds
    while sim.now < end:
        sim.now = min(end, sim.now + step)
        sim.heartbeat_all(*silent)
        sim.c.tick(sim.now)


def lose(sim: Sim, name: str = "n1") -> float:
    """The node falls silent until it is LOST; returns when it was declared so."""
    pass_time(sim, 10, (name,))
    node = sim.c.nodes[name]
    assert node.state == NodeState.LOST and node.lost_since > 0
    return node.lost_since


def test_a_node_lost_for_longer_than_the_setting_is_forgotten_and_leaves_the_store(tmp_path):
    sim = sim_with("n1", "n2")
    store, writer = open_store("", tmp_path), Writer()
    write(store, writer, writer.collect(sim.c.changes))
    lost_since = lose(sim)
    pass_time(sim, FORGET - 20, step=HOUR)
    assert "n1" in sim.c.nodes, "not before its time"
    pass_time(sim, 2 * 60, step=30)
    assert sorted(sim.c.nodes) == ["n2"] and sim.c.nodes["n2"].state == NodeState.READY
    assert sim.now - lost_since < FORGET + 2 * 60, "found within the check interval"
    write(store, writer, writer.collect(sim.c.changes))
    assert [d.key for d in store.load() if d.kind == "node"] == ["n2"]
    store.close()
    assert sim.c.register(info("n1"), [], "session-n1-back", sim.now) == []
    assert sim.c.nodes["n1"].state == NodeState.READY and sim.c.nodes["n1"].lost_since == 0.0, \
        "its agent, back, registers anew"


def test_a_node_back_in_time_is_kept_and_its_loss_counts_again_from_zero():
    sim = sim_with("n1", "n2")
    lose(sim)
    pass_time(sim, FORGET - HOUR, step=HOUR)
    sim.c.register(info("n1"), [], "session-n1-back", sim.now)
    assert sim.c.nodes["n1"].lost_since == 0.0
    pass_time(sim, 2 * HOUR, silent=(), step=1.0)
    assert sim.c.nodes["n1"].state == NodeState.READY
    lost_again = lose(sim)
    pass_time(sim, FORGET - 2 * HOUR, step=HOUR)
    assert sim.c.nodes["n1"].lost_since == lost_again, "still there: its second loss is younger than the setting"


def test_a_node_an_admin_drained_is_kept_one_the_health_check_drained_is_not():
    sim = sim_with("n1", "n2", "n3")
    sim.c.drain("n1", Drain("bad fan", "alice", sim.now), False, sim.now)
    sim.c.drain("n2", Drain("disk full", HEALTH_CHECK, sim.now), False, sim.now)
    lose(sim, "n1")
    pass_time(sim, 10, ("n1", "n2"))
    pass_time(sim, FORGET + HOUR, ("n1", "n2"), step=HOUR)
    assert sorted(sim.c.nodes) == ["n1", "n3"], "the admin's decision outlives the node's absence"
    assert sim.c.nodes["n1"].drain.reason == "bad fan"


def test_a_node_keeps_its_place_while_a_task_of_a_live_job_is_placed_there():
    """With a task grace longer than the setting, the job still waits for the node's tasks: the node stays until
    they count as lost and the job moves on, then goes at the next check."""
    grace = FORGET + 6 * HOUR
    sim = sim_with("n1", "n2", "n3", task_grace=grace, gpus=1)
    job, actions = sim.submit(make_spec(gpus=1, worker=2))
    sim.running(job, actions)
    on_n1 = next(t for t in job.tasks if t.node == "n1")
    lose(sim)
    pass_time(sim, FORGET + HOUR, step=HOUR)
    assert "n1" in sim.c.nodes and on_n1.state == TaskState.RUNNING and job.state == JobState.RUNNING
    pass_time(sim, 5 * HOUR, step=HOUR)
    pass_time(sim, HOUR, step=HOUR)
    assert on_n1.state == TaskState.LOST and job.state == JobState.STOPPING
    assert "n1" in sim.c.nodes, "its job stops its other task first"
    other = next(t for t in job.tasks if t.node != "n1")
    sim.report(job, other.type, other.index, "EXITED", exit_code=None, signal=15)  # told to stop
    pass_time(sim, 2 * 60, step=30)
    assert job.state != JobState.STOPPING and "n1" not in sim.c.nodes


def test_how_long_a_node_was_lost_survives_the_coordinators_restart(tmp_path):
    sim = sim_with("n1", "n2")
    store, writer = open_store("", tmp_path), Writer()
    lost_since = lose(sim)
    pass_time(sim, FORGET - HOUR, step=HOUR)
    write(store, writer, writer.collect(sim.c.changes))
    back = load(store)
    store.close()
    node = back.nodes["n1"]
    assert node.state == NodeState.LOST and node.lost_since == lost_since
    assert node.seen.last_seen == lost_since, "status says it has been silent for a day, not since 1970"
    back.forget_lost_after = FORGET
    back.forget_long_lost(sim.now)
    assert "n1" in back.nodes
    assert back.forget_long_lost(lost_since + FORGET + 61) == ["n1"], "counted from its loss, not from the restart"


def test_a_lost_node_stored_by_an_earlier_release_counts_from_loading(tmp_path):
    sim = sim_with("n1", "n2")
    lose(sim)
    doc = node_doc(sim.c.nodes["n1"])
    del doc["lost_since"]  # as an earlier release wrote it
    store = open_store("", tmp_path)
    store.write([_put("n1", doc)])
    back = load(store)
    store.close()
    back.forget_lost_after = FORGET
    loaded_at = 1_000_000.0
    assert back.forget_long_lost(loaded_at) == [] and back.nodes["n1"].lost_since == loaded_at
    assert back.forget_long_lost(loaded_at + FORGET - 1) == []
    assert back.forget_long_lost(loaded_at + FORGET + 60) == ["n1"]


def test_zero_keeps_lost_nodes_for_good():
    sim = sim_with("n1", "n2", forget=0.0)
    lose(sim)
    pass_time(sim, 400 * 86400, step=86400)
    assert sim.c.nodes["n1"].state == NodeState.LOST


def _put(key: str, doc: dict) -> Put:
    return Put("node", key, dumps(doc), 0)


def test_the_saved_document_says_when_it_was_lost():
    sim = sim_with("n1", "n2")
    lost_since = lose(sim)
    assert json.loads(dumps(node_doc(sim.c.nodes["n1"])))["lost_since"] == lost_since
    assert node_doc(sim.c.nodes["n2"])["lost_since"] == 0.0
