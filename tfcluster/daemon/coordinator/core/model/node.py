"""A node as the coordinator keeps it: what its agent said at registration (saved), and what the
coordinator observes of the agent while it is connected (never saved)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tfcluster.conditions import NodeCondition
from tfcluster.daemon.coordinator.core.model.job import Record
from tfcluster.model import Attempt, NodeInfo
from tfcluster.states import NodeState


@dataclass
class NodeSeen:
    """What the coordinator observes about a node's agent; never saved."""
    last_seen: float = 0.0
    forgiven_at: float = 0.0  # the node table's silence forgiven so far when last_seen was set (node_table.py)
    session_id: str = ""
    busy_ports: dict[int, float] = field(default_factory=dict)  # found taken by something else, until when
    stops_sent: dict[Attempt, float] = field(default_factory=dict)  # reconcile: unwanted attempts told to stop
    condition: str = ""  # why its agent takes no new tasks now (low disk), from its heartbeats; "": it takes them
    leaving: bool = False  # its agent said it stops and leaves its tasks running (a restart), until it registers
    conditions: tuple[NodeCondition, ...] = ()  # what its agent's GPU check found, from its latest message
    cert_issued: float = 0.0  # the life of the certificate its agent registered with (or was last renewed to);
    cert_expires: float = 0.0  # 0: unknown


# Who drained a node its agent's health check found sick (Drain.by): no certificate's name has a space, so no admin's
# drain is taken for one the health check may lift.
HEALTH_CHECK = "health check"


@dataclass(frozen=True)
class Drain:
    """An admin took the node out of placement (`tfcluster node drain`): why, who, and when. Saved with the node,
    so it outlives a restart of the coordinator or of the agent; `node resume` ends it, removing the node too."""
    reason: str
    by: str
    since: float

    def words(self) -> str:
        if self.by == HEALTH_CHECK:
            return f"its health check failed: {self.reason}"
        return f"drained by {self.by or 'an admin'}: {self.reason}"


@dataclass(eq=False)
class Node(Record):
    info: NodeInfo
    state: NodeState = NodeState.READY
    drain: Drain | None = None
    # When it was declared LOST (0: it is READY); saved, so that how long a node has been gone outlives a restart
    # of the coordinator, which forgets a node gone for long enough (node_events.py forget_long_lost).
    lost_since: float = 0.0
    seen: NodeSeen = field(default_factory=NodeSeen, repr=False)

    def __post_init__(self) -> None:
        self.state = NodeState(self.state)  # a value read back from the store

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def condition(self) -> str:
        """Why the node takes no new tasks (its agent's own condition, or one it is too old to know); "": it
        takes them."""
        return self.seen.condition or self.info.root_tasks_condition

    @property
    def unschedulable(self) -> str:
        """Why placement passes the node by (drained, or its condition); "": it takes new tasks."""
        return self.drain.words() if self.drain is not None else self.condition


def ports_overlap(a: NodeInfo, b: NodeInfo) -> bool:
    """Two agents' port ranges (their peer ports included) share a port."""
    def spans(info: NodeInfo) -> list[tuple[int, int]]:
        return [info.port_range] + ([(info.peer_port, info.peer_port)] if info.peer_port else [])
    return any(x0 <= y1 and y0 <= x1 for x0, x1 in spans(a) for y0, y1 in spans(b))
