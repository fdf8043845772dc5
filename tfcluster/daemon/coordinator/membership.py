"""The nodes of the cluster model: registration, heartbeats, liveness, removal, and what each can take. Pure.

A part of Cluster (cluster.py), kept in a module of its own: Cluster inherits these methods, and they use its
jobs and placements the way its other methods do.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from tfcluster.daemon.coordinator import checkpoints, lifecycle
from tfcluster.daemon.coordinator.changelog import NodeRemoved
from tfcluster.daemon.coordinator.node import Node, ports_overlap
from tfcluster.states import NodeState, TaskState
from tfcluster.daemon.coordinator.launch import launch
from tfcluster.daemon.coordinator.reconcile import reconcile_node
from tfcluster.daemon.coordinator.scheduler import NodeCapacity
from tfcluster.daemon.logformat import fields
from tfcluster.model import Command, NodeInfo, TaskProgress, TaskReport

log = logging.getLogger("tfcluster.coordinator")

# Kubernetes' node controller does the same for a zone that goes dark at once: a partition or a stall on the
# control side looks like every node dying, and restarting every job would be the costliest answer to it.
MASS_SILENCE_NODES = 10
MASS_SILENCE_PATIENCE_SECONDS = 30.0


class NameTaken(Exception):
    """A node name held by another live agent."""


class Membership:
    def register(self, info: NodeInfo, reports: list[TaskReport], session_id: str, now: float) -> list[Command]:
        """Adds or refreshes a node. Raises NameTaken when another live agent holds the name, ValueError
        when the node would share ports with another agent on its address."""
        node = self.nodes.get(info.name)
        if node is not None and node.state == NodeState.READY and \
                (node.info.address, node.info.state_dir) != (info.address, info.state_dir):
            raise NameTaken(f"node name {info.name!r} is held by a live agent at {node.info.address} (state dir "
                            f"{node.info.state_dir}); give this agent another --name")
        for other in self.by_address.get(info.address, ()):
            o = self.nodes[other].info
            if other != info.name and self.nodes[other].state == NodeState.READY and ports_overlap(o, info):
                raise ValueError(f"node.port_range_start/end: {info.name}'s ports {info.port_range[0]}-"
                                 f"{info.port_range[1]} overlap {o.name}'s on the same address {info.address} "
                                 f"({o.port_range[0]}-{o.port_range[1]}); give agents on one host disjoint ranges")
        if node is None:
            node = Node(info=info)
        self.by_address.get(node.info.address, set()).discard(info.name)
        if node.info != info or node.state != NodeState.READY:
            node.info, node.state = info, NodeState.READY
        node.seen.last_seen, node.seen.session_id = now, session_id
        self.add_node(node)
        self.capacity_version += 1
        commands: list[Command] = []
        reported = {r.attempt for r in reports}
        for report in reports:
            commands += self._apply(info.name, report, now)
        for job, task in self.placed_on(info.name):
            if task.live and job.attempt_of(task) not in reported:
                if task.state == TaskState.LAUNCHING:  # the launch may have been lost with the old stream
                    task.seen.sent_at = now
                    commands.append(launch(job, task))
                else:
                    commands += self._settle(job, lifecycle.lost(job, task, f"{info.name}'s agent no longer has "
                                                                           f"this task", now))
            # A restarted agent has lost its shipping orders, or which node alone may send it the chief's
            # checkpoints: both are told again.
            if (task is job.decisive_task() or task is job.evaluator()) and job.decisive_task().state == TaskState.RUNNING:
                commands += checkpoints.shipping(job)
        return commands + self.schedule(now)

    def alive(self, name: str, session_id: str, now: float) -> bool:
        """A message from the node's agent: it is alive. False when it must register again (unknown, an old
        session, or declared lost meanwhile)."""
        node = self.nodes.get(name)
        if node is None or node.seen.session_id != session_id or node.state != NodeState.READY:
            return False
        node.seen.last_seen = now
        self.heard.move_to_end(name)
        return True

    def heartbeat(self, name: str, session_id: str, now: float, progress: list[TaskProgress] = (),
                  condition: str = "") -> list[Command] | None:
        """The node's agent is alive, runs what `progress` lists, and takes new tasks unless `condition` says
        why not. Returns what reconcile sends, or None when the agent must register again."""
        if not self.alive(name, session_id, now):
            return None
        seen = self.nodes[name].seen
        if seen.condition != condition:  # it stopped taking new tasks, or takes them again
            seen.condition = condition
            self.capacity_version += 1
        tasks = self.placed.get(name)
        if not tasks and not progress:
            return []
        for p in progress:
            job = self.jobs.get(p.attempt.job_id)
            task = job.task(p.attempt.type, p.attempt.index) if job else None
            if task is not None and task.node == name and task.attempt == p.attempt.number and task.live:
                lifecycle.progress(job, task, p.output_bytes, p.checkpoint, now)
        placed = self.placed_on(name)
        commands = reconcile_node(name, placed, (p.attempt for p in progress), self.jobs,
                                  self.nodes[name].seen.stops_sent, now, self.resend_after)
        for job in {id(job): job for job, _ in placed}.values():  # reconcile may have ended a task, or a job
            commands = self._settle(job, commands)
        return commands

    def expire(self, now: float) -> list[Command]:
        """Nodes silent for longer than the timeout become LOST; their tasks count as lost. When most of a large
        cluster falls silent at once, the coordinator itself (its network, its overloaded loop) is the likelier
        cause: nothing is declared lost for a while, so one stall does not restart every job."""
        commands: list[Command] = []
        silent = []
        for name in self.heard:
            last_seen = self.nodes[name].seen.last_seen
            if last_seen > now:  # loaded at a restart: its grace is not over (it sits at the front until it returns)
                continue
            if now - last_seen <= self.lost_after:
                break
            silent.append(self.nodes[name])
        if self._mass_silence(len(silent), now):
            return []
        for node in silent:
            del self.heard[node.name]
            node.state, node.seen.condition = NodeState.LOST, ""  # what its heartbeats said no longer holds
            why = f"node {node.name} lost (no heartbeat for {now - node.seen.last_seen:.1f} s)"
            log.warning("%s", why, extra=fields(node=node.name))
            for job in list(self.live.values()):
                if job.syncing and job.sync_source == node.name:
                    commands += self._settle(job, lifecycle.sync_done(job, job.syncing, False, why, now))
            for job, task in self.placed_on(node.name):
                commands += self._settle(job, lifecycle.lost(job, task, why, now))
        return commands

    def forgive_silence(self, seconds: float) -> None:
        """The coordinator could not listen for this long: no READY node's silence counts it."""
        for name in self.heard:
            self.nodes[name].seen.last_seen += seconds

    def _mass_silence(self, silent: int, now: float) -> bool:
        """True while expiry waits: at least MASS_SILENCE_NODES and over half the READY nodes are silent, for no
        longer than MASS_SILENCE_PATIENCE_SECONDS (nodes that are really gone are lost after that)."""
        if silent < MASS_SILENCE_NODES or silent * 2 <= len(self.heard):
            self.mass_silence_since = 0.0
            return False
        if not self.mass_silence_since:
            self.mass_silence_since = now
            log.warning("%d of %d READY nodes fell silent at once: more likely this coordinator's own network or "
                        "load than the nodes; declaring none lost for up to %.0f s", silent, len(self.heard),
                        MASS_SILENCE_PATIENCE_SECONDS)
        return now - self.mass_silence_since < MASS_SILENCE_PATIENCE_SECONDS

    def remove_node(self, name: str, now: float) -> list[Command]:
        """The node leaves the cluster: its tasks are lost (their jobs restart elsewhere) and it is forgotten."""
        node = self.nodes.get(name)
        if node is None:
            raise KeyError(name)
        commands: list[Command] = []
        for job, task in self.placed_on(name):
            commands += self._settle(job, lifecycle.lost(job, task, f"node {name} was removed from the cluster", now))
        del self.nodes[name]
        self.names.remove(name)
        self.heard.pop(name, None)
        self.idle.pop(name, None)
        self.placed.pop(name, None)
        self.by_address.get(node.info.address, set()).discard(name)
        self.changes.append(NodeRemoved(name))
        self.capacity_version += 1
        return commands + self.schedule(now)

    def info_of(self, name: str) -> NodeInfo | None:
        node = self.nodes.get(name)
        return node.info if node is not None and node.state == NodeState.READY else None

    def capacity(self, now: float) -> list[NodeCapacity]:
        """Every READY node with what its tasks hold (and ports found taken), and why it takes no new tasks,
        if it does not."""
        used_gpus: dict[str, set[int]] = {}
        used_ports: dict[str, set[int]] = {}
        for job in self.live.values():
            for task in job.tasks:
                if job.holds(task):
                    used_gpus.setdefault(task.node, set()).update(g.index for g in task.gpus)
                    used_ports.setdefault(task.node, set()).add(task.port)
        capacity = []
        for name in self.names:
            n = self.nodes[name]
            if n.state != NodeState.READY:
                continue
            busy = {p for p, until in n.seen.busy_ports.items() if until > now} if n.seen.busy_ports else ()
            if name not in used_gpus and name not in used_ports and not busy and not n.condition:
                capacity.append(self.idle[name])
            else:
                capacity.append(replace(self.idle[name], used_gpus=frozenset(used_gpus.get(name, ())),
                                        used_ports=frozenset(used_ports.get(name, set()) | set(busy)),
                                        unavailable=n.condition))
        return capacity
