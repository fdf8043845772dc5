"""The coordinator's model of the cluster: nodes, their liveness, jobs, and what runs where. Pure.

Every event (a registration, a heartbeat, a report, a submission, a tick) goes through one method that
takes the time as an argument and returns the commands to send; the server only adds the event loop, the
store and the agents' streams around it. Jobs change through lifecycle.py; each heartbeat reconciles its
node (reconcile.py), so a lost message heals within a few seconds instead of waiting for a deadline.
"""

from __future__ import annotations

import bisect
import logging
from collections import OrderedDict
from dataclasses import dataclass, field, replace

from tfcluster import strategies
from tfcluster.daemon.coordinator import checkpoints, lifecycle, taskusers
from tfcluster.daemon.coordinator.changelog import ChangeLog, JobAdded, JobEnded, JobRemoved, JobsNumbered, NodeAdded
from tfcluster.daemon.coordinator.job import Job, Task
from tfcluster.daemon.coordinator.membership import Membership
from tfcluster.daemon.coordinator.observer import Observer
from tfcluster.daemon.coordinator.node import Node
from tfcluster.daemon.coordinator.scheduler import NodeCapacity, TaskPlacement, Unfit, place, task_list
from tfcluster.daemon.logformat import fields
from tfcluster.model import Attempt, Command, Evaluation, Stop, TaskExit, TaskReport
from tfcluster.roles.tfconfig import build_tf_configs
from tfcluster.spec import JobSpec
from tfcluster.states import JobState, NodeState, Phase

log = logging.getLogger("tfcluster.coordinator")

DEFAULT_LOST_AFTER_SECONDS = 3.0
BUSY_PORT_AVOID_SECONDS = 600.0
RESEND_AFTER_SECONDS = 3.0
FULL_SCHEDULE_SECONDS = 10.0
KEEP_FINISHED_JOBS = 1000
KEEP_FINISHED_SECONDS = 7 * 86400.0


class Unplaceable(Exception):
    """A job that can never fit on the registered nodes."""


@dataclass
class Plan:
    strategy: str
    placement: list[TaskPlacement] | None
    reason: str = ""
    tf_configs: dict[tuple[str, int], str] = field(default_factory=dict)
    spec: JobSpec | None = None  # with `auto` resolved


class Cluster(Membership):
    def __init__(self, lost_after_seconds: float = DEFAULT_LOST_AFTER_SECONDS,
                 resend_after_seconds: float = RESEND_AFTER_SECONDS, keep_finished_jobs: int = KEEP_FINISHED_JOBS,
                 keep_finished_seconds: float = KEEP_FINISHED_SECONDS,
                 task_uids: taskusers.UidRange = taskusers.UidRange()):
        self.lost_after = lost_after_seconds
        self.resend_after = resend_after_seconds
        self.keep_finished_jobs, self.keep_finished_seconds = keep_finished_jobs, keep_finished_seconds
        self.nodes: dict[str, Node] = {}
        self.jobs: dict[str, Job] = {}
        self.live: dict[str, Job] = {}    # jobs not ended, oldest first
        self.ended: dict[str, Job] = {}   # ended jobs, in the order they ended (retention removes from the front)
        self.changes = ChangeLog()        # what the store has yet to write
        self.cluster_tag = ""             # ends every job id: ids of another state dir's jobs never collide
        self.requests: dict[str, str] = {}  # a submission's client request id -> its job
        self.task_uids = task_uids
        self.uid_holders: dict[int, Job] = {}  # task UID -> the kept job that has it
        self.next_number = 1
        # node -> {(job id, task key): task}: what is placed where. Entries can go stale (a task moved, a job
        # removed); readers check task.node and drop those.
        self.placed: dict[str, dict[tuple[str, str], tuple[Job, Task]]] = {}
        self.by_address: dict[str, set[str]] = {}
        self.names: list[str] = []  # every node's name, sorted (placement and status pages go in this order)
        self.idle: dict[str, NodeCapacity] = {}  # each node's capacity when nothing runs on it
        # READY nodes, the one heard from longest ago first: expiry looks at the front only.
        self.heard: OrderedDict[str, None] = OrderedDict()
        self.capacity_version = 0   # bumped whenever resources may have been freed or added
        self.unfit_at: dict[str, int] = {}  # PENDING job -> capacity version at which it last did not fit
        self.full_schedule_at = 0.0
        self.observer = Observer()  # the metrics, when the daemon serves them
        self.mass_silence_since = 0.0  # when most nodes fell silent at once (expiry waits a while); 0: not now

    # ---- loading -------------------------------------------------------------------------------

    def add_job(self, job: Job) -> None:
        """A job from the store (or a new one)."""
        if job.uid:
            self.uid_holders.setdefault(job.uid, job)
        self.jobs[job.id] = job
        (self.ended if job.ended else self.live)[job.id] = job
        if job.request_id:
            self.requests[job.request_id] = job.id
        self.next_number = max(self.next_number, job.number + 1)
        self._track(job)
        self.changes.append(JobAdded(job))

    def assign_missing_uids(self) -> None:
        """Live jobs saved by a coordinator before 0.3 have no task UID: each gets one now, after every kept job
        was loaded (none may take a UID another holds) and before any of their tasks is launched again."""
        for job in self.live.values():
            if not job.uid:
                job.uid = self._allocate_uid(job.number)
                self.uid_holders[job.uid] = job

    def add_node(self, node: Node) -> None:
        if node.name not in self.nodes:
            bisect.insort(self.names, node.name)
        self.nodes[node.name] = node
        self.by_address.setdefault(node.info.address, set()).add(node.name)
        i = node.info
        self.idle[node.name] = NodeCapacity(i.name, i.address, i.gpus, i.port_range)
        self.changes.append(NodeAdded(node))
        if node.state == NodeState.READY:
            self.heard[node.name] = None
            self.heard.move_to_end(node.name)

    # ---- jobs ----------------------------------------------------------------------------------

    def plan(self, spec: JobSpec, now: float) -> Plan:
        capacity = self.capacity(now)
        spec = strategies.resolve(spec, {n.name: n.free_gpus for n in capacity} if spec.strategy == "auto" else None)
        result = place(spec, capacity)
        if isinstance(result, Unfit):
            return Plan(spec.strategy, None, result.reason, spec=spec)
        return Plan(spec.strategy, result, spec=spec,
                    tf_configs=build_tf_configs([(p.type, p.index, p.address) for p in result]))

    def submit(self, spec: JobSpec, now: float, request_id: str = "") -> tuple[Job, list[Command]]:
        """Accepts a job (PENDING, then placed at once if it fits) or raises Unplaceable. A submission
        retried with the same request id gets the job of the first."""
        if request_id and request_id in self.requests:
            return self.jobs[self.requests[request_id]], []
        capacity = self.capacity(now)
        spec = strategies.resolve(spec, {n.name: n.free_gpus for n in capacity} if spec.strategy == "auto" else None)
        never = place(spec, [self.idle[n.name] for n in capacity])
        if isinstance(never, Unfit):
            raise Unplaceable(never.reason)
        try:
            uid = self._allocate_uid(self.next_number)
        except taskusers.RangeExhausted as e:
            raise Unplaceable(str(e)) from None
        number, self.next_number = self.next_number, self.next_number + 1
        self.changes.append(JobsNumbered(self.next_number))
        job_id = f"{spec.name}-{number}-{self.cluster_tag}" if self.cluster_tag else f"{spec.name}-{number}"
        job = Job(id=job_id, spec=spec, number=number, request_id=request_id, created=now, uid=uid,
                  tasks=[Task(type=t, index=i) for t, i in task_list(spec)])
        self.add_job(job)
        return job, self.schedule(now)

    def schedule(self, now: float) -> list[Command]:
        """Places every PENDING job that fits now, oldest first, and tasks that lost their node. A job that
        did not fit is tried again only once resources may have changed."""
        waiting = [j for j in self.live.values()
                   if (j.state == JobState.PENDING and j.not_before <= now) or lifecycle.unplaced_tasks(j, now)]
        waiting = [j for j in waiting if self.unfit_at.get(j.id) != self.capacity_version]
        if not waiting:
            return []
        capacity = {n.name: n for n in self.capacity(now)}
        commands: list[Command] = []
        for job in waiting:
            unplaced = lifecycle.unplaced_tasks(job, now)
            if unplaced:
                result = place(job.spec, list(capacity.values()), only={(t.type, t.index) for t in unplaced})
            else:
                result = place(job.spec, list(capacity.values()),
                               previous={(t.type, t.index): (t.node, t.port) for t in job.tasks if t.node})
            if isinstance(result, Unfit):
                self.unfit_at[job.id] = self.capacity_version
                if not unplaced:
                    lifecycle.unplaceable(job, result.reason, never=False, now=now)
                continue
            self.unfit_at.pop(job.id, None)
            if unplaced:
                commands += lifecycle.place_again(job, result, self.info_of, now)
            else:
                commands += lifecycle.place(job, result, self.info_of, now)
                self.observer.placed(job, max(0.0, now - max(job.created, job.not_before)))
            self._track(job)
            for p in result:  # what this job now holds is not free for the next one
                n = capacity[p.node]
                capacity[p.node] = replace(n, used_gpus=n.used_gpus | {g.index for g in p.gpus},
                                           used_ports=n.used_ports | {p.port})
        return commands

    def report(self, node_name: str, report: TaskReport, now: float) -> list[Command]:
        """Applies an agent's task report; a running attempt nobody wants is told to stop."""
        return self._apply(node_name, report, now) + self.schedule(now)

    def _apply(self, node_name: str, report: TaskReport, now: float) -> list[Command]:
        a = report.attempt
        job = self.jobs.get(a.job_id)
        task = job.task(a.type, a.index) if job else None
        current = task is not None and task.node == node_name and task.attempt == a.number
        # A process running for a task that is not live (lost, given up, not launched yet) is stale too.
        if not current or (report.phase == Phase.RUNNING and not task.live):
            if report.phase == Phase.RUNNING:
                return [_stop_unwanted(node_name, a, job)]
            return []
        if report.phase == Phase.RUNNING:
            return self._settle(job, lifecycle.running(job, task, report.pid, report.listening, now))
        exit = report.exit or TaskExit(message="ended without a report of how")
        node = self.nodes.get(node_name)
        if exit.busy_port and node is not None and node.info.port_range[0] <= exit.busy_port <= node.info.port_range[1]:
            node.seen.busy_ports[exit.busy_port] = now + BUSY_PORT_AVOID_SECONDS
        self.capacity_version += 1
        return self._settle(job, lifecycle.ended(job, task, exit, now))

    def stop(self, job_id: str, now: float, graceful: bool = True) -> list[Command]:
        job = self.jobs[job_id]
        return self._settle(job, lifecycle.stop(job, now, graceful))

    def sync_done(self, node: str, job_id: str, sync_id: int, ok: bool, message: str, now: float) -> list[Command]:
        """The answer of a copy, from the node that was told to copy (another node's answer changes nothing)."""
        job = self.live.get(job_id)
        if job is None or job.sync_source != node:
            return []
        return self._settle(job, lifecycle.sync_done(job, sync_id, ok, message, now))

    def evaluation(self, node_name: str, attempt: Attempt, result: Evaluation, now: float) -> list[Command]:
        """An evaluator's result, kept when it comes from the job's current evaluator (the job has not ended: its
        evaluator's last results arrive before its exit). The final checkpoint's lets a finished job end."""
        job = self.live.get(attempt.job_id)
        task = job.task(attempt.type, attempt.index) if job else None
        if task is None or task.node != node_name or task.attempt != attempt.number:
            return []
        job.add_evaluation(result)
        return self._settle(job, lifecycle.evaluated(job, now))

    def tick(self, now: float) -> list[Command]:
        """Periodic work: node liveness, deadlines, answers that never came, jobs whose backoff has passed,
        and retention of ended jobs."""
        commands = self.expire(now)
        for job in list(self.live.values()):
            try:
                commands += self._settle(job, lifecycle.tick(job, now) + self._orphans(job, now))
                commands += self._resend(job, now)
            except Exception:  # a bug in one job must not stop every other job's deadlines
                log.exception("tick of %s failed", job.id, extra=fields(job=job.id))
        if now - self.full_schedule_at >= FULL_SCHEDULE_SECONDS:
            # Whatever an event forgot to say about freed resources, every waiting job is tried again now and then.
            self.capacity_version, self.full_schedule_at = self.capacity_version + 1, now
        commands += self.schedule(now)
        self.prune(now)
        return commands

    def _orphans(self, job: Job, now: float) -> list[Command]:
        """Tasks on a node that is not READY (it was lost between placement and a later launch wave, or
        during a restart in place) are lost too: nothing will ever hear from them."""
        commands: list[Command] = []
        for task in job.tasks:
            if task.node and self.info_of(task.node) is None:
                commands += lifecycle.lost(job, task, f"node {task.node} is not READY", now)
        return commands

    def _resend(self, job: Job, now: float) -> list[Command]:
        """The final checkpoint and a checkpoint copy are told again until answered (the agent keeps a copy's
        answer, and writing the final checkpoint again is harmless)."""
        evaluator = job.evaluator()
        if job.final_evaluation_until and evaluator is not None and evaluator.live and \
                now - job.seen.finish_sent_at >= self.resend_after:
            return [lifecycle.finish_training(job, now)]
        source = self.info_of(job.sync_source) if job.syncing else None
        if source is not None and source.keeps_sync_answers and now - job.seen.sync_sent_at >= self.resend_after:
            return checkpoints.sync_commands(job, now)
        return []

    def prune(self, now: float) -> None:
        """Removes the oldest ended jobs beyond --keep-finished-jobs, and those ended longer ago than allowed."""
        while self.ended:
            job = next(iter(self.ended.values()))
            if len(self.ended) <= self.keep_finished_jobs and now - job.finished <= self.keep_finished_seconds:
                return
            del self.ended[job.id], self.jobs[job.id]
            self.requests.pop(job.request_id, None)
            if self.uid_holders.get(job.uid) is job:
                del self.uid_holders[job.uid]
            self.unfit_at.pop(job.id, None)
            self.changes.append(JobRemoved(job))

    # ---- helpers -------------------------------------------------------------------------------

    def _settle(self, job: Job, commands: list[Command]) -> list[Command]:
        """After any change to a job: its restarts are counted; an ended job leaves the live ones and frees its
        resources."""
        for cause in job.seen.restart_causes:
            self.observer.restarted(job, cause)
        job.seen.restart_causes.clear()
        if job.ended and job.id in self.live:
            del self.live[job.id]
            self.ended[job.id] = job
            self.changes.append(JobEnded(job))
            self.observer.ended(job)
            self.unfit_at.pop(job.id, None)
            self.capacity_version += 1
        return commands

    def _allocate_uid(self, number: int) -> int:
        def holder(uid: int) -> Job | None:
            return self.uid_holders.get(uid)
        return taskusers.allocate(number, self.task_uids, lambda uid: (j := holder(uid)) is not None and not j.ended,
                                  lambda uid: holder(uid) is not None)

    def _track(self, job: Job) -> None:
        for task in job.tasks:
            if task.node:
                self.placed.setdefault(task.node, {})[(job.id, task.key)] = (job, task)

    def placed_on(self, name: str) -> list[tuple[Job, Task]]:
        """The tasks placed on a node, with stale index entries dropped."""
        entries = self.placed.get(name, {})
        stale = [k for k, (job, task) in entries.items() if task.node != name or self.jobs.get(job.id) is not job]
        for key in stale:
            del entries[key]
        return list(entries.values())


def _stop_unwanted(node: str, attempt: Attempt, job: Job | None) -> Command:
    return Stop(node=node, attempt=attempt, grace_seconds=job.spec.stop_grace_seconds if job else 0.0)
