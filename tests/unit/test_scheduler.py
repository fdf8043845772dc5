"""Gang placement: all tasks or none, GPUs and ports never shared, pins, backtracking, stickiness, spreading."""

from __future__ import annotations

from collections import Counter

from tfcluster.daemon.coordinator.core.model.capacity import NodeCapacity, TaskPlacement, task_list
from tfcluster.daemon.coordinator.core.scheduling.placement import Unfit, place
from tfcluster.model import Gpu
from tfcluster.specfile import parse_spec


def spec(strategy="multi_worker_mirrored", gpus=0, command=("python", "t.py"), **roles):
    """roles: worker=2 or worker={"count": 2, "nodes": [...], "gpus": 1}."""
    table = {r: (v if isinstance(v, dict) else {"count": v}) for r, v in roles.items()}
    return parse_spec({"name": "j", "strategy": strategy, "command": list(command), "gpus": gpus, "roles": table})


def node(name, gpus=0, ports=(20000, 20009), used_gpus=(), used_ports=(), address=None):
    return NodeCapacity(name=name, address=address or f"10.0.0.{ord(name[-1]) % 250}",
                        gpus=tuple(Gpu(i, uuid=f"GPU-{name}-{i}", name="T4", memory_mib=16000) for i in range(gpus)),
                        port_range=ports, used_gpus=frozenset(used_gpus), used_ports=frozenset(used_ports))


def placed(result) -> list[TaskPlacement]:
    assert not isinstance(result, Unfit), result
    return result


def by_task(result):
    return {(p.type, p.index): p for p in placed(result)}


def assert_sound(result, nodes):
    """No GPU or port given twice on a node; ports within range and not already used; GPUs exist and are free."""
    caps = {n.name: n for n in nodes}
    gpus_seen, ports_seen = Counter(), Counter()
    for p in placed(result):
        cap = caps[p.node]
        assert p.host == cap.address
        assert p.address == f"{cap.address}:{p.port}"
        assert cap.port_range[0] <= p.port <= cap.port_range[1]
        assert p.port not in cap.used_ports
        ports_seen[(p.node, p.port)] += 1
        for g in p.gpus:
            assert g in cap.gpus
            assert g.index not in cap.used_gpus
            gpus_seen[(p.node, g.index)] += 1
    assert all(c == 1 for c in gpus_seen.values()), gpus_seen
    assert all(c == 1 for c in ports_seen.values()), ports_seen


# ---- basics -----------------------------------------------------------------------------------

def test_every_task_is_placed_in_task_order():
    s = spec(worker=2, chief=1, evaluator={"count": 1, "gpus": 0})
    nodes = [node("a"), node("b"), node("c")]
    result = placed(place(s, nodes))
    assert [(p.type, p.index) for p in result] == task_list(s) == [
        ("chief", 0), ("worker", 0), ("worker", 1), ("evaluator", 0)]
    assert_sound(result, nodes)


def test_gpu_tasks_get_exactly_their_gpus_and_never_share():
    s = spec(gpus=2, worker=4)
    nodes = [node("a", gpus=4), node("b", gpus=4)]
    result = placed(place(s, nodes))
    assert all(len(p.gpus) == 2 for p in result)
    assert_sound(result, nodes)
    # Every GPU of the cluster is used exactly once.
    assert sorted((p.node, g.index) for p in result for g in p.gpus) == [
        (n, i) for n in ("a", "b") for i in range(4)]
    # The GPU carries its identity (uuid) so the agent can set CUDA_VISIBLE_DEVICES.
    assert all(g.uuid == f"GPU-{p.node}-{g.index}" for p in result for g in p.gpus)


def test_used_gpus_of_other_jobs_are_never_given():
    s = spec(gpus=1, worker=2)
    nodes = [node("a", gpus=4, used_gpus={0, 1, 3})]
    assert isinstance(place(s, nodes), Unfit)  # one GPU free, two needed
    nodes = [node("a", gpus=4, used_gpus={0, 3})]
    result = placed(place(s, nodes))
    assert sorted(g.index for p in result for g in p.gpus) == [1, 2]
    assert_sound(result, nodes)


def test_cpu_tasks_get_no_gpus_even_on_gpu_nodes():
    s = spec(worker=2)
    result = placed(place(s, [node("a", gpus=2), node("b", gpus=2)]))
    assert all(p.gpus == () for p in result)


def test_all_or_nothing():
    s = spec(gpus=1, worker=3)
    nodes = [node("a", gpus=1), node("b", gpus=1), node("c", gpus=1, used_gpus={0})]
    result = place(s, nodes)
    assert isinstance(result, Unfit)
    assert "cannot place all 3 tasks" in result.reason
    assert "3 GPUs" in result.reason
    # Nothing partial is handed back and the capacities are untouched (frozen values).
    assert nodes[2].used_gpus == frozenset({0}) and nodes[0].used_gpus == frozenset()


# ---- ports ------------------------------------------------------------------------------------

def test_ports_come_from_the_range_and_are_unique_per_node():
    s = spec(worker=5, chief=1)
    nodes = [node("a", ports=(30000, 30005))]
    result = placed(place(s, nodes))
    assert sorted(p.port for p in result) == list(range(30000, 30006))
    assert_sound(result, nodes)


def test_ports_unique_per_node_across_nodes():
    s = spec(worker=6)
    nodes = [node("a", ports=(30000, 30009)), node("b", ports=(30000, 30009))]
    result = placed(place(s, nodes))
    assert_sound(result, nodes)
    assert Counter(p.node for p in result) == {"a": 3, "b": 3}


def test_used_ports_are_respected():
    s = spec(worker=2)
    nodes = [node("a", ports=(30000, 30003), used_ports={30000, 30002})]
    result = placed(place(s, nodes))
    assert sorted(p.port for p in result) == [30001, 30003]
    assert_sound(result, nodes)


def test_out_of_ports_waits_with_a_reason():
    s = spec(worker=3)
    nodes = [node("a", ports=(30000, 30002), used_ports={30001})]
    result = place(s, nodes)
    assert isinstance(result, Unfit)
    assert "a port" in result.reason
    # Idle, the same node fits the job: it must wait, not fail.
    placed(place(s, [n.idle() for n in nodes]))


# ---- pins -------------------------------------------------------------------------------------

def test_pinned_roles_land_on_their_nodes():
    s = spec(chief={"count": 1, "nodes": ["c"]}, worker={"count": 3, "nodes": ["a", "b"]},
             evaluator={"count": 1, "nodes": ["c"]})
    nodes = [node("a"), node("b"), node("c"), node("d")]
    result = by_task(place(s, nodes))
    assert result[("chief", 0)].node == "c"
    assert result[("evaluator", 0)].node == "c"
    assert {result[("worker", i)].node for i in range(3)} == {"a", "b"}
    assert_sound(list(result.values()), nodes)


def test_unknown_pinned_node_is_named():
    s = spec(worker={"count": 1, "nodes": ["a", "gpu-box-7"]})
    result = place(s, [node("a"), node("b")])
    assert isinstance(result, Unfit)
    assert "'gpu-box-7'" in result.reason
    assert "roles.worker.nodes" in result.reason
    assert "a, b" in result.reason


def test_pin_that_cannot_hold_the_gpus_says_so():
    s = spec(gpus=2, worker={"count": 1, "nodes": ["small"]})
    result = place(s, [node("small", gpus=1), node("big", gpus=8)])
    assert isinstance(result, Unfit)
    assert "2 GPUs" in result.reason and "small: 1" in result.reason
    assert "big" not in result.reason


def test_no_nodes():
    result = place(spec(worker=1), [])
    assert isinstance(result, Unfit) and "no ready nodes" in result.reason


# ---- never fits -------------------------------------------------------------------------------

def test_more_gpus_per_task_than_any_node_has():
    s = spec(gpus=8, worker=2)
    result = place(s, [node("a", gpus=4), node("b", gpus=2)])
    assert isinstance(result, Unfit)
    assert "8 GPUs" in result.reason
    assert "GPUs per node" in result.reason and "a: 4" in result.reason and "b: 2" in result.reason


def test_more_gpus_in_total_than_the_cluster_has_is_unfit():
    s = spec(gpus=2, worker=3)
    result = place(s, [node("a", gpus=2), node("b", gpus=2)])
    assert isinstance(result, Unfit)
    assert "GPUs" in result.reason


# ---- search -----------------------------------------------------------------------------------

def test_pinned_chief_gets_the_gpu_an_unpinned_worker_could_have_taken():
    # Node a has the only GPU that can serve the chief; the worker could go to a or b.
    s = spec(gpus=1, chief={"count": 1, "nodes": ["a"]}, worker=1)
    nodes = [node("a", gpus=1), node("b", gpus=1)]
    result = by_task(place(s, nodes))
    assert result[("chief", 0)].node == "a"
    assert result[("worker", 0)].node == "b"


def test_backtracks_when_the_greedy_choice_blocks_a_later_task():
    # chief may use a or b, worker may use a or c; c has no GPU. Both sort equal, the chief goes first and
    # greedily takes a (name order); the worker then has nowhere to go. Only chief->b, worker->a works.
    s = spec(gpus=1, chief={"count": 1, "nodes": ["a", "b"]}, worker={"count": 1, "nodes": ["a", "c"]})
    nodes = [node("a", gpus=1), node("b", gpus=1), node("c", gpus=0)]
    result = by_task(place(s, nodes))
    assert result[("chief", 0)].node == "b"
    assert result[("worker", 0)].node == "a"
    assert_sound(list(result.values()), nodes)


def test_backtracking_is_what_finds_it(monkeypatch):
    # The same job with a search budget of 2 tries (chief->a, then worker) fails: the first greedy choice
    # is wrong, so the test above really needs the backtracking.
    import tfcluster.daemon.coordinator.core.scheduling.placement as scheduler
    s = spec(gpus=1, chief={"count": 1, "nodes": ["a", "b"]}, worker={"count": 1, "nodes": ["a", "c"]})
    nodes = [node("a", gpus=1), node("b", gpus=1), node("c", gpus=0)]
    monkeypatch.setattr(scheduler, "SEARCH_BUDGET", 2)
    result = place(s, nodes)
    assert isinstance(result, Unfit) and "within 2 tries" in result.reason
    monkeypatch.setattr(scheduler, "SEARCH_BUDGET", 3)
    placed(place(s, nodes))


def test_backtracks_over_ports_too():
    # a and b have one port each and c none left; the chief (a or b) takes a first, which leaves the
    # worker (a or c) nowhere: the search must move the chief to b.
    s = spec(chief={"count": 1, "nodes": ["a", "b"]}, worker={"count": 1, "nodes": ["a", "c"]})
    nodes = [node("a", ports=(1000, 1000)), node("b", ports=(2000, 2000)),
             node("c", ports=(3000, 3001), used_ports={3000, 3001})]
    result = by_task(place(s, nodes))
    assert (result[("chief", 0)].node, result[("chief", 0)].port) == ("b", 2000)
    assert (result[("worker", 0)].node, result[("worker", 0)].port) == ("a", 1000)


def test_unfit_after_search_names_the_stuck_task():
    s = spec(chief={"count": 1, "nodes": ["a", "b"]}, worker={"count": 2, "nodes": ["a", "c"]})
    nodes = [node("a", ports=(1000, 1000)), node("b", ports=(2000, 2000)),
             node("c", ports=(3000, 3001), used_ports={3000, 3001})]
    result = place(s, nodes)
    assert isinstance(result, Unfit)
    assert "no node left for worker:" in result.reason and "needs a port" in result.reason


# ---- preferences ------------------------------------------------------------------------------

def test_previous_placement_is_preferred():
    s = spec(worker=3)
    nodes = [node("a"), node("b"), node("c"), node("d")]
    fresh = by_task(place(s, nodes))
    assert {p.node for p in fresh.values()} == {"a", "b", "c"}
    previous = {("worker", 0): "d", ("worker", 1): "c", ("worker", 2): "a"}
    again = by_task(place(s, nodes, previous={k: (n, 0) for k, n in previous.items()}))
    assert {k: p.node for k, p in again.items()} == previous


def test_previous_placement_yields_when_the_node_is_gone_or_full():
    s = spec(gpus=1, worker=2)
    nodes = [node("a", gpus=1, used_gpus={0}), node("b", gpus=1), node("c", gpus=1)]
    result = by_task(place(s, nodes, previous={("worker", 0): ("a", 0), ("worker", 1): ("x", 0)}))
    assert {p.node for p in result.values()} == {"b", "c"}


def test_a_task_moved_off_a_lost_node_does_not_push_a_survivor_off_its_node():
    # worker 0 was on a node that is gone; worker 1 stays on b. Worker 0 is tried first and b sorts first by
    # name: it must go to c and leave b to worker 1.
    s = spec(gpus=1, worker=2)
    nodes = [node("b", gpus=1), node("c", gpus=1)]
    result = by_task(place(s, nodes, previous={("worker", 0): ("gone", 0), ("worker", 1): ("b", 0)}))
    assert result[("worker", 0)].node == "c"
    assert result[("worker", 1)].node == "b"


def test_previous_gives_the_same_ports_when_nothing_else_changed():
    s = spec(worker=3, evaluator={"count": 1, "gpus": 0})
    nodes = [node("a"), node("b")]
    first = by_task(place(s, nodes))
    again = by_task(place(s, nodes, previous={k: (p.node, p.port) for k, p in first.items()}))
    assert {k: p.address for k, p in again.items()} == {k: p.address for k, p in first.items()}


def test_tasks_spread_across_nodes():
    s = spec(worker=4)
    nodes = [node("a"), node("b"), node("c"), node("d")]
    assert sorted(p.node for p in placed(place(s, nodes))) == ["a", "b", "c", "d"]
    s = spec(worker=6)
    assert Counter(p.node for p in placed(place(s, nodes))) == {"a": 2, "b": 2, "c": 1, "d": 1}


def test_spreading_prefers_nodes_with_more_free_gpus():
    s = spec(gpus=1, worker=1)
    nodes = [node("a", gpus=4, used_gpus={0, 1, 2}), node("b", gpus=4, used_gpus={0})]
    assert placed(place(s, nodes))[0].node == "b"


def test_gpu_tasks_are_placed_before_cpu_tasks():
    # A CPU-only evaluator must not take the GPU node's last port, whatever order tasks are tried in.
    s = spec(gpus=1, chief={"count": 1, "gpus": 1}, worker=1, evaluator={"count": 1, "gpus": 0})
    nodes = [node("a", gpus=2, ports=(1, 2)), node("b", gpus=0, ports=(1, 5))]
    result = by_task(place(s, nodes))
    assert result[("chief", 0)].node == "a" and result[("worker", 0)].node == "a"
    assert result[("evaluator", 0)].node == "b"


def test_a_job_of_thousands_of_tasks_is_placed_without_deep_recursion():
    s = spec(worker=3000)
    nodes = [node(f"n{i:03d}", ports=(20000, 20029), address=f"10.0.{i // 250}.{i % 250}") for i in range(120)]
    result = placed(place(s, nodes))
    assert len(result) == 3000
    assert_sound(result, nodes)
    too_many = place(spec(worker=3601), nodes)
    assert isinstance(too_many, Unfit) and "they need 0 GPUs and 3601 ports" in too_many.reason
    assert "have 0 GPUs and 3600 ports free" in too_many.reason, "120 nodes x 30 ports"


def test_a_pinned_task_placed_again_stays_on_its_nodes():
    s = spec(worker=1, evaluator={"count": 1, "nodes": ["evalbox"]})
    nodes = [node("n1"), node("n2")]
    again = place(s, nodes, only={("evaluator", 0)})
    assert isinstance(again, Unfit) and "roles.evaluator.nodes: none of evalbox is a ready node" in again.reason
    assert by_task(place(s, nodes + [node("evalbox")], only={("evaluator", 0)}))[("evaluator", 0)].node == "evalbox"


# ---- code that travels with the job ----------------------------------------------------------

def test_a_job_whose_code_travels_goes_only_to_agents_that_fetch_code():
    from dataclasses import replace
    shipped = replace(spec(worker=2), code_sha256="sha256:" + "ab" * 32)
    nodes = [replace(node("a"), fetches_code=False), node("b")]
    assert {p.node for p in placed(place(shipped, nodes))} == {"b"}
    assert {p.node for p in placed(place(spec(worker=2), [nodes[0]]))} == {"a"}, "a job on shared storage runs there"
    assert place(shipped, [nodes[0]]) == Unfit("no ready node's agent can fetch the job's code (upgrade the agents "
                                               "on a)")
    pinned = replace(spec(worker={"count": 1, "nodes": ["a"]}), code_sha256="sha256:" + "ab" * 32)
    assert place(pinned, nodes) == Unfit("roles.worker.nodes names 'a', whose agent is too old to fetch the "
                                         "job's code: upgrade it")
