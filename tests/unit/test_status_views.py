"""What status shows stays bounded whatever the cluster's size: an overview, and pages through the rest."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from coresim import Sim, info, make_spec

from tfcluster.daemon.coordinator.core import status
from tfcluster.states import NodeState


def big_cluster(nodes=120):
    return Sim(*(replace(info(f"n{i:03d}", 1), address=f"10.1.0.{i}") for i in range(nodes)))


def test_pages_end_at_a_count_or_a_byte_budget_and_tokens_continue_where_they_stopped(monkeypatch):
    sim = big_cluster()
    seen, token = [], ""
    while True:
        page, token = status.fill(status.nodes(sim.c, token), 50, lambda n: n, lambda n: n.name, lambda n: 10)
        seen += [n.name for n in page]
        if not token:
            break
    assert seen == sorted(sim.c.nodes) and len(seen) == 120
    monkeypatch.setattr(status, "PAGE_BYTES", 25)
    page, token = status.fill(status.nodes(sim.c), 50, lambda n: n, lambda n: n.name, lambda n: 10)
    assert len(page) == 3 and token == page[-1].name, "stops once the bytes are over budget"
    page, _ = status.fill(status.nodes(sim.c), 50, lambda n: n, lambda n: n.name, lambda n: 10**9)
    assert len(page) == 1, "an entry bigger than the budget still comes, alone"


def test_node_filters_and_the_overview_shows_lost_nodes_first():
    sim = big_cluster()
    sim.now += 10
    for name, node in sim.c.nodes.items():
        if name != "n077":
            sim.c.heartbeat(name, node.seen.session_id, sim.now)
    sim.c.tick(sim.now)
    assert sim.c.nodes["n077"].state == NodeState.LOST
    assert [n.name for n in status.nodes(sim.c, state=NodeState.LOST)] == ["n077"]
    assert [n.name for n in status.nodes(sim.c, prefix="n11")] == [f"n11{i}" for i in range(10)]
    overview = status.overview_nodes(sim.c)
    assert overview[0].name == "n077" and len(overview) == status.OVERVIEW_NODES
    summary = status.summary(sim.c)
    assert summary["nodes_by_state"] == {"READY": 119, "LOST": 1} and summary["gpus_total"] == 119


def test_jobs_by_number_with_filters_and_the_overview_keeps_the_newest_ended(monkeypatch):
    monkeypatch.setattr(status, "OVERVIEW_ENDED_JOBS", 3)
    sim = Sim(info("n1", 1), info("n2", 1))
    ended = []
    for i in range(6):
        job, actions = sim.submit(make_spec(strategy="mirrored", worker=1, gpus=1), name="done")
        sim.running(job, actions)
        sim.exit(job, "worker:0", 0)
        ended.append(job.id)
    live, actions = sim.submit(make_spec(strategy="mirrored", worker=1, gpus=1), name="live")
    sim.running(live, actions)
    waiting = [sim.submit(make_spec(strategy="mirrored", worker=1, gpus=1), name="big")[0] for _ in range(2)]
    assert [j.id for j in status.overview_jobs(sim.c)] == ended[-3:] + [live.id] + [j.id for j in waiting]
    assert [j.id for j in status.jobs(sim.c, states=["SUCCEEDED"])] == ended
    assert [j.id for j in status.jobs(sim.c, name="big")] == [j.id for j in waiting]
    assert [j.id for j in status.jobs(sim.c, node=live.task("worker", 0).node, states=["RUNNING"])] == [live.id]
    assert [j.id for j in status.jobs(sim.c, after=ended[-1] and sim.c.jobs[ended[-1]].number)] == \
        [live.id] + [j.id for j in waiting]
    summary = status.summary(sim.c)
    assert summary["jobs_by_state"] == {"PENDING": 1, "STARTING": 1, "RUNNING": 1, "SUCCEEDED": 6}
    assert summary["gpus_allocated"] == 2 and summary["gpus_total"] == 2


def test_the_line_for_systemctl_status_counts_nodes_and_live_jobs():
    sim = Sim(info("n1", 1), info("n2", 1), info("n3", 1))
    sim.now += 10
    for name in ("n1", "n2"):
        sim.c.heartbeat(name, sim.c.nodes[name].seen.session_id, sim.now)
    sim.c.tick(sim.now)
    assert status.one_line(sim.c) == "2 nodes READY, 1 LOST, 0 jobs running, 0 pending"
    job, actions = sim.submit(make_spec(strategy="mirrored", worker=1, gpus=1), name="run")
    sim.running(job, actions)
    starting = sim.submit(make_spec(strategy="mirrored", worker=1, gpus=1), name="next")[0]
    waiting = sim.submit(make_spec(strategy="mirrored", worker=1, gpus=1), name="waits")[0]
    assert (starting.state, waiting.state) == ("STARTING", "PENDING")
    assert status.one_line(sim.c) == "2 nodes READY, 1 LOST, 1 job running, 1 pending, 1 starting"
    sim.exit(job, "worker:0", 0)
    assert "0 jobs running" in status.one_line(sim.c), "ended jobs are not counted"


def walked(sim: Sim) -> dict:
    """The summary's counts as a walk over every node and job finds them: what the kept counts must equal."""
    nodes = Counter(n.state.value for n in sim.c.nodes.values())
    jobs = Counter(j.state.value for j in sim.c.jobs.values())
    return {"nodes_by_state": dict(nodes), "jobs_by_state": dict(jobs),
            "gpus_total": sum(len(n.info.gpus) for n in sim.c.nodes.values() if n.state == NodeState.READY)}


def test_the_counts_status_keeps_agree_with_a_walk_through_losses_returns_removals_and_pruning():
    sim = big_cluster(12)
    counted = lambda: {k: v for k, v in status.summary(sim.c).items() if k != "gpus_allocated"}  # noqa: E731
    assert counted() == walked(sim) == {"nodes_by_state": {"READY": 12}, "jobs_by_state": {}, "gpus_total": 12}
    sim.now += 10
    sim.heartbeat_all("n003", "n007")
    sim.c.tick(sim.now)
    assert counted() == walked(sim) and counted()["nodes_by_state"] == {"READY": 10, "LOST": 2}
    assert [n.name for n in status.overview_nodes(sim.c)][:3] == ["n003", "n007", "n000"]
    sim.c.register(replace(info("n003", 4), address="10.1.0.3"), [], "session-n003-again", sim.now)
    assert counted() == walked(sim) and counted()["gpus_total"] == 14, "it came back with 4 GPUs"
    sim.c.remove_node("n007", sim.now)
    assert counted() == walked(sim) and counted()["nodes_by_state"] == {"READY": 11}
    sim.c.jobs.keep_finished_jobs = 2
    for _ in range(3):
        job, actions = sim.submit(make_spec(strategy="mirrored", worker=1, gpus=1), name="done")
        sim.running(job, actions)
        sim.exit(job, "worker:0", 0)
    sim.submit(make_spec(strategy="mirrored", worker=1, gpus=1), name="live")
    sim.c.prune(sim.now)
    assert counted() == walked(sim) and sum(counted()["jobs_by_state"].values()) == 3, "one ended job pruned"
