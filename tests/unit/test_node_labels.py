"""Node labels: the one rule (tfcluster/labels.py), a role's `labels` in a spec, their trip over the wire, and
placement only on nodes holding all of a role's labels (and the reason when none does)."""

from __future__ import annotations

from dataclasses import replace

import json
from pathlib import Path

import pytest

from tfcluster import views, wire
from tfcluster.daemon.agent.main import SettingsError, configure
from tfcluster.daemon.coordinator.store import documents
from tfcluster.render import render_status
from tfcluster.daemon.coordinator.core.cluster import Unplaceable
from tfcluster.daemon.coordinator.core.scheduling.placement import Unfit, place
from tfcluster.labels import MAX_LABELS, label_problem
from tfcluster.spec import SpecError
from tfcluster.specfile import parse_spec
from tfcluster.states import JobState, NodeState
from coresim import Sim, info, launches, make_spec
from test_scheduler import node, spec


@pytest.mark.parametrize("labels", [["a100"], ["gpu=a100", "rack.r12", "nv_link-4"], ["x" * 63], []])
def test_labels_that_follow_the_rule_pass(labels):
    assert label_problem(labels) == ""


@pytest.mark.parametrize("labels, said", [
    (["A100"], "'A100'"), (["-a"], "'-a'"), (["a-"], "'a-'"), (["a=b=c"], "'a=b=c'"), (["=a"], "'=a'"),
    (["a b"], "'a b'"), ([""], "''"), (["x" * 64], "at most 63 characters"),
    (["a", "a"], "lists a label twice"), ([f"l{i}" for i in range(MAX_LABELS + 1)], f"at most {MAX_LABELS} labels"),
])
def test_labels_that_break_the_rule_say_how(labels, said):
    assert said in label_problem(labels)


def test_a_role_asks_for_labels_in_a_spec_file():
    s = make_spec(worker={"count": 2, "labels": ["a100", "ib"]}, evaluator={"count": 1})
    assert s.role("worker").labels == ("a100", "ib") and s.role("evaluator").labels == ()
    with pytest.raises(SpecError, match=r"roles\.worker\.labels: expected labels of lowercase"):
        make_spec(worker={"count": 1, "labels": ["A100"]})
    with pytest.raises(SpecError, match=r"roles\.worker\.labels: expected a list of non-empty strings"):
        make_spec(worker={"count": 1, "labels": "a100"})


def test_labels_travel_the_wire_and_bad_ones_are_refused_there():
    s = make_spec(worker={"count": 1, "labels": ["gpu=a100"]})
    assert wire.spec_from_proto(wire.spec_to_proto(s)).role("worker").labels == ("gpu=a100",)
    n = replace(info("n1", 1), labels=("a100", "rack=r1"))
    assert wire.node_info_from_proto(wire.node_info_to_proto(n)) == n
    bad = wire.node_info_to_proto(n)
    bad.labels.append("Not A Label")
    with pytest.raises(ValueError, match=r"node\.labels: expected labels of"):
        wire.node_info_from_proto(bad)
    old = wire.node_info_to_proto(info("n2"))  # an agent from before labels sends none
    assert wire.node_info_from_proto(old).labels == ()


def labelled(name, *labels, gpus=0):
    return replace(node(name, gpus=gpus), labels=frozenset(labels))


def test_a_labelled_role_goes_only_on_nodes_holding_all_its_labels():
    s = spec(worker={"count": 2, "labels": ["a100", "ib"]}, evaluator={"count": 1})
    nodes = [labelled("n1", "a100"), labelled("n2", "a100", "ib"), labelled("n3", "ib"), labelled("n4")]
    result = {(p.type, p.index): p.node for p in place(s, nodes)}
    assert result[("worker", 0)] == result[("worker", 1)] == "n2"
    assert result[("evaluator", 0)] != "n2", "the unlabelled role spreads where it likes"


def test_labels_and_nodes_both_hold():
    s = spec(worker={"count": 1, "labels": ["a100"], "nodes": ["n1", "n3"]})
    nodes = [labelled("n1"), labelled("n2", "a100"), labelled("n3", "a100")]
    assert [p.node for p in place(s, nodes)] == ["n3"]
    none = place(s, [labelled("n1", "ib"), labelled("n2", "a100"), labelled("n3")])
    assert isinstance(none, Unfit)
    assert none.reason == "roles.worker.labels: none of n1, n3 (roles.worker.nodes) has a100 (labels there: ib)"


def test_a_label_no_ready_node_has_is_named():
    nodes = [labelled("n1", "v100"), labelled("n2")]
    result = place(spec(worker={"count": 1, "labels": ["a100", "ib"]}), nodes)
    assert isinstance(result, Unfit)
    assert result.reason == "roles.worker.labels: no ready node has all of a100, ib (labels there: v100)"


def test_a_labelled_role_too_big_for_its_nodes_says_the_nodes_it_may_use():
    s = spec(gpus=4, worker={"count": 1, "labels": ["a100"]})
    result = place(s, [labelled("n1", "a100", gpus=2), labelled("n2", gpus=8)])
    assert isinstance(result, Unfit) and "more than the nodes it may use has (GPUs per node: n1: 2)" in result.reason


def test_a_job_asking_for_a_label_nobody_has_is_refused_and_one_whose_labelled_node_is_gone_waits():
    sim = Sim(replace(info("n1", 1), labels=("a100",)), info("n2", 1))
    with pytest.raises(Unplaceable, match="roles.worker.labels: no ready node has h100"):
        sim.submit(make_spec(gpus=1, worker={"count": 1, "labels": ["h100"]}))
    busy, actions = sim.submit(make_spec(gpus=1, worker={"count": 1, "labels": ["a100"]}, strategy="mirrored"), "a")
    assert [a.node for a in launches(actions)] == ["n1"]
    waiting, actions = sim.submit(make_spec(gpus=1, worker={"count": 1, "labels": ["a100"]}, strategy="mirrored"),
                                  "b")
    assert actions == [] and waiting.state == JobState.PENDING, "n2 has a free GPU but not the label"
    sim.now += 5  # n1 falls silent and is lost; n2 stays
    sim.heartbeat_all("n1")
    sim.c.tick(sim.now)
    assert sim.c.nodes["n1"].state == NodeState.LOST
    assert waiting.state == JobState.PENDING
    assert "roles.worker.labels: no ready node has a100" in waiting.message


def test_status_json_and_table_show_labels_and_the_store_keeps_them():
    sim = Sim(replace(info("n1", 1), labels=("a100", "ib", "rack=r1", "zone=z", "nvme")), info("n2", 1))
    status = [wire.node_status(n, 0, sim.now) for n in sim.c.nodes.values()]
    docs = {d["name"]: d for d in map(views.node_doc, status)}
    assert docs["n1"]["labels"] == ["a100", "ib", "rack=r1", "zone=z", "nvme"] and docs["n2"]["labels"] == []
    header, *rows = render_status(status, []).splitlines()[1:4]
    assert "LABELS" in header.split()
    assert "a100,ib,rack=r1,zone=z +1" in rows[0] and " - " in rows[1]
    unlabelled = [wire.node_status(sim.c.nodes["n2"], 0, sim.now)]
    assert "LABELS" not in render_status(unlabelled, []), "a cluster without labels keeps its table"
    node = sim.c.nodes["n1"]
    assert documents.node_from_doc(json.dumps(documents.node_doc(node))).info == node.info
    old = documents.plain(node.info)
    del old["labels"]
    assert documents.node_from_doc(json.dumps({"info": old, "state": "READY"})).info.labels == ()


def test_the_agent_refuses_a_bad_label_naming_the_flag(tmp_path: Path):
    with pytest.raises(SettingsError, match=r"--label: expected labels of lowercase .* got 'A100'"):
        configure("127.0.0.1:1", "n1", "127.0.0.1", "20000-20010", None, "none", tmp_path, "t", insecure=True,
                  labels=("A100",))
    with pytest.raises(SettingsError, match="--label: lists a label twice"):
        configure("127.0.0.1:1", "n1", "127.0.0.1", "20000-20010", None, "none", tmp_path, "t", insecure=True,
                  labels=("a", "a"))
    config = configure("127.0.0.1:1", "n1", "127.0.0.1", "20000-20010", None, "none", tmp_path, "t",
                       insecure=True, labels=("a100",))
    assert config.node_info().labels == ("a100",)


# ---- tfcluster up ------------------------------------------------------------------------------

def test_inventory_labels_follow_the_rule_and_a_changed_set_restarts_the_agent():
    import hashlib

    from tfcluster.bringup.desired import AGENT_UNIT, ENV_FILE, desired, env_file
    from tfcluster.bringup.inventory import InventoryError, parse
    from tfcluster.bringup.plan import plan_up, probed_dirs

    def inventory(labels):
        node = {"host": "10.0.0.11", "gpus": 0} | ({"labels": labels} if labels is not None else {})
        return parse({"software": {"extras": []}, "coordinators": [{"host": "10.0.0.1"}], "nodes": [node]})

    with pytest.raises(InventoryError, match=r"nodes\[0\]\.labels: 10\.0\.0\.11: expected labels of .* got 'A100'"):
        inventory(["A100"])
    with pytest.raises(InventoryError, match=r"nodes\[0\]\.labels: expected a non-empty array, got 'a100'"):
        inventory("a100")
    before, after = inventory(None), inventory(["a100", "rack=r1"])
    agent = after.hosts[1]
    assert agent.labels == ("a100", "rack=r1")
    assert b"\nTFCLUSTER_LABELS=a100 rack=r1\n" in env_file(after, agent)
    assert b"TFCLUSTER_LABELS" not in env_file(before, before.hosts[1]), "a node without labels gets no line"
    ca = {name: name.encode() for name in ("ca.crt", "ca.key", "coordinator.crt", "coordinator.key")}
    old = desired(before, before.hosts[1], ca)
    facts = {"software": "0.8.0+abc", "files": {p: hashlib.sha256(f.data).hexdigest() for p, f in old.files.items()},
             "running": {s: True for s in old.services}, "joined": True,
             "dirs": {d: True for d in probed_dirs(before.software)}}
    plan = plan_up(agent, desired(after, agent, ca), facts, after.software, "0.8.0+abc")
    assert plan.changes == [f"rewrite {ENV_FILE} (600)", f"start {AGENT_UNIT} ({ENV_FILE} changed)"]
