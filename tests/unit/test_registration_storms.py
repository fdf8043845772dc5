"""Registration storms are not the nodes' silence: a registered node's silence counts from its session's first
message, or after the startup grace (its session stream may wait its turn behind thousands of registrations); and
while many agents register at once, the silence of the nodes already READY does not grow, for a while."""

from __future__ import annotations

from dataclasses import replace
from itertools import count

from coresim import info

from tfcluster.daemon.coordinator.core.cluster import Cluster
from tfcluster.daemon.coordinator.core.model.node_table import MASS_SILENCE_NODES, STARTUP_GRACE_SECONDS
from tfcluster.daemon.coordinator.core.model.storms import STORM_PATIENCE_SECONDS, STORM_REGISTRATIONS
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


_hosts = count()


def agent(name: str):
    """A node of its own host (two on one address must not share ports)."""
    k = next(_hosts)
    return replace(info(name, 0), address=f"10.9.{k // 250}.{k % 250}")


def storm(c: Cluster, start: float, seconds: float, prefix: str) -> None:
    """STORM_REGISTRATIONS agents registering every second from start for seconds, the cluster ticking between."""
    t = start
    while t < start + seconds:
        for i in range(STORM_REGISTRATIONS):
            name = f"{prefix}{t:.0f}-{i}"
            c.register(agent(name), [], f"s-{name}", t)
            c.heartbeat(name, f"s-{name}", t)
        c.tick(t)
        t += 1.0


def test_while_agents_register_in_a_storm_a_ready_nodes_silence_does_not_grow():
    c = cluster()
    c.register(info("old", 1), [], "s-old", 0.0)
    assert c.heartbeat("old", "s-old", 0.5) is not None
    c.tick(0.5)
    storm(c, 1.0, 20.0, "new")  # its heartbeats do not get through meanwhile
    assert c.nodes["old"].state == NodeState.READY
    # The storm is over (the new nodes beat on): silence counts again, from where it stood when the storm began.
    for t in range(21, 21 + int(2 * LOST_AFTER) + 2):
        for name in c.nodes.names:
            if name != "old":
                c.heartbeat(name, f"s-{name}", float(t))
        c.tick(float(t))
    assert c.nodes["old"].state == NodeState.LOST


def test_a_storm_longer_than_the_patience_hides_no_silence_past_it():
    c = cluster()
    c.register(info("old", 1), [], "s-old", 0.0)
    assert c.heartbeat("old", "s-old", 0.5) is not None
    storm(c, 1.0, STORM_PATIENCE_SECONDS + LOST_AFTER + 3, "new")
    assert c.nodes["old"].state == NodeState.LOST


def test_a_few_registrations_are_no_storm():
    c = cluster()
    c.register(info("old", 1), [], "s-old", 0.0)
    assert c.heartbeat("old", "s-old", 0.5) is not None
    for i in range(STORM_REGISTRATIONS // 2):
        c.register(agent(f"n{i}"), [], f"s{i}", 1.0 + i * 0.01)
    c.tick(0.5 + LOST_AFTER + 0.5)
    assert c.nodes["old"].state == NodeState.LOST


def test_nodes_already_found_silent_together_are_not_hidden_by_a_storm_that_follows():
    """Most of a small cluster fell silent at once (expiry waits: the coordinator's own network is the likelier
    cause); then a storm of new agents registers. The silent ones are lost once they are no longer most of the
    cluster, as without the storm, and not only when the storm is over."""
    c = cluster()
    rack = [f"rack{i}" for i in range(MASS_SILENCE_NODES * 2)]
    for name in rack:
        c.register(agent(name), [], f"s-{name}", 0.0)
        assert c.heartbeat(name, f"s-{name}", 0.5) is not None
    c.tick(0.5 + LOST_AFTER + 1)
    assert all(c.nodes[name].state == NodeState.READY for name in rack)  # all of them silent: it waits
    storm(c, 6.0, 10.0, "new")  # ten seconds of a storm that lasts up to two minutes
    assert [name for name in rack if c.nodes[name].state == NodeState.LOST] == rack
