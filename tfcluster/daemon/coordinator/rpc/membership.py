"""The cluster's members, as the coordinator process handles them (rpc/coordinator.py's Coordinator): a node joins
with a token and renews its certificate; an admin creates tokens, removes, drains and resumes nodes. The trust
records (core/access/trust.py) and the cluster decide; here their changes are stored and told to the agents whose
streams they end or whose peer ports must refuse a revoked certificate.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable

import grpc

from tfcluster import pki
from tfcluster.commands import Command, Revocations
from tfcluster.daemon.coordinator.core.access.trust import Trust
from tfcluster.daemon.coordinator.core.cluster import Cluster
from tfcluster.daemon.coordinator.core.model.node import Drain
from tfcluster.daemon.coordinator.rpc.outbox import Outbox, StreamEnded
from tfcluster.daemon.logformat import fields
from tfcluster.pki import REMOVED, REPLACED, Identity, PkiError

log = logging.getLogger("tfcluster.coordinator")


class Membership:
    """Joining, renewing, tokens, removal and drains; they use the coordinator's cluster, trust, clock, authority,
    outboxes, streams and apply."""
    cluster: Cluster
    trust: Trust
    clock: Callable[[], float]
    authority: pki.Authority | None
    node_cert_lifetime: datetime.timedelta
    outboxes: dict[str, Outbox]
    streams: dict[str, asyncio.Task]
    apply: Callable[..., asyncio.Future]

    def join(self, token: str, node: str, csr: bytes, seen_from: str = "") -> bytes:
        """A node's first certificate for a join token; raises TokenRefused or PkiError. seen_from: the address
        its connection came from, the one address its certificate may name."""
        if self.authority is None:
            raise PkiError("this coordinator runs without TLS (--insecure): there is nothing to join")
        record = self.trust.tokens.get(token.partition(".")[0])
        replaces = record is not None and record.replace
        cert = self.trust.join(token, node, csr, self.authority, self.clock(), self.node_cert_lifetime,
                               [seen_from] if seen_from else [], registered=getattr(self.cluster.nodes.get(node),
                                                                                    "state", ""))
        if replaces:  # the old holder's stream ends now; its certificate is refused from now on, everywhere
            self.outboxes.pop(node, Outbox()).end(StreamEnded(grpc.StatusCode.PERMISSION_DENIED,
                                                              f"node {node} {REPLACED}"))
        self.apply(self._revocations() if replaces else [])
        log.info("node %s joined the cluster%s", node, " as its name's new holder" if replaces else "",
                 extra=fields(node=node))
        return cert

    def renew(self, caller: Identity, csr: bytes, seen_from: str = "") -> bytes:
        if self.authority is None or caller is None:
            raise PkiError("this coordinator runs without TLS (--insecure): there is nothing to renew")
        cert = self.trust.issue(self.authority, csr, caller.name, self.clock(), self.node_cert_lifetime,
                                [seen_from] if seen_from else [])
        self.apply()
        holder = self.trust.holders[caller.name]
        self._certificate_seen(caller.name, holder.issued, holder.expires)
        return cert

    def _certificate_seen(self, node: str, issued: float, expires: float) -> None:
        if node in self.cluster.nodes:
            self.cluster.nodes[node].seen.cert_issued, self.cluster.nodes[node].seen.cert_expires = issued, expires

    def create_token(self, ttl: float, node: str, reusable: bool,
                     replace: bool = False) -> tuple[str, float, asyncio.Future]:
        token, record = self.trust.create_token(self.clock(), ttl, node, reusable, replace)
        log.info("join token %s created (expires in %.0f s%s%s%s)", record.id, record.expires - self.clock(),
                 f", for node {node}" if node else "", ", reusable" if reusable else "",
                 ", replaces the node's current holder" if replace else "")
        return token, record.expires, self.apply()

    def remove_node(self, name: str) -> tuple[int, asyncio.Future]:
        """The node leaves the cluster; its certificates are refused from now on, here and at every peer port. A
        name that holds a certificate but never registered can be removed too. Raises KeyError."""
        now = self.clock()
        if name not in self.cluster.nodes and not self.trust.knows(name):
            raise KeyError(name)
        lost = sum(1 for job in self.cluster.jobs.live.values() for t in job.tasks if t.node == name and t.live)
        commands = self.cluster.remove_node(name, now) if name in self.cluster.nodes else []
        self.trust.revoke(name, now)
        # Its stream ends with the reason (a cancelled handler would leave the agent's call open, unanswered).
        self.outboxes.pop(name, Outbox()).end(StreamEnded(grpc.StatusCode.PERMISSION_DENIED, f"node {name} {REMOVED}"))
        log.info("node %s removed from the cluster (%d tasks lost)", name, lost, extra=fields(node=name))
        return lost, self.apply(commands + self._revocations())

    def drain_node(self, name: str, reason: str, by: str, requeue: bool) -> tuple[int, int, asyncio.Future]:
        """Nothing new goes to the node (core/cluster.py Cluster.drain); returns how many jobs were requeued, how many
        still run there, and the write. Raises KeyError for an unknown node."""
        now = self.clock()
        if name not in self.cluster.nodes:
            raise KeyError(name)
        jobs = {job.id for job, _ in self.cluster.nodes.live_on(name)}
        commands = self.cluster.drain(name, Drain(reason=reason, by=by, since=now), requeue, now)
        requeued, running = (len(jobs), 0) if requeue else (0, len(jobs))
        return requeued, running, self.apply(commands)

    def resume_node(self, name: str) -> tuple[bool, asyncio.Future]:
        """The node takes new tasks again; returns whether it was drained, and the write. KeyError when unknown."""
        was_drained = self.cluster.nodes[name].drain is not None
        return was_drained, self.apply(self.cluster.resume(name, self.clock()))

    def _revocations(self, nodes=None) -> list[Command]:
        """The revoked node certificates, for the agents' peer ports: every connected node, or those given."""
        revoked = self.trust.revoked()
        return [Revocations(node, revoked) for node in (self.streams if nodes is None else nodes)] if revoked else []
