"""The coordinator's model of the cluster: nodes, their liveness, jobs and what runs where. Pure.

Time comes in as an argument and every change returns the actions to send, so the gRPC layer
(service.py) only adds a lock, the SQLite store and the agents' streams around it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tfcluster.daemon.coordinator import jobs as J
from tfcluster.daemon.coordinator.scheduler import (Gpu, NodeCapacity, TaskPlacement, Unfit, choose_strategy, place,
                                                    task_list)
from tfcluster.roles.tfconfig import build_tf_configs
from tfcluster.spec import JobSpec

READY, LOST = "READY", "LOST"
DEFAULT_LOST_AFTER_SECONDS = 3.0
BUSY_PORT_AVOID_SECONDS = 600.0


@dataclass
class NodeInfo:
    name: str
    address: str
    port_range: tuple[int, int]
    gpus: tuple[Gpu, ...] = ()
    hostname: str = ""
    cpu_count: int = 0
    memory_bytes: int = 0
    agent_version: str = ""
    state_dir: str = ""
    peer_port: int = 0

    @property
    def peer_address(self) -> str:
        return f"{self.address}:{self.peer_port}" if self.peer_port else ""


@dataclass
class Node:
    info: NodeInfo
    state: str = READY
    last_seen: float = 0.0
    session_id: str = ""
    # Ports found taken by something else on the node, and until when to avoid them.
    busy_ports: dict[int, float] = field(default_factory=dict)


@dataclass
class Report:
    """A task's condition as an agent reported it (wire-free copy of TaskReport)."""
    job_id: str
    task_type: str
    task_index: int
    attempt: int
    phase: str  # RUNNING | EXITED | FAILED_TO_START
    pid: int = 0
    exit_code: int | None = None
    signal: int | None = None
    message: str = ""
    log_tail: list[str] = field(default_factory=list)
    busy_port: int = 0
    listening: bool = False
    final_checkpoint: str = ""


@dataclass
class Progress:
    """How far a running task has got, sent with heartbeats (for the hang watchdog)."""
    job_id: str
    task_type: str
    task_index: int
    attempt: int
    output_bytes: int
    checkpoint: str = ""


@dataclass
class Plan:
    strategy: str
    placement: list[TaskPlacement] | None
    reason: str = ""
    tf_configs: dict[tuple[str, int], str] = field(default_factory=dict)
    spec: JobSpec | None = None  # with `auto` resolved


class Unplaceable(Exception):
    """A job that can never fit on the registered nodes."""


class Cluster:
    def __init__(self, lost_after_seconds: float = DEFAULT_LOST_AFTER_SECONDS):
        self.lost_after = lost_after_seconds
        self.nodes: dict[str, Node] = {}
        self.jobs: dict[str, J.Job] = {}
        self.dirty_jobs: set[str] = set()
        self.dirty_nodes: set[str] = set()

    # ---- nodes ---------------------------------------------------------------------------------

    def register(self, info: NodeInfo, reports: list[Report], session_id: str, now: float) -> list[J.Action]:
        """Adds or refreshes a node; raises ValueError when it would share ports with another node."""
        for other in self.ready_nodes():
            o = other.info
            if o.name != info.name and o.address == info.address and _ports(o) & _ports(info):
                raise ValueError(f"node.port_range_start/end: {info.name}'s ports {info.port_range[0]}-"
                                 f"{info.port_range[1]} overlap {o.name}'s on the same address {info.address} "
                                 f"({o.port_range[0]}-{o.port_range[1]}); give agents on one host disjoint ranges")
        node = self.nodes.get(info.name)
        if node is None:
            node = self.nodes[info.name] = Node(info=info)
        node.info, node.state, node.last_seen, node.session_id = info, READY, now, session_id
        self.dirty_nodes.add(info.name)
        actions: list[J.Action] = []
        reported = set()
        for report in reports:
            reported.add((report.job_id, report.task_type, report.task_index, report.attempt))
            actions += self.report(info.name, report, now)
        for job in self.live_jobs():
            for task in job.tasks:
                if task.node != info.name or not task.live:
                    continue
                if (job.id, task.type, task.index, task.attempt) in reported:
                    continue
                self.dirty_jobs.add(job.id)
                if task.state == J.T_LAUNCHING:  # the launch may have been lost with the old stream
                    actions.append(job.launch_action(task))
                else:
                    actions += job.on_lost(task, now, f"{info.name}'s agent no longer has this task")
        for job in self.live_jobs():
            # A restarted agent has lost its shipping orders: the chief's checkpoints still go out.
            decisive = job.decisive_task() if job.tasks else None
            if decisive is not None and decisive.node == info.name and decisive.state == J.T_RUNNING:
                actions += job.shipping()
        return actions + self.schedule(now)

    def heartbeat(self, name: str, session_id: str, now: float, progress: list[Progress] = ()) -> bool:
        """False when the node must register again (unknown, or it was declared lost)."""
        node = self.nodes.get(name)
        if node is None or node.session_id != session_id or node.state != READY:
            return False
        node.last_seen = now
        for p in progress:
            job = self.jobs.get(p.job_id)
            task = job.task(p.task_type, p.task_index) if job else None
            if task is not None and task.node == name and task.attempt == p.attempt and task.live:
                job.on_progress(task, p.output_bytes, p.checkpoint, now)
        return True

    def expire(self, now: float) -> list[J.Action]:
        """Nodes silent for longer than the timeout become LOST; their tasks count as failed."""
        actions: list[J.Action] = []
        for node in self.nodes.values():
            if node.state == READY and now - node.last_seen > self.lost_after:
                node.state = LOST
                self.dirty_nodes.add(node.info.name)
                why = f"node {node.info.name} lost (no heartbeat for {now - node.last_seen:.1f} s)"
                for job in self.live_jobs():
                    if job.syncing and job.sync_source == node.info.name:
                        self.dirty_jobs.add(job.id)
                        actions += job.on_sync_done(job.syncing, False, why, now)
                    for task in job.tasks:
                        if task.node == node.info.name and task.live:
                            self.dirty_jobs.add(job.id)
                            actions += job.on_lost(task, now, why)
        return actions + (self.schedule(now) if actions else [])

    def ready_nodes(self) -> list[Node]:
        return sorted((n for n in self.nodes.values() if n.state == READY), key=lambda n: n.info.name)

    def capacity(self, idle: bool = False, now: float = 0.0) -> list[NodeCapacity]:
        used_gpus: dict[str, set[int]] = {}
        used_ports: dict[str, set[int]] = {n.info.name: {p for p, until in n.busy_ports.items() if until > now}
                                           for n in self.ready_nodes()} if not idle else {}
        if not idle:
            for job in self.jobs.values():
                for task in job.tasks:
                    if task.live:
                        used_gpus.setdefault(task.node, set()).update(g.index for g in task.gpus)
                        used_ports.setdefault(task.node, set()).add(task.port)
        return [NodeCapacity(n.info.name, n.info.address, n.info.gpus, n.info.port_range,
                             frozenset(used_gpus.get(n.info.name, ())), frozenset(used_ports.get(n.info.name, ())))
                for n in self.ready_nodes()]

    # ---- jobs ----------------------------------------------------------------------------------

    def live_jobs(self) -> list[J.Job]:
        return sorted((j for j in self.jobs.values() if not j.terminal), key=lambda j: (j.created, j.id))

    def plan(self, spec: JobSpec, now: float) -> Plan:
        capacity = self.capacity(now=now)
        spec = choose_strategy(spec, capacity)
        result = place(spec, capacity)
        if isinstance(result, Unfit):
            return Plan(spec.strategy, None, result.reason)
        return Plan(spec.strategy, result,
                    tf_configs=build_tf_configs([(p.type, p.index, p.address) for p in result]), spec=spec)

    def submit(self, job_id: str, spec: JobSpec, now: float) -> tuple[J.Job, list[J.Action]]:
        """Accepts a job (PENDING, then placed at once if it fits) or raises Unplaceable."""
        spec = choose_strategy(spec, self.capacity(now=now))
        never = place(spec, [n.idle() for n in self.capacity()])
        if isinstance(never, Unfit):
            raise Unplaceable(never.reason)
        job = J.Job(id=job_id, spec=spec, strategy=spec.strategy, created=now,
                    tasks=[J.Task(type=t, index=i) for t, i in task_list(spec)])
        self.jobs[job_id] = job
        self.dirty_jobs.add(job_id)
        return job, self.schedule(now)

    def schedule(self, now: float) -> list[J.Action]:
        """Places every PENDING job that fits now, oldest first, and tasks that lost their node."""
        actions: list[J.Action] = []
        for job in self.live_jobs():
            unplaced = job.unplaced_tasks()
            if unplaced:
                result = place(job.spec, self.capacity(now=now), only={(t.type, t.index) for t in unplaced})
                if not isinstance(result, Unfit):
                    self.dirty_jobs.add(job.id)
                    job.know_nodes({n.info.name: n.info.state_dir for n in self.ready_nodes()},
                                   {n.info.name: n.info.peer_address for n in self.ready_nodes()})
                    actions += job.place_again(result)
                continue
            if job.state != J.PENDING or job.not_before > now:
                continue
            result = place(job.spec, self.capacity(now=now), previous=job.previous_places())
            self.dirty_jobs.add(job.id)
            if isinstance(result, Unfit):
                job.on_unplaceable(result.reason, never=False, now=now)
                continue
            dirs = {n.info.name: n.info.state_dir for n in self.ready_nodes()}
            peers = {n.info.name: n.info.peer_address for n in self.ready_nodes()}
            actions += job.place(result, dirs, now, peers)
        return actions

    def report(self, node_name: str, report: Report, now: float) -> list[J.Action]:
        """Applies an agent's task report; stale or unknown running tasks are told to stop."""
        job = self.jobs.get(report.job_id)
        task = job.task(report.task_type, report.task_index) if job else None
        current = task is not None and task.node == node_name and task.attempt == report.attempt
        # A process running for a task that is not live (lost, given up, not launched yet) is stale too.
        if not current or (report.phase == "RUNNING" and not task.live):
            if report.phase == "RUNNING":
                return [J.Stop(node=node_name, job_id=report.job_id, task_type=report.task_type,
                               task_index=report.task_index, attempt=report.attempt,
                               grace_seconds=job.spec.stop_grace_seconds if job else 0.0)]
            return []
        self.dirty_jobs.add(job.id)
        if report.phase == "RUNNING":
            return job.on_running(task, report.pid, report.listening, now)
        if report.busy_port and node_name in self.nodes:
            self.nodes[node_name].busy_ports[report.busy_port] = now + BUSY_PORT_AVOID_SECONDS
        actions = job.on_exit(task, report.exit_code, report.signal, report.message, report.log_tail, now,
                              busy_port=report.busy_port, final_checkpoint=report.final_checkpoint)
        return actions + self.schedule(now)

    def stop(self, job_id: str, now: float, graceful: bool = True) -> list[J.Action]:
        job = self.jobs[job_id]
        self.dirty_jobs.add(job_id)
        return job.stop(now, graceful)

    def sync_done(self, job_id: str, sync_id: int, ok: bool, message: str, now: float) -> list[J.Action]:
        job = self.jobs.get(job_id)
        if job is None:
            return []
        self.dirty_jobs.add(job_id)
        return job.on_sync_done(sync_id, ok, message, now)

    def evaluation(self, node_name: str, job_id: str, task_type: str, task_index: int, attempt: int,
                   result: dict) -> None:
        """An evaluator's result, kept when it comes from the job's current evaluator."""
        job = self.jobs.get(job_id)
        task = job.task(task_type, task_index) if job else None
        if task is None or task.node != node_name or task.attempt != attempt:
            return
        job.on_evaluation(result)
        self.dirty_jobs.add(job_id)

    def tick(self, now: float) -> list[J.Action]:
        """Periodic work: node liveness, deadlines, and jobs whose restart backoff has passed."""
        actions = self.expire(now)
        for job in self.live_jobs():
            deadline_actions = job.on_tick(now)
            if deadline_actions:
                self.dirty_jobs.add(job.id)
                actions += deadline_actions
        return actions + self.schedule(now)



def _ports(info: NodeInfo) -> set[int]:
    """Every port a node's agent uses: its task range and its own peer port."""
    return set(range(info.port_range[0], info.port_range[1] + 1)) | ({info.peer_port} if info.peer_port else set())
