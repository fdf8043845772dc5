"""The indexes Nodes and Jobs keep (nodes by name and address, idle capacity, the order nodes were heard in, what
is placed where, live and ended jobs, the jobs a scheduling pass looks at, request ids, task UIDs, job numbers), and what the placed tasks hold on each
node, always equal what they index recomputed from scratch, whatever happens: random registrations, heartbeats,
reports, submissions, stops, silences, removals and retention, driven through the cluster's events."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from coresim import Sim, check_held, info, make_spec, report
from tfcluster.daemon.coordinator.core.cluster import Cluster, Unplaceable
from tfcluster.daemon.coordinator.core.model.node_table import NameTaken
from tfcluster.daemon.coordinator.core.scheduling.placement import NodeCapacity
from tfcluster.model import TaskProgress
from tfcluster.states import JobState, NodeState, TaskState

NODES = 12  # enough for the mass-silence rule (10 silent nodes) to come into play
SPECS = [
    make_spec(worker=2),
    make_spec(strategy="mirrored", gpus=1, worker=1),
    make_spec(strategy="parameter_server", chief=1, worker=2, ps={"count": 1, "gpus": 0},
              restart={"max_restarts": 2, "permanent_exit_codes": [7]}),
    make_spec(worker=1, evaluator=1, restart={"max_restarts": 1}),
    make_spec(gpus=2, worker=3),
]


def node_info(i: int, address_of: int | None = None):
    """Node i; two nodes share each address, on port ranges of their own (address_of: another node's address)."""
    a = i if address_of is None else address_of
    return replace(info(f"n{i:02}", n_gpus=2), address=f"10.0.0.{a % (NODES // 2)}",
                   port_range=(20000 + 100 * i, 20099 + 100 * i))


def check_nodes(c: Cluster) -> None:
    nodes = c.nodes
    assert nodes.names == sorted(nodes)
    by_address: dict[str, set[str]] = {}
    for n in nodes.values():
        by_address.setdefault(n.info.address, set()).add(n.name)
    assert nodes._by_address == by_address
    assert nodes._idle == {n.name: NodeCapacity(n.name, n.info.address, n.info.gpus, n.info.port_range)
                           for n in nodes.values()}
    assert set(nodes._heard) == {n.name for n in nodes.values() if n.state == NodeState.READY}
    heard = [nodes[name].seen.last_seen for name in nodes._heard]
    assert heard == sorted(heard), "the node heard from longest ago comes first"
    placed: dict[str, dict] = {}
    for job in c.jobs.values():
        for task in job.tasks:
            if task.node and not job.ended:
                placed.setdefault(task.node, {})[(job.id, task.key)] = (job, task)
    assert {n: {k: (id(j), id(t)) for k, (j, t) in e.items()} for n, e in nodes._placed.items()} == \
        {n: {k: (id(j), id(t)) for k, (j, t) in e.items()} for n, e in placed.items()}
    by_job: dict[str, dict[str, str]] = {}
    for node, entries in placed.items():
        for job_id, key in entries:
            by_job.setdefault(job_id, {})[key] = node
    assert nodes._placements == by_job


def check_jobs(c: Cluster) -> None:
    jobs = c.jobs
    kept = sorted(jobs.values(), key=lambda j: j.number)
    assert list(jobs.live) == [j.id for j in kept if not j.ended], "live jobs, oldest first"
    assert set(jobs.ended) == {j.id for j in kept if j.ended}
    finished = [j.finished for j in jobs.ended.values()]
    assert finished == sorted(finished), "ended jobs in the order they ended"
    assert jobs._requests == {j.request_id: j.id for j in kept if j.request_id}
    by_uid: dict[int, dict] = {}
    for job in kept:
        by_uid.setdefault(job.uid, {})[job.id] = job
    assert jobs._by_uid == by_uid
    live_uids = [j.uid for j in kept if not j.ended]
    assert len(live_uids) == len(set(live_uids)), "two live jobs never share a task UID"
    assert all(jobs.next_number > j.number for j in kept)
    assert set(c.unfit_at) <= set(jobs.live)
    to_place = {j.id for j in kept if not j.ended and (j.state == JobState.PENDING or j.lost_tasks())}
    assert set(jobs.to_place) == to_place, "the jobs a scheduling pass looks at: PENDING, or lost a task's node"
    only_queued = {j.id for j in kept if j.state == JobState.PENDING and not j.syncing and
                   not j.final_evaluation_until and all(not t.node for t in j.tasks)}
    ticking = {j.id for j in kept if not j.ended} - only_queued
    assert set(jobs.ticking) == ticking, "the jobs the tick looks at: every live one but those only queued"


class ClusterIndexes(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.sim = Sim(*(node_info(i) for i in range(NODES)))
        self.sim.c.jobs.keep_finished_jobs = 3
        self.sessions = 0

    @property
    def c(self) -> Cluster:
        return self.sim.c

    def _tasks(self, *states: str) -> list:
        return [(job, t) for job in self.c.jobs.live.values() for t in job.tasks if t.state in states and t.node]

    @rule(i=st.integers(0, NODES - 1), moved=st.booleans(), clash=st.booleans())
    def register(self, i, moved, clash):
        """An agent (re)registers: on its own address, another node's (it moved), or over another's ports."""
        n = node_info(i, address_of=i + 1 if moved else None)
        if clash:  # the node sharing its address has these ports
            n = replace(n, port_range=node_info((i + NODES // 2) % NODES).port_range)
        self.sessions += 1
        running = [report(job.id, t.type, t.index, t.attempt, "RUNNING", pid=1)
                   for job, t in self._tasks(TaskState.RUNNING) if t.node == n.name]
        try:
            self.c.register(n, running, f"s{self.sessions}", self.sim.now)
        except (NameTaken, ValueError):
            pass

    @rule(i=st.integers(0, NODES - 1), drop=st.booleans())
    def heartbeat(self, i, drop):
        """A node's agent heartbeats with the attempts it runs (or has lost one)."""
        self._heartbeat(f"n{i:02}", drop)

    @rule(drop=st.booleans(), seconds=st.sampled_from([0.5, 1.0, 3.5]))
    def heartbeats(self, drop, seconds):
        """Time passes while every agent heartbeats, as they do each second (reconcile heals what it finds)."""
        self.sim.now += seconds
        for name in list(self.c.nodes):
            self._heartbeat(name, drop)

    def _heartbeat(self, name: str, drop: bool) -> None:
        if name in self.c.nodes:
            running = [TaskProgress(job.attempt_of(t)) for job, t in self._tasks(TaskState.RUNNING) if t.node == name]
            self.c.heartbeat(name, self.c.nodes[name].seen.session_id, self.sim.now, running[1:] if drop else running)

    @rule(spec=st.sampled_from(SPECS), request=st.sampled_from(["", "r1", "r2"]))
    def submit(self, spec, request):
        try:
            self.c.submit(replace(spec, name="job"), self.sim.now, request_id=request)
        except Unplaceable:
            pass

    @rule(pick=st.integers(0, 1000))
    def starts(self, pick):
        tasks = self._tasks(TaskState.LAUNCHING)
        if tasks:
            job, task = tasks[pick % len(tasks)]
            self.sim.report(job, task.type, task.index, "RUNNING", node=task.node)

    @rule(pick=st.integers(0, 1000), code=st.sampled_from([0, 0, 1, 7]))
    def exits(self, pick, code):
        tasks = self._tasks(TaskState.RUNNING, TaskState.LAUNCHING)
        if tasks:
            job, task = tasks[pick % len(tasks)]
            self.sim.report(job, task.type, task.index, "EXITED", node=task.node, exit_code=code)

    @rule(pick=st.integers(0, 1000), graceful=st.booleans())
    def stop(self, pick, graceful):
        live = list(self.c.jobs.live)
        if live:
            self.c.stop(live[pick % len(live)], self.sim.now, graceful)

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.5, 4.0, 40.0]))
    def time_passes(self, seconds):
        self.sim.now += seconds
        self.c.tick(self.sim.now)

    @rule(seconds=st.floats(0.5, 5.0))
    def coordinator_deaf(self, seconds):
        """The coordinator's loop was blocked this long: the time passed, and no node's silence counts it."""
        self.sim.now += seconds
        self.c.nodes.forgive_silence(seconds)
        self.c.tick(self.sim.now)

    @rule(i=st.integers(0, NODES - 1))
    def remove(self, i):
        if f"n{i:02}" in self.c.nodes:
            self.c.remove_node(f"n{i:02}", self.sim.now)

    @invariant()
    def indexes_match_a_recomputation(self):
        check_nodes(self.c)
        check_jobs(self.c)
        check_held(self.c)


ClusterIndexes.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                            suppress_health_check=[HealthCheck.too_slow])
test_cluster_indexes = ClusterIndexes.TestCase
