"""The cluster's nodes: who is registered, who is alive, what each can take, and which tasks are placed on it.
Pure.

Nodes owns the registry and every index over it: the names in order, the nodes of each address, each node's
capacity when idle, the READY nodes in the order they were last heard from (with their GPUs counted), the LOST
ones, and the tasks placed on each node.
Every method that changes a node changes its indexes with it, so a reader never meets a stale entry. Nodes
knows jobs only through their tasks' placements: the cluster (cluster.py) hands it each job after a change
(track), and it indexes the tasks of jobs that have not ended by the node they are placed on.
"""

from __future__ import annotations

import bisect
import logging
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import replace

from tfcluster.conditions import NodeCondition, excluded_gpus
from tfcluster.daemon.coordinator.core.model.capacity import NodeCapacity
from tfcluster.daemon.coordinator.core.model.changelog import ChangeLog, NodeAdded, NodeRemoved
from tfcluster.daemon.coordinator.core.model.job import Job, Task
from tfcluster.daemon.coordinator.core.model.node import Drain, Node, ports_overlap
from tfcluster.daemon.coordinator.core.model.pace import Pace
from tfcluster.daemon.coordinator.core.model.registry import Registry
from tfcluster.daemon.coordinator.core.model.storms import RegistrationStorm
from tfcluster.model import NodeInfo
from tfcluster.states import DrainState, NodeState

log = logging.getLogger("tfcluster.coordinator")

# Kubernetes' node controller does the same for a zone that goes dark at once: a partition or a stall on the
# control side looks like every node dying, and restarting every job would be the costliest answer to it.
MASS_SILENCE_NODES = 10
MASS_SILENCE_PATIENCE_SECONDS = 30.0
# After a (re)start or a failover the nodes known from the store come back in a storm, each agent registering
# again. While they still come back, one that has not yet is more likely queued behind the others than gone: it is
# given longer, up to this long after the start (Nomad's failover heartbeat TTL, for the same storm, is as long).
RETURN_PATIENCE_CAP_SECONDS = 300.0
# A node is heard from when it registers; its heartbeats come on its session stream, which it opens next, and
# which waits its turn behind every other call gRPC has taken in (it takes them one at a time, in order of arrival).
# When thousands of agents register at once that wait outlasts --lost-after, and hundreds of nodes that never
# fell silent were declared lost in each cold start of 5,000 (bench/storm.py). So the coordinator counts a node's
# silence from the first message of its session, or from this long after its registration (Kubernetes gives a
# starting node the same kind of grace, --node-startup-grace-period).
STARTUP_GRACE_SECONDS = 30.0

Placed = dict[tuple[str, str], tuple[Job, Task]]  # (job id, task key) -> the job and its task


class NameTaken(Exception):
    """A node name held by another live agent."""


class Nodes(Registry[Node]):
    """The registry, read as a mapping of name -> Node; changed only through its methods."""

    def __init__(self, pace: Pace, changes: ChangeLog | None = None, startup_grace: float = 0.0):
        self.changes = changes if changes is not None else ChangeLog()  # told of every node added or removed
        self.pace = pace
        # A registered node's silence counts only after this long, or from its session's first message (the
        # coordinator gives STARTUP_GRACE_SECONDS; 0: from its registration)
        self.startup_grace = startup_grace
        self.storm = RegistrationStorm()
        self._expired_at: float | None = None  # when expire last ran
        # Seconds of silence forgiven to every READY node so far (forgive_silence): a READY node's silence is its
        # time since last_seen less what was forgiven since then (its seen.forgiven_at), so forgiving costs the
        # same with 5,000 nodes as with 5, on the ticks of a storm or of a late loop
        self._forgiven = 0.0
        self._nodes: dict[str, Node] = {}
        super().__init__(self._nodes)
        self._names: list[str] = []  # sorted: placement and status pages go in this order
        self._by_address: dict[str, set[str]] = {}
        self._idle: dict[str, NodeCapacity] = {}  # each node's capacity when nothing runs on it
        # READY nodes (-> their GPUs), the one heard from longest ago first: expiry looks at the front only.
        self._heard: OrderedDict[str, int] = OrderedDict()
        self._lost: set[str] = set()  # the other nodes: LOST is the only other state
        self._ready_gpus = 0  # the GPUs of the READY nodes: `status` counts them on every call
        self._placed: dict[str, Placed] = {}  # node -> the tasks of jobs not ended placed there (never empty)
        self._placements: dict[str, dict[str, str]] = {}  # job id -> task key -> node: what _placed holds of it
        self.capacity_version = 0  # bumped whenever resources may have been freed or added
        self.mass_silence_since = 0.0  # when most nodes fell silent at once (expiry waits a while); 0: not now
        self._returning: set[str] = set()  # READY nodes loaded from the store whose agents have not come back yet
        self._returns_began = self._last_return = 0.0  # when this coordinator loaded them; when one came back last

    # ---- reading -------------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        """Every node's name, sorted (do not change the list)."""
        return self._names

    def on_address(self, address: str) -> frozenset[str]:
        return frozenset(self._by_address.get(address, ()))

    def ready(self) -> int:
        """How many nodes are READY."""
        return len(self._heard)

    def ready_gpus(self) -> int:
        """How many GPUs the READY nodes have."""
        return self._ready_gpus

    def lost(self) -> frozenset[str]:
        """The names of the LOST nodes."""
        return frozenset(self._lost)

    def info_of(self, name: str) -> NodeInfo | None:
        """A READY node's description; None when it is not READY (or unknown)."""
        node = self._nodes.get(name)
        return node.info if node is not None and node.state == NodeState.READY else None

    def placed_on(self, name: str) -> list[tuple[Job, Task]]:
        """The tasks of jobs not ended that are placed on a node."""
        return list(self._placed.get(name, {}).values())

    def live_on(self, name: str) -> list[tuple[Job, Task]]:
        """The live tasks placed on a node (placed_on also holds the ended tasks of jobs that go on)."""
        return [(job, task) for job, task in self._placed.get(name, {}).values() if task.live]

    def has_placed(self, name: str) -> bool:
        return name in self._placed

    def capacity(self, now: float, used_gpus: Mapping[str, Collection[int]], used_ports: Mapping[str, Collection[int]],
                 used_memory: Mapping[str, int]) -> list[NodeCapacity]:
        """Every READY node, by name, with what its tasks hold (GPUs, ports, the bytes of their memory limits; and
        ports found taken), and why it takes no new tasks, if it does not."""
        capacity = []
        for name in self._names:
            n = self._nodes[name]
            if n.state != NodeState.READY:
                continue
            busy = {p for p, until in n.seen.busy_ports.items() if until > now} if n.seen.busy_ports else ()
            sick = tuple(sorted(excluded_gpus(n.seen.conditions).items())) if n.seen.conditions else ()
            if name not in used_gpus and name not in used_ports and name not in used_memory and not busy \
                    and not n.unschedulable and not sick:
                capacity.append(self._idle[name])
            else:
                capacity.append(replace(self._idle[name], used_gpus=frozenset(used_gpus.get(name, ())),
                                        used_ports=frozenset(used_ports.get(name, ())).union(busy),
                                        used_memory=used_memory.get(name, 0),
                                        unavailable=n.unschedulable, excluded_gpus=sick))
        return capacity

    def idle(self, name: str) -> NodeCapacity:
        """The node's capacity when nothing runs on it."""
        return self._idle[name]

    def idle_ready(self) -> list[NodeCapacity]:
        """Every READY node, by name, as if nothing ran on it: what a job could ever be placed on."""
        return [self._idle[name] for name in self._names if self._nodes[name].state == NodeState.READY]

    # ---- membership ----------------------------------------------------------------------------

    @property
    def lost_after(self) -> float:
        return self.pace.lost_after

    def add(self, node: Node) -> None:
        """A node from the store, or one (re)registering: it replaces any node of that name."""
        old = self._nodes.get(node.name)
        if old is None:
            bisect.insort(self._names, node.name)
            self.pace.fit(len(self._names))
        else:
            self._discard_address(old.info.address, old.name)
        self._nodes[node.name] = node
        if node.state == NodeState.LOST and not node.seen.last_seen:  # loaded: silent since about then, not 1970
            node.seen.last_seen = node.lost_since
        self._by_address.setdefault(node.info.address, set()).add(node.name)
        i = node.info
        self._idle[node.name] = NodeCapacity(i.name, i.address, i.gpus, i.port_range, memory_bytes=i.memory_bytes,
                                             fetches_code=i.fetches_code, labels=frozenset(i.labels))
        self._index_state(node.name, node)
        self.capacity_version += 1
        self.changes.append(NodeAdded(node))

    def register(self, info: NodeInfo, session_id: str, now: float) -> Node:
        """Adds or refreshes a node, READY and heard from now. Raises NameTaken when another live agent holds
        the name, ValueError when the node would share ports with another agent on its address."""
        node = self._nodes.get(info.name)
        if node is not None and node.state == NodeState.READY and \
                (node.info.address, node.info.state_dir) != (info.address, info.state_dir):
            raise NameTaken(f"node name {info.name!r} is held by a live agent at {node.info.address} (state dir "
                            f"{node.info.state_dir}); give this agent another --name")
        for other in self._by_address.get(info.address, ()):
            o = self._nodes[other].info
            if other != info.name and self._nodes[other].state == NodeState.READY and ports_overlap(o, info):
                raise ValueError(f"node.port_range_start/end: {info.name}'s ports {info.port_range[0]}-"
                                 f"{info.port_range[1]} overlap {o.name}'s on the same address {info.address} "
                                 f"({o.port_range[0]}-{o.port_range[1]}); give agents on one host disjoint ranges")
        if node is None:
            node = Node(info=info)
        if node.info != info or node.state != NodeState.READY:  # a Record: assigning marks it for the store
            self._discard_address(node.info.address, node.name)
            node.info, node.state, node.lost_since = info, NodeState.READY, 0.0
        # In the future with a startup grace: expiry skips it until then, or until its session's first message
        # says it is alive.
        self._heard_at(node, now + max(0.0, self.startup_grace - self.lost_after))
        node.seen.session_id, node.seen.leaving = session_id, False
        self.storm.registered(now)
        if info.name in self._returning:
            self._returning.discard(info.name)
            self._last_return = now
        self.add(node)
        return node

    def alive(self, name: str, session_id: str, now: float) -> bool:
        """A message from the node's agent: it is alive. False when it must register again (unknown, an old
        session, or declared lost meanwhile)."""
        node = self._nodes.get(name)
        if node is None or node.seen.session_id != session_id or node.state != NodeState.READY:
            return False
        self._heard_at(node, now)
        self._heard.move_to_end(name)
        return True

    def _heard_at(self, node: Node, when: float) -> None:
        node.seen.last_seen, node.seen.forgiven_at = when, self._forgiven

    def _silent_since(self, node: Node) -> float:
        """When the node's silence counts from: its last_seen, moved on by the silence forgiven since."""
        return node.seen.last_seen + self._forgiven - node.seen.forgiven_at

    def set_condition(self, name: str, condition: str) -> None:
        """What the node's heartbeats say about taking new tasks ("": it takes them)."""
        seen = self._nodes[name].seen
        if seen.condition != condition:
            seen.condition = condition
            self.capacity_version += 1

    def set_conditions(self, name: str, conditions: tuple[NodeCondition, ...]) -> None:
        """What the node's agent found on its GPUs now (all of it: one no longer listed has cleared)."""
        seen = self._nodes[name].seen
        if seen.conditions != conditions:
            if excluded_gpus(seen.conditions).keys() != excluded_gpus(conditions).keys():
                self.capacity_version += 1  # a GPU left out, or back: jobs that did not fit are tried again
            seen.conditions = conditions

    def set_drain(self, name: str, drain: Drain | None) -> None:
        """Drains the node (nothing new is placed there), or resumes it with None. KeyError when unknown."""
        node = self._nodes[name]
        if node.drain != drain:
            node.drain = drain  # a Record: the store writes it
            self.capacity_version += 1

    def drain_state(self, name: str) -> DrainState | None:
        """DRAINING while a live task of a job placed before the drain is there, then DRAINED; None: not drained."""
        if self._nodes[name].drain is None:
            return None
        return DrainState.DRAINING if self.live_on(name) else DrainState.DRAINED

    def resources_changed(self) -> None:
        """Something may have freed (or added) what nodes can take: jobs that did not fit are tried again."""
        self.capacity_version += 1

    def port_busy(self, name: str, port: int, until: float) -> None:
        """Something else holds one of the node's ports: placement avoids it until then."""
        node = self._nodes.get(name)
        if node is not None and node.info.port_range[0] <= port <= node.info.port_range[1]:
            node.seen.busy_ports[port] = until

    def remove(self, name: str) -> Node:
        """Forgets a node (KeyError when unknown). The tasks placed there stay indexed under its name until their
        jobs move them: the caller declares them lost."""
        node = self._nodes.pop(name)
        self._names.remove(name)
        self._index_state(name, None)
        self._returning.discard(name)
        del self._idle[name]
        self._discard_address(node.info.address, name)
        self.capacity_version += 1
        self.changes.append(NodeRemoved(name))
        return node

    def _index_state(self, name: str, node: Node | None) -> None:
        """The node now has its state (or is gone, with None): the READY and LOST indexes follow it. A READY node
        goes to the end of the heard order, as one just heard from."""
        self._ready_gpus -= self._heard.pop(name, 0)
        self._lost.discard(name)
        if node is not None and node.state == NodeState.READY:
            self._heard[name] = len(node.info.gpus)
            self._ready_gpus += len(node.info.gpus)
        elif node is not None:
            self._lost.add(name)

    def _discard_address(self, address: str, name: str) -> None:
        names = self._by_address.get(address)
        if names is not None:
            names.discard(name)
            if not names:
                del self._by_address[address]

    # ---- liveness ------------------------------------------------------------------------------

    def await_return(self, now: float, grace: float) -> None:
        """This coordinator just loaded the nodes from the store (it started, or took over the leadership): their
        agents retry with backoff while no coordinator serves, so each READY node counts as heard from at the end
        of the grace, and for as long as the others are still coming back (expire)."""
        self._returning = set(self._heard)
        self._returns_began = self._last_return = now
        for name in self._returning:
            self._heard_at(self._nodes[name], now + grace)

    def expire(self, now: float) -> list[Node]:
        """Nodes silent for longer than the timeout become LOST; returns them (their tasks count as lost). When most
        of a large cluster falls silent at once, the coordinator itself (its network, its overloaded loop) is the
        likelier cause: nothing is declared lost for a while, so one stall does not restart every job; nor does the
        time a registration storm lasts count as anyone's silence (storms.py)."""
        if self.storm.under_way(now, self.lost_after) and self._expired_at is not None:
            self.forgive_silence(now - self._expired_at)
            self._expired_at = now
            if not self.mass_silence_since:  # no READY node's silence grew since the last look: none is new
                return []
        self._expired_at = now
        silent = []
        still_returning = self._returning and now - self._last_return <= self.lost_after and \
            now - self._returns_began < RETURN_PATIENCE_CAP_SECONDS
        for name in self._heard:
            last_seen = self._silent_since(self._nodes[name])
            # Loaded from the store: its grace is not over, or the others still come back (it sits at the front,
            # where loading put it, until it returns).
            if last_seen > now or (still_returning and name in self._returning):
                continue
            if now - last_seen <= self.lost_after:
                break
            silent.append(self._nodes[name])
        if self._mass_silence(len(silent), now):
            return []
        for node in silent:
            self._returning.discard(node.name)
            self._heard_at(node, self._silent_since(node))  # it keeps what it was forgiven
            # What its heartbeats said no longer holds; its agent says it again when it registers.
            node.state, node.seen.condition, node.seen.conditions = NodeState.LOST, "", ()
            node.lost_since = now
            self._index_state(node.name, node)
        if silent:
            self.capacity_version += 1
        return silent

    def forgive_silence(self, seconds: float) -> None:
        """The coordinator could not listen for this long: no READY node's silence counts it."""
        self._forgiven += seconds

    def _mass_silence(self, silent: int, now: float) -> bool:
        """True while expiry waits: at least MASS_SILENCE_NODES and over half the READY nodes are silent, for no
        longer than MASS_SILENCE_PATIENCE_SECONDS (nodes that are really gone are lost after that)."""
        if silent < MASS_SILENCE_NODES or silent * 2 <= len(self._heard):
            self.mass_silence_since = 0.0
            return False
        if not self.mass_silence_since:
            self.mass_silence_since = now
            log.warning("%d of %d READY nodes fell silent at once: more likely this coordinator's own network or "
                        "load than the nodes; declaring none lost for up to %.0f s", silent, len(self._heard),
                        MASS_SILENCE_PATIENCE_SECONDS)
        return now - self.mass_silence_since < MASS_SILENCE_PATIENCE_SECONDS

    # ---- placements ----------------------------------------------------------------------------

    def track(self, job: Job) -> None:
        """The job may have changed: its tasks are indexed by the node each is placed on now (none once it ended)."""
        now = {} if job.ended else {task.key: task.node for task in job.tasks if task.node}
        before = self._placements.get(job.id, {})
        if now == before:
            return
        for key, node in before.items():
            if now.get(key) != node:
                entries = self._placed[node]
                del entries[(job.id, key)]
                if not entries:
                    del self._placed[node]
        tasks = {task.key: task for task in job.tasks}
        for key, node in now.items():
            if before.get(key) != node:
                self._placed.setdefault(node, {})[(job.id, key)] = (job, tasks[key])
        if now:
            self._placements[job.id] = now
        else:
            self._placements.pop(job.id, None)
