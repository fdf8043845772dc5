"""A job that brought its code: every launch names the archive and the job's environment, and the peers
where the job's tasks already run, which hold the archive, so that a relaunch fetches it from them. A first
launch spreads the code as a tree: two nodes fetch from the coordinator, each other node from one before it.
Each node named as a source is told, before the launch goes out, which node will ask it."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from coresim import Sim, info, launches, make_spec

from tfcluster.commands import Launch, ServeCode
from tfcluster.daemon.coordinator.core.lifecycle.launch import CODE_FANOUT, code_sources, launch, launch_commands, relay_parent
from tfcluster.model import EnvironmentSpec

CODE = "sha256:" + "c0" * 32


def with_peers(*names):
    return Sim(*(replace(info(name), peer_port=7000 + i) for i, name in enumerate(names)))


def test_launches_carry_the_archive_the_environment_and_the_peers_that_hold_it():
    sim = with_peers("n1", "n2", "n3")
    spec = replace(make_spec(worker=3), code_sha256=CODE, environment=EnvironmentSpec("requirements.txt"))
    job, actions = sim.submit(spec)
    first = launches(actions)
    assert {(a.code_sha256, a.environment.requirements) for a in first} == {(CODE, "requirements.txt")}
    w0, w1, w2 = (job.task("worker", i) for i in range(3))
    assert [a.code_sources for a in first] == [(), (), (w0.peer,)], \
        "nothing runs yet: two nodes fetch from the coordinator, the third from the first as its bytes arrive"
    sim.report(job, "worker", 0, "RUNNING")
    sim.report(job, "worker", 1, "RUNNING")
    assert code_sources(job, w2) == (w0.peer, w1.peer) and w0.peer.startswith("10.0.0.")
    assert code_sources(job, w0) == (w1.peer,), "not its own node"
    assert launch(job, w2).code_sources == (w0.peer, w1.peer)


def test_a_first_launch_on_sixteen_nodes_has_the_coordinator_send_the_code_twice_and_no_node_more_often():
    sim = Sim(*(replace(info(f"n{i}"), address=f"10.0.1.{i}", peer_port=7000) for i in range(16)))
    job, actions = sim.submit(replace(make_spec(worker=16), code_sha256=CODE))
    first = launches(actions)
    by_peer = {job.task("worker", i).peer: job.task("worker", i) for i in range(16)}
    senders = Counter(source for a in first for source in a.code_sources or ("coordinator",))
    assert senders["coordinator"] == CODE_FANOUT == 2
    assert max(senders.values()) == CODE_FANOUT and sum(senders.values()) == 16
    for a in first:  # every relay was launched before the node it relays to
        order = [t.node for t in job.tasks]
        assert all(order.index(by_peer[s].node) < order.index(a.node) for s in a.code_sources)
    depth = max(_depth(i) for i in range(16))
    assert depth == 4, "16 nodes are 4 hops from the coordinator at most"


def _depth(position: int) -> int:
    parent = relay_parent(position)
    return 1 if parent is None else 1 + _depth(parent)


def test_a_node_with_two_of_the_tasks_is_one_place_in_the_tree():
    sim = with_peers("n1", "n2")
    job, actions = sim.submit(replace(make_spec(worker=3), code_sha256=CODE))
    assert len({t.node for t in job.tasks}) == 2
    assert [a.code_sources for a in launches(actions)] == [(), (), ()], "two nodes: both from the coordinator"


def test_a_job_on_shared_storage_names_no_archive():
    sim = with_peers("n1", "n2")
    job, actions = sim.submit(make_spec(worker=2))
    sim.running(job, actions)
    assert {(a.code_sha256, a.code_sources) for a in launches(actions)} == {("", ())}
    assert code_sources(job, job.task("worker", 0)) == ()


def test_the_launch_goes_over_the_wire_whole():
    from tfcluster import wire

    sim = with_peers("n1", "n2")
    spec = replace(make_spec(worker=2), code_sha256=CODE, environment=EnvironmentSpec("", True, "."))
    job, actions = sim.submit(spec)
    sim.report(job, "worker", 0, "RUNNING")
    sent = launch(job, job.task("worker", 1))
    back = wire.command_from_proto(wire.command_to_proto(sent), sent.node)
    assert (back.code_sha256, back.code_sources, back.environment) == \
        (CODE, (job.task("worker", 0).peer,), EnvironmentSpec("", True, "."))
    assert back == sent


def test_each_node_named_as_a_source_is_told_first_which_node_will_ask_it():
    sim = with_peers("n1", "n2", "n3")
    job, actions = sim.submit(replace(make_spec(worker=3), code_sha256=CODE))
    w0, w1, w2 = (job.task("worker", i) for i in range(3))
    told = [a for a in actions if isinstance(a, ServeCode)]
    assert told == [ServeCode(w0.node, job.id, w2.node)], "the first launch's tree: w2's node asks w0's"
    assert actions.index(told[0]) < actions.index(next(a for a in launches(actions) if a.node == w2.node))
    sim.report(job, "worker", 0, "RUNNING")
    sim.report(job, "worker", 1, "RUNNING")
    again = launch_commands(job, w2)  # relaunched: both nodes that run the job's tasks hold the code
    assert again[:-1] == [ServeCode(w0.node, job.id, w2.node), ServeCode(w1.node, job.id, w2.node)]
    assert isinstance(again[-1], Launch) and again[-1] == launch(job, w2)
    assert [a for a in launch_commands(*_shared_job()) if isinstance(a, ServeCode)] == [], "no code, no word"


def _shared_job():
    sim = with_peers("n1", "n2")
    job, actions = sim.submit(make_spec(worker=2))
    sim.running(job, actions)
    return job, job.task("worker", 1)


def test_serve_code_goes_over_the_wire_and_a_bad_node_name_is_refused_by_field():
    import pytest

    from tfcluster import wire

    told = ServeCode("n1", "train-4-ab12", "n3")
    assert wire.command_from_proto(wire.command_to_proto(told), "n1") == told
    bad = wire.command_to_proto(ServeCode("n1", "train-4-ab12", "../n3"))
    with pytest.raises(ValueError, match=r"serve_code.node: not a node name: '../n3'"):
        wire.command_from_proto(bad, "n1")
