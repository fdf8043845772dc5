"""A registered node's silence counts from its session's first message, or after the startup grace: its session
stream may wait its turn behind thousands of registrations, and that wait is not the node's silence."""

from __future__ import annotations

from coresim import info

from tfcluster.daemon.coordinator.core.cluster import Cluster
from tfcluster.daemon.coordinator.core.model.node_table import STARTUP_GRACE_SECONDS
from tfcluster.states import NodeState

LOST_AFTER = 3.0


def cluster() -> Cluster:
    return Cluster(LOST_AFTER, startup_grace_seconds=STARTUP_GRACE_SECONDS)


def test_a_node_not_yet_heard_on_its_session_is_lost_only_after_the_startup_grace():
    c = cluster()
    c.register(info("n1", 1), [], "s1", 100.0)
    c.tick(100.0 + LOST_AFTER + 1)
    assert c.nodes["n1"].state == NodeState.READY  # its session may still be waiting its turn
    c.tick(100.0 + STARTUP_GRACE_SECONDS - 0.5)
    assert c.nodes["n1"].state == NodeState.READY
    c.tick(100.0 + STARTUP_GRACE_SECONDS + 0.5)
    assert c.nodes["n1"].state == NodeState.LOST  # registered and never heard from again: gone after all


def test_once_its_session_speaks_the_usual_timeout_holds():
    c = cluster()
    c.register(info("n1", 1), [], "s1", 100.0)
    assert c.heartbeat("n1", "s1", 101.0) is not None
    c.tick(101.0 + LOST_AFTER - 0.5)
    assert c.nodes["n1"].state == NodeState.READY
    c.tick(101.0 + LOST_AFTER + 0.5)
    assert c.nodes["n1"].state == NodeState.LOST


def test_without_a_startup_grace_silence_counts_from_the_registration():
    c = Cluster(LOST_AFTER)
    c.register(info("n1", 1), [], "s1", 100.0)
    c.tick(100.0 + LOST_AFTER + 0.5)
    assert c.nodes["n1"].state == NodeState.LOST
