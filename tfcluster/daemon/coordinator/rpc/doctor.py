"""`tfcluster doctor` on the coordinator: asks every READY agent to open a task port, then to connect to the
others' ports (node/probe.py on the agent), waits a bounded time for the answers on the agents' streams, and hands
them with what the model knows to core/diagnosis.py for the verdicts. The store's health and the CA's age are
read here too.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from typing import TYPE_CHECKING

from tfcluster import __version__
from tfcluster.commands import PROBE_CONNECT_SECONDS, Probe
from tfcluster.daemon.coordinator.core import diagnosis
from tfcluster.daemon.coordinator.core.diagnosis import FAIL, OK, WARN, Check
from tfcluster.states import NodeState

if TYPE_CHECKING:
    from tfcluster.daemon.coordinator.rpc.coordinator import Coordinator

ANSWER_SECONDS = 5.0  # beyond the work asked, for an agent to answer on its stream (rpc/probes.py waits)
CA_WARN_DAYS = 30


async def diagnose(c: Coordinator) -> list[Check]:
    """Every check, in order: the coordinator, its store, the nodes as it knows them, then the probes."""
    now = c.clock()
    checks = [Check("coordinator", c.leader_address or "this coordinator", OK, f"version {__version__}, store "
                    f"{c.store.location}")]
    checks += await _store(c)
    checks += _ca(c, now)
    nodes = [c.cluster.nodes[name] for name in c.cluster.nodes.names]
    checks += diagnosis.node_checks(nodes, __version__, now)
    ready = [n.info for n in nodes if n.state == NodeState.READY]
    listened = await c.probes.ask(c.send, {i.name: _listen(i.name) for i in ready},
                                  diagnosis.LISTEN_SECONDS / 2)
    plan = diagnosis.targets(ready, {name: a.port for name, (a, _) in listened.items() if a.port})
    connected = await c.probes.ask(c.send, {name: _connect(name, t) for name, t in plan.items()},
                                   PROBE_CONNECT_SECONDS + ANSWER_SECONDS)
    return checks + diagnosis.probe_checks(ready, listened, connected)


def _listen(node: str) -> Callable[[int], Probe]:
    return lambda probe_id: Probe(node, probe_id, listen_seconds=diagnosis.LISTEN_SECONDS)


def _connect(node: str, targets) -> Callable[[int], Probe]:
    return lambda probe_id: Probe(node, probe_id, targets=targets)


async def _store(c: Coordinator) -> list[Check]:
    """etcd's own health, when the store is etcd (read off the event loop: it is HTTP)."""
    store = c.store
    gateway = getattr(getattr(store, "leadership", None), "gateway", None) or getattr(store, "gateway", None)
    if gateway is None:
        return []
    from tfcluster.daemon.coordinator.store.etcd_gateway import LEADER, NO_LEADER

    health = await asyncio.to_thread(gateway.health)
    where = gateway.describe()
    if health == LEADER:
        return [Check("store", f"etcd {where}", OK, "a member answers and knows a leader")]
    if health == NO_LEADER:
        return [Check("store", f"etcd {where}", FAIL, "members answer but none knows a leader: no quorum",
                      "bring the stopped members back (a majority must run and reach each other)")]
    return [Check("store", f"etcd {where}", FAIL, "no member answers from this coordinator",
                  "start etcd, or let this host reach it (see docs/ha.md)")]


def _ca(c: Coordinator, now: float) -> list[Check]:
    if c.authority is None:
        return [Check("tls", "the cluster", WARN, "the coordinator runs with --insecure: anyone who reaches it "
                      "controls the cluster", "`tfcluster ca init` and run it with --tls-dir")]
    left = (c.authority.cert.not_valid_after_utc - datetime.datetime.fromtimestamp(now, datetime.timezone.utc)).days
    if left < CA_WARN_DAYS:
        return [Check("tls", "the cluster CA", WARN, f"expires in {left} days",
                      "make a new CA before then (`tfcluster ca init`) and join the nodes again")]
    return [Check("tls", "the cluster CA", OK, f"valid for {left} more days")]
