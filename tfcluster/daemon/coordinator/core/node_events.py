"""What happens to nodes besides their agents' messages, mixed into the Cluster (core/cluster.py): a silent node is
LOST, and its tasks only after the task grace (or sooner, when nothing but its return would save them); an admin
removes, drains and resumes nodes (`tfcluster node remove|drain|resume`); the agent's health check drains a sick
node and lifts its own drain once the node passes. Pure, like the cluster."""

from __future__ import annotations

import logging

from tfcluster.commands import Command
from tfcluster.daemon.coordinator.core.lifecycle import back_to_queue
from tfcluster.daemon.coordinator.core.lifecycle import transitions as lifecycle
from tfcluster.daemon.coordinator.core.model.job import Job
from tfcluster.daemon.coordinator.core.model.node import HEALTH_CHECK, Drain
from tfcluster.daemon.logformat import fields
from tfcluster.states import JobState

log = logging.getLogger("tfcluster.coordinator")

# A node LOST this long with nothing placed on it is forgotten (--forget-lost-nodes-after; 0: never). A fleet whose
# machines come and go under new names (replaced hosts, autoscaled ones) would otherwise keep every one of them in
# the coordinator's memory, its store, `status` and each scheduling pass. Nomad collects down nodes the same way
# (its node_gc_threshold).
DEFAULT_FORGET_LOST_SECONDS = 7 * 86400.0
# How often the LOST nodes are looked at for that, at most (sooner for a shorter setting).
FORGET_CHECK_SECONDS = 60.0

# An agent that said it is restarting (Leaving: systemd's restart of the unit, an upgrade that installs a release
# first) is waited for at least this long before its tasks count as lost.
ANNOUNCED_RESTART_GRACE_SECONDS = 120.0


class NodeEvents:
    """The Cluster's node events; they use its nodes, jobs, task_grace, settle and schedule."""

    def expire(self, now: float) -> list[Command]:
        """Nodes silent for longer than the timeout become LOST (Nodes.expire says which, and when most of them
        falling silent at once makes it wait). Their tasks are not lost yet: see _orphans."""
        commands: list[Command] = []
        for node in self.nodes.expire(now):
            why = f"node {node.name} lost (no heartbeat for {now - node.seen.last_seen:.1f} s)"
            tasks = len(self.nodes.live_on(node.name))
            log.warning("%s%s", why, f"; its {tasks} task(s) count as lost in {self._grace(node):g} s unless its "
                                     f"agent comes back with them" if tasks else "", extra=fields(node=node.name))
            for job in list(self.jobs.live.values()):
                if job.syncing and job.sync_source == node.name:
                    commands += self.settle(job, lifecycle.sync_done(job, job.syncing, False, why, now))
        return commands

    def forget_long_lost(self, now: float) -> list[str]:
        """Forgets the nodes LOST for longer than forget_lost_after (returns their names). A node keeps its place
        while a task of a job not ended is placed there (the job still needs to hear of it), and while an admin
        has it drained: a drain is someone's decision, which a forgotten node would lose when it came back. The
        node's certificate stays valid: its agent, started again, registers as a new node (unlike `node
        remove`, which revokes it)."""
        if not self.forget_lost_after or now - self.forget_checked_at < min(FORGET_CHECK_SECONDS,
                                                                           self.forget_lost_after / 10):
            return []
        self.forget_checked_at = now
        forgotten = []
        for name in self.nodes.lost():
            node = self.nodes[name]
            if not node.lost_since:  # loaded from a store written before it was kept: counted from now
                node.lost_since = now
            elif now - node.lost_since >= self.forget_lost_after and not self.nodes.has_placed(name) and \
                    (node.drain is None or node.drain.by == HEALTH_CHECK):
                self.nodes.remove(name)
                forgotten.append(name)
                log.info("node %s forgotten: LOST for %.0f s (--forget-lost-nodes-after); its agent registers "
                         "anew when it comes back", name, now - node.lost_since, extra=fields(node=name))
        return sorted(forgotten)

    def remove_node(self, name: str, now: float) -> list[Command]:
        """The node leaves the cluster: its tasks are lost (their jobs restart elsewhere) and it is forgotten."""
        if name not in self.nodes:
            raise KeyError(name)
        commands: list[Command] = []
        for job, task in self.nodes.placed_on(name):
            commands += self.settle(job, lifecycle.lost(job, task, f"node {name} was removed from the cluster", now))
        self.nodes.remove(name)
        return commands + self.schedule(now)

    def _orphans(self, job: Job, now: float) -> list[Command]:
        """Tasks on a node that is not READY are lost once nothing but their node's return would save them: its
        silence outlasted the task grace (--tasks-lost-after), or their job is stopping (for good, or to restart
        after a peer task failed), or the node is gone. Within the grace an agent that restarts (an upgrade, a
        crash, kill -9) comes back with its tasks, which its shims kept running, and their jobs lose nothing: a
        node may be LOST quickly, its tasks only when it matters (Kubernetes separates a NotReady node from
        evicting its pods the same way)."""
        commands: list[Command] = []
        for task in job.tasks:
            if not task.node or self.nodes.info_of(task.node) is not None:
                continue
            node = self.nodes.get(task.node)
            silent = now - node.seen.last_seen if node is not None else 0.0
            if node is None or job.state == JobState.STOPPING:
                commands += lifecycle.lost(job, task, f"node {task.node} is not READY", now)
            elif silent >= self.nodes.lost_after + self._grace(node):
                commands += lifecycle.lost(job, task, f"node {task.node} lost (no heartbeat for {silent:.1f} s)", now)
            else:  # status says so meanwhile
                left = self.nodes.lost_after + self._grace(node) - silent
                task.seen.node_silent = (f"node {task.node} silent for {silent:.0f} s: this task counts as lost in "
                                         f"{left:.0f} s unless its agent comes back with it")
        return commands

    def leaving(self, name: str) -> None:
        """The node's agent is stopping and leaves its tasks running: they are given the grace of an announced
        restart (ANNOUNCED_RESTART_GRACE_SECONDS, or --tasks-lost-after when longer) once the node is LOST."""
        node = self.nodes[name]
        node.seen.leaving = True
        tasks = len(self.nodes.live_on(name))
        log.info("node %s's agent is stopping and leaves its %d task(s) running: they count as lost only if it is "
                 "not back within %.0f s of going silent", name, tasks, self._grace(node), extra=fields(node=name))

    def _grace(self, node) -> float:
        return max(self.task_grace, ANNOUNCED_RESTART_GRACE_SECONDS) if node.seen.leaving else self.task_grace

    def drain(self, name: str, drain: Drain, requeue: bool, now: float) -> list[Command]:
        """Nothing new is placed on the node from now on; the jobs running there finish there, or with requeue go
        back to the queue as if preempted (no restart charged) and are placed elsewhere. Draining a drained node
        again changes its reason (and requeues what still runs there, when asked). KeyError when unknown."""
        self.nodes.set_drain(name, drain)
        log.warning("node %s %s", name, drain.words(), extra=fields(node=name))
        commands: list[Command] = []
        if requeue:
            why = f"requeued: node {name} was {drain.words()}"
            jobs = {job.id: job for job, _ in self.nodes.live_on(name)}
            for job in jobs.values():
                commands += self.settle(job, back_to_queue.requeue(job, why, now))
        return commands + self.schedule(now)

    def _health(self, name: str, failure: str, now: float) -> None:
        """The agent's health check (--health-check-program) failed: the node is drained with its line, as LBNL
        NHC drains a Slurm node; once it passes, a drain the health check made is lifted (an admin's never is).
        Jobs running there finish there, as with any drain."""
        drain = self.nodes[name].drain
        if failure and (drain is None or (drain.by == HEALTH_CHECK and drain.reason != failure)):
            self.nodes.set_drain(name, Drain(reason=failure, by=HEALTH_CHECK, since=drain.since if drain else now))
            log.warning("node %s drained: its health check failed: %s", name, failure, extra=fields(node=name))
        elif not failure and drain is not None and drain.by == HEALTH_CHECK:
            self.nodes.set_drain(name, None)
            log.info("node %s passes its health check again: its drain is lifted", name, extra=fields(node=name))

    def resume(self, name: str, now: float) -> list[Command]:
        """The node takes new tasks again (KeyError when unknown); a node not drained is left as it is."""
        if self.nodes[name].drain is not None:
            log.info("node %s resumed", name, extra=fields(node=name))
        self.nodes.set_drain(name, None)
        return self.schedule(now)
