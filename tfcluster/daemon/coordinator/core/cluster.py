"""The coordinator's model of the cluster: nodes, their liveness, jobs, and what runs where. Pure.

Every event (a registration, a heartbeat, a report, a submission, a tick) goes through one method that
takes the time as an argument and returns the commands to send; the server only adds the event loop, the
store and the agents' streams around it. Jobs change through core/lifecycle/transitions.py; each heartbeat reconciles its
node (reconcile.py), so a lost message heals within a few seconds instead of waiting for a deadline.

The nodes (core/model/node_table.py: registry, liveness, what is placed where) and the jobs (core/model/job_table.py: live and ended ones,
request ids, task UIDs, numbering, retention) each keep their own indexes; an event here changes both, and
hands every job it changed to settle, which tells each of them. A scheduling pass is core/scheduling_pass.py; what
happens to nodes besides their agents' messages (loss, removal, drain, health) is core/node_events.py; what owners
have used (fair share, quotas' windows, `tfcluster usage`) is core/usage_queries.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tfcluster import strategies
from tfcluster.commands import Command, Stop
from tfcluster.conditions import NodeCondition
from tfcluster.daemon.coordinator.core.lifecycle import checkpoint_copies
from tfcluster.daemon.coordinator.core.lifecycle import transitions as lifecycle
from tfcluster.daemon.coordinator.core.lifecycle.launch import launch_commands
from tfcluster.daemon.coordinator.core.lifecycle.reconcile import reconcile_node
from tfcluster.daemon.coordinator.core.model import accounting, ledger
from tfcluster.daemon.coordinator.core.model import task_uids as taskusers
from tfcluster.daemon.coordinator.core.model.changelog import ChangeLog, UsageDropped, UsageRecorded
from tfcluster.daemon.coordinator.core.model.held import Held
from tfcluster.daemon.coordinator.core.model.job import Job, Task
from tfcluster.daemon.coordinator.core.model.job_table import KEEP_FINISHED_JOBS, KEEP_FINISHED_SECONDS, Jobs
from tfcluster.daemon.coordinator.core.node_events import DEFAULT_FORGET_LOST_SECONDS, NodeEvents
from tfcluster.daemon.coordinator.core.model.node import Node
from tfcluster.daemon.coordinator.core.model.node_table import Nodes
from tfcluster.daemon.coordinator.core.model.pace import Pace
from tfcluster.daemon.coordinator.core.model.sweep import Sweeps
from tfcluster.daemon.coordinator.core.model.observer import Observer
from tfcluster.daemon.coordinator.core.scheduling import preemption
from tfcluster.daemon.coordinator.core.scheduling import queue
from tfcluster.daemon.coordinator.core.scheduling.elastic import place_sized
from tfcluster.daemon.coordinator.core.scheduling.placement import NodeCapacity, TaskPlacement, Unfit
from tfcluster.daemon.coordinator.core.scheduling.policy import NO_POLICY, ClassRefused, Policy
from tfcluster.daemon.coordinator.core.scheduling_pass import SchedulePass, grow_elastic
from tfcluster.daemon.coordinator.core.sweep_events import SweepEvents
from tfcluster.daemon.coordinator.core.usage_queries import UsageQueries
from tfcluster.daemon.logformat import fields
from tfcluster.model import Attempt, Evaluation, NodeInfo, TaskExit, TaskProgress, TaskReport
from tfcluster.roles.tfconfig import build_tf_configs
from tfcluster.spec import JobSpec
from tfcluster.states import JobState, Phase, TaskState

log = logging.getLogger("tfcluster.coordinator")

DEFAULT_LOST_AFTER_SECONDS = 3.0
DEFAULT_HEARTBEAT_INTERVAL_SECONDS = 1.0
# A restarted agent registers again within a few seconds, even on a loaded host; a host that is really gone
# usually fails its peer tasks sooner than this (their job then restarts at once).
DEFAULT_TASK_GRACE_SECONDS = 20.0
BUSY_PORT_AVOID_SECONDS = 600.0
RESEND_AFTER_SECONDS = 3.0
FULL_SCHEDULE_SECONDS = 10.0


class Unplaceable(Exception):
    """A job that can never fit on the registered nodes."""


@dataclass
class Plan:
    strategy: str
    placement: list[TaskPlacement] | None
    reason: str = ""
    tf_configs: dict[tuple[str, int], str] = field(default_factory=dict)
    spec: JobSpec | None = None  # with `auto` resolved


class Cluster(NodeEvents, SweepEvents, UsageQueries):
    """The nodes (core/model/node_table.py) and the jobs (core/model/job_table.py), each keeping its own indexes, and the events that change
    them together; the sweeps (core/sweep_events.py), whose trials are its jobs."""
    refusals = (Unplaceable, ClassRefused)  # what submit raises for a job it refuses

    def __init__(self, lost_after_seconds: float = DEFAULT_LOST_AFTER_SECONDS,
                 resend_after_seconds: float = RESEND_AFTER_SECONDS, keep_finished_jobs: int = KEEP_FINISHED_JOBS,
                 keep_finished_seconds: float = KEEP_FINISHED_SECONDS,
                 task_uids: taskusers.UidRange = taskusers.UidRange(),
                 keep_usage_seconds: float = ledger.DEFAULT_KEEP_USAGE_SECONDS,
                 heartbeat_interval_seconds: float = DEFAULT_HEARTBEAT_INTERVAL_SECONDS,
                 max_heartbeats_per_second: float = 0.0, task_grace_seconds: float = DEFAULT_TASK_GRACE_SECONDS,
                 startup_grace_seconds: float = 0.0, forget_lost_seconds: float = DEFAULT_FORGET_LOST_SECONDS):
        self.changes = ChangeLog()  # what the store has yet to write: nodes and jobs append to it
        self.nodes = Nodes(Pace(heartbeat_interval_seconds, lost_after_seconds, max_heartbeats_per_second),
                           self.changes, startup_grace_seconds)
        self.jobs = Jobs(task_uids, keep_finished_jobs, keep_finished_seconds, self.changes)
        self.held = Held()  # what the placed tasks hold on each node, kept as jobs change (settle)
        self.sweeps = Sweeps()
        self.usage = ledger.Ledger(keep_usage_seconds, lambda entry, recorded: self.changes.append(
            UsageRecorded(entry) if recorded else UsageDropped(entry.job_id)))
        self.resend_after = resend_after_seconds
        self.task_grace = task_grace_seconds  # after its node is LOST, before a task counts as lost (_orphans)
        self.forget_lost_after, self.forget_checked_at = forget_lost_seconds, 0.0  # node_events.forget_long_lost
        self.unfit_at: dict[str, int] = {}  # PENDING job -> capacity version at which it last did not fit
        self.policy: Policy = NO_POLICY  # classes and quotas (policy.py); none: first come, first placed
        self.holds: dict[str, queue.Hold] = {}  # waiting job at the head of its class -> what it holds
        self.no_growth_at: dict[str, int] = {}  # elastic job -> capacity version at which it could not grow
        self.full_schedule_at = 0.0
        # Set by the coordinator, which then runs one scheduling pass per batch of events (before each store write,
        # store/persistence.py) instead of one per submission, registration and task report: under load one write
        # carries many events, and a pass looks at every waiting job. Left unset, as in tests of the core, each of
        # those events places what it can at once.
        self.schedule_per_batch = False
        self.observer = Observer()  # the metrics, when the daemon serves them

    # ---- loading -------------------------------------------------------------------------------

    def add_job(self, job: Job) -> None:
        """A job from the store."""
        self.jobs.add(job)
        self._index(job)

    def add_node(self, node: Node) -> None:
        """A node from the store."""
        self.nodes.add(node)

    # ---- nodes -------------------------------------------------------------------------------

    def register(self, info: NodeInfo, reports: list[TaskReport], session_id: str, now: float,
                 health_failure: str = "", conditions: tuple[NodeCondition, ...] = ()) -> list[Command]:
        """Adds or refreshes a node, with what its agent runs, what its health check said and what its GPU check
        found (conditions: a sick GPU is left out of placement). Raises NameTaken
        (core/model/node_table.py) when another live agent holds the name, ValueError when the node would share
        ports with another agent on its address."""
        self.nodes.register(info, session_id, now)
        self._health(info.name, health_failure, now)
        self.nodes.set_conditions(info.name, conditions)
        commands: list[Command] = []
        reported = {r.attempt for r in reports}
        for report in reports:
            commands += self._apply(info.name, report, now)
        for job, task in self.nodes.placed_on(info.name):
            task.seen.node_silent = ""  # its node is back
            if task.live and job.attempt_of(task) not in reported:
                if task.state == TaskState.LAUNCHING:  # the launch may have been lost with the old stream
                    task.seen.sent_at = now
                    commands += launch_commands(job, task)
                else:
                    commands += self.settle(job, lifecycle.lost(job, task, f"{info.name}'s agent no longer has "
                                                                           f"this task", now))
            # A restarted agent has lost its shipping orders, or which node alone may send it the chief's
            # checkpoints: both are told again.
            if (task is job.decisive_task() or task is job.evaluator()) and job.decisive_task().state == TaskState.RUNNING:
                commands += checkpoint_copies.shipping(job)
        return commands + self._schedule_after_event(now)

    def heartbeat(self, name: str, session_id: str, now: float, progress: list[TaskProgress] = (),
                  condition: str = "", health_failure: str = "",
                  conditions: tuple[NodeCondition, ...] = ()) -> list[Command] | None:
        """The node's agent is alive, runs what `progress` lists, and takes new tasks unless `condition` says
        why not; health_failure: its health check's failure, if it failed; conditions: what its GPU check found.
        Returns what reconcile sends, or None when the agent must register again."""
        if not self.nodes.alive(name, session_id, now):
            return None
        self.nodes.set_condition(name, condition)
        self._health(name, health_failure, now)
        self.nodes.set_conditions(name, conditions)
        if not progress and not self.nodes.has_placed(name):
            return []
        for p in progress:
            job = self.jobs.get(p.attempt.job_id)
            task = job.task(p.attempt.type, p.attempt.index) if job else None
            if task is not None and task.node == name and task.attempt == p.attempt.number and task.live:
                lifecycle.progress(job, task, p.output_bytes, p.checkpoint, now)
                task.seen.live = accounting.Usage(cpu_seconds=p.cpu_seconds, peak_rss_bytes=p.peak_rss_bytes)
                task.seen.detail = p.phase_detail
        placed = self.nodes.placed_on(name)
        before = [(task.state, task.attempt) for _, task in placed]
        commands = reconcile_node(name, placed, (p.attempt for p in progress), self.jobs,
                                  self.nodes[name].seen.stops_sent, now, self.resend_after)
        # Reconcile changes a job only by ending one of its tasks here (which may relaunch it in place, as a new
        # attempt): those jobs alone are settled, as settling a large job costs a pass over its tasks, and every
        # one of its nodes heartbeats each second.
        changed = {id(job): job for (job, task), was in zip(placed, before) if (task.state, task.attempt) != was}
        for job in changed.values():
            commands = self.settle(job, commands)
        return commands

    # ---- jobs ----------------------------------------------------------------------------------

    def plan(self, spec: JobSpec, now: float) -> Plan:
        capacity = self.capacity(now)
        spec = strategies.resolve(spec, {n.name: n.free_gpus for n in capacity} if spec.strategy == "auto" else None)
        result = place_sized(spec, capacity)
        if isinstance(result, Unfit):
            return Plan(spec.strategy, None, result.reason, spec=spec)
        return Plan(spec.strategy, result, spec=spec,
                    tf_configs=build_tf_configs([(p.type, p.index, p.address) for p in result]))

    def submit(self, spec: JobSpec, now: float, request_id: str = "", owner: str = "",
               groups: tuple[str, ...] = ()) -> tuple[Job, list[Command]]:
        """Accepts a job (PENDING, then placed at once if it fits) or raises Unplaceable, or ClassRefused
        (policy.py) for a priority class the owner may not have. A submission retried with the same request id
        gets the job of the first. owner and groups: the submitter's."""
        earlier = self.jobs.by_request(request_id)
        if earlier is not None:
            return earlier, []
        # What the tasks hold is read only where the strategy depends on it: the schedule below reads it anyway.
        free = {n.name: n.free_gpus for n in self.capacity(now)} if spec.strategy == "auto" else None
        spec = strategies.resolve(spec, free)
        chosen = self.policy.resolve(spec.priority, owner, groups)
        never = place_sized(spec, self.nodes.idle_ready())
        if isinstance(never, Unfit):
            raise Unplaceable(never.reason)
        over = queue.never_within_quota(spec, self.policy.subjects(owner, groups))
        if over:
            raise Unplaceable(over)
        try:
            job = self.jobs.new(spec, request_id, now, owner, groups)
        except taskusers.RangeExhausted as e:
            raise Unplaceable(str(e)) from None
        job.priority, job.rank, job.preemptible = chosen.name, chosen.value, chosen.preemptible
        return job, self._schedule_after_event(now)

    def schedule(self, now: float) -> list[Command]:
        """Places tasks that lost their node, then jobs that preempted others once what they freed is there, then
        the PENDING jobs that fit now in queue order (queue.py); those that wait for resources may preempt jobs of
        lower classes (preemption.py). A job that did not fit is tried again only once resources may have changed
        (or the policy did)."""
        version, unfit_at = self.nodes.capacity_version, self.unfit_at
        pending, repairs, changed = [], [], False
        for job in self.jobs.to_place.values():  # the PENDING jobs and those that lost a task's node
            if job.state == JobState.PENDING:
                if job.not_before <= now:
                    pending.append(job)
                    changed = changed or unfit_at.get(job.id) != version
            elif unfit_at.get(job.id) != version and lifecycle.unplaced_tasks(job, now):
                repairs.append(job)
        if not repairs and not changed:
            return []
        repairs.sort(key=lambda job: job.number)  # the oldest first, as they were submitted
        return SchedulePass(self, now).run(repairs, pending)

    def _schedule_after_event(self, now: float) -> list[Command]:
        """The pass after a frequent event (a submission, a registration, a task's report), unless the caller runs
        one per batch of events (schedule_per_batch)."""
        return [] if self.schedule_per_batch else self.schedule(now)

    def set_policy(self, policy: Policy) -> None:
        """A policy (re)loaded: new submissions are resolved against it, and every waiting job is tried again
        under its quotas (jobs keep the class they were given)."""
        self.policy = policy
        self.holds.clear()
        self.nodes.resources_changed()

    def queue_order(self, now: float) -> list[Job]:
        """The PENDING jobs in the order they are placed (those in a restart's backoff included)."""
        pending = [j for j in self.jobs.live.values() if j.state == JobState.PENDING]
        shares = self.fair_share(now, self.policy.fair_share_half_life) if self.policy.source and pending else {}
        return queue.order(pending, shares)

    def queue_positions(self, now: float) -> dict[str, int]:
        """PENDING job -> its place in the queue (1: placed next)."""
        return {job.id: n for n, job in enumerate(self.queue_order(now), 1)}

    def report(self, node_name: str, report: TaskReport, now: float) -> list[Command]:
        """Applies an agent's task report; a running attempt nobody wants is told to stop."""
        return self._apply(node_name, report, now) + self._schedule_after_event(now)

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
            return self._running(job, task, report, now)
        # A task that ended within moments of its start is reported once, its exit carrying the pid it ran as:
        # it ran, then it ended.
        commands = self._running(job, task, report, now) if report.pid and task.state == TaskState.LAUNCHING else []
        exit = report.exit or TaskExit(message="ended without a report of how")
        if exit.busy_port:
            self.nodes.port_busy(node_name, exit.busy_port, now + BUSY_PORT_AVOID_SECONDS)
        self.nodes.resources_changed()
        return commands + self.settle(job, lifecycle.ended(job, task, exit, now))

    def _running(self, job: Job, task: Task, report: TaskReport, now: float) -> list[Command]:
        was = job.state
        commands = self.settle(job, lifecycle.running(job, task, report.pid, report.listening, now))
        if was != JobState.RUNNING and job.state == JobState.RUNNING and not job.restarts and not job.preemptions:
            self.observer.started(job, max(0.0, now - job.created))
        return commands

    def stop(self, job_id: str, now: float, graceful: bool = True) -> list[Command]:
        job = self.jobs[job_id]
        return self.settle(job, lifecycle.stop(job, now, graceful))

    def sync_done(self, node: str, job_id: str, sync_id: int, ok: bool, message: str, now: float) -> list[Command]:
        """The answer of a copy, from the node that was told to copy (another node's answer changes nothing)."""
        job = self.jobs.live.get(job_id)
        if job is None or job.sync_source != node:
            return []
        return self.settle(job, lifecycle.sync_done(job, sync_id, ok, message, now))

    def evaluation(self, node_name: str, attempt: Attempt, result: Evaluation, now: float) -> list[Command]:
        """An evaluator's result, kept when it comes from the job's current evaluator. The final checkpoint's lets
        a finished job end. An ended job keeps its evaluator's late results too: an agent back from a reconnect
        resends its tasks' exits before the results reported just before them, and an acknowledged result is
        never dropped (a sweep ranks its trials by them)."""
        job = self.jobs.get(attempt.job_id)
        task = job.task(attempt.type, attempt.index) if job else None
        if task is None or task.node != node_name or task.attempt != attempt.number:
            return []
        job.add_evaluation(result)
        if job.ended:
            self.jobs.amended(job)
            return []
        return self.settle(job, lifecycle.evaluated(job, now))

    def tick(self, now: float) -> list[Command]:
        """Periodic work: node liveness, deadlines, answers that never came, jobs whose backoff has passed,
        and retention of ended jobs and of nodes long lost."""
        commands = self.expire(now)
        for job in list(self.jobs.ticking.values()):  # the live jobs but those that only wait in the queue
            try:
                commands += self.settle(job, lifecycle.tick(job, now) + self._orphans(job, now))
                commands += self._resend(job, now)
            except Exception:  # a bug in one job must not stop every other job's deadlines
                log.exception("tick of %s failed", job.id, extra=fields(job=job.id))
        if now - self.full_schedule_at >= FULL_SCHEDULE_SECONDS:
            # Whatever an event forgot to say about freed resources, every waiting job is tried again now and then.
            self.nodes.resources_changed()
            self.full_schedule_at = now
        commands += self.advance_sweeps(now)
        commands += self.schedule(now)
        commands += grow_elastic(self, now)
        self.prune(now)
        self.forget_long_lost(now)
        return commands

    def _resend(self, job: Job, now: float) -> list[Command]:
        """The final checkpoint and a checkpoint copy are told again until answered (the agent keeps a copy's
        answer, and writing the final checkpoint again is harmless)."""
        evaluator = job.evaluator()
        if job.final_evaluation_until and evaluator is not None and evaluator.live and \
                now - job.seen.finish_sent_at >= self.resend_after:
            return [lifecycle.finish_training(job, now)]
        source = self.nodes.info_of(job.sync_source) if job.syncing else None
        if source is not None and source.keeps_sync_answers and now - job.seen.sync_sent_at >= self.resend_after:
            return checkpoint_copies.sync_commands(job, now)
        return []

    def prune(self, now: float) -> None:
        """Removes the oldest ended jobs beyond --keep-finished-jobs, and those ended longer ago than allowed, and
        the usage ledger's entries older than --keep-usage-for; folds short jobs' entries into hours (ledger.py)."""
        for job in self.jobs.prune(now):
            self.unfit_at.pop(job.id, None)
            self.holds.pop(job.id, None)
        self.usage.prune(now)
        self.usage.fold(now)

    # ---- helpers -------------------------------------------------------------------------------

    def capacity(self, now: float) -> list[NodeCapacity]:
        """Every READY node with what its tasks hold (and ports found taken), and why it takes no new tasks,
        if it does not."""
        return self.nodes.capacity(now, self.held.gpus(), self.held.ports(), self.held.memory())

    def settle(self, job: Job, commands: list[Command]) -> list[Command]:
        """After any change to a job: its restarts are counted; an ended job leaves the live ones and frees its
        resources; the nodes index where its tasks are now, and what they hold there."""
        for cause in job.seen.restart_causes:
            self.observer.restarted(job, cause)
        job.seen.restart_causes.clear()
        if self.jobs.settle(job):
            entry = accounting.entry_of(job, job.finished)
            if entry.start:  # a job that never ran used nothing: the ledger keeps the jobs that did
                self.usage.record(entry)
            self.observer.ended(job)
            self.unfit_at.pop(job.id, None)
            self.holds.pop(job.id, None)
            self.no_growth_at.pop(job.id, None)
            preemption.release(job.id, self.jobs.live.values())  # what was kept for it, if it preempted
            self.nodes.resources_changed()
        self._index(job)
        return commands

    def _index(self, job: Job) -> None:
        """The job as it is now: where its tasks are placed, and what they hold there."""
        self.nodes.track(job)
        self.held.track(job)


def _stop_unwanted(node: str, attempt: Attempt, job: Job | None) -> Command:
    return Stop(node=node, attempt=attempt, grace_seconds=job.spec.stop_grace_seconds if job else 0.0)
