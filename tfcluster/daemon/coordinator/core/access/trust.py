"""Who may be in the cluster: join tokens, the holder of each node name, and revoked certificates. Pure.

A join token is `<id>.<secret>`; only the secret's SHA-256 is kept, so the store never holds a usable token.
It expires, is used once unless reusable, and may be bound to one node name.

A node name has one holder. A token cannot take over a name whose certificate is still valid (or whose node is
READY), unless an admin made it for exactly that (`token create --node NAME --replace`); a name that has held a
certificate before comes back only with a token made for it; a removed name only with a token made after its
removal. Removing or replacing a node revokes its certificates issued until then, here and (through the
Revocations command) at every agent's peer port.
"""

from __future__ import annotations

import datetime
import hmac
import secrets
import time
from dataclasses import dataclass, field

from tfcluster.daemon.coordinator.core.model.changelog import ChangeLog, TokenDropped, TrustAdded
from tfcluster.daemon.coordinator.core.model.job import Record
from tfcluster.pki import NODE, Authority, Identity, check_node_name
from tfcluster.pki import REMOVED, REPLACED, token_hash
from tfcluster.states import NodeState

DEFAULT_TOKEN_TTL_SECONDS = 3600.0
MAX_TOKEN_TTL_SECONDS = 30 * 86400.0
# An expired token is kept this long, so that a node that comes with it hears why it is refused.
EXPIRED_KEPT_SECONDS = 86400.0


class TokenRefused(Exception):
    """A join that is not allowed; the message says why and what to do."""


@dataclass(eq=False)
class JoinToken(Record):
    id: str
    secret_hash: str
    expires: float
    node: str = ""        # empty: any node name
    reusable: bool = False
    used: int = 0
    created: float = 0.0  # 0: made by a release that did not record it (counts as made before any removal)
    replace: bool = False  # with node: may take over that name from the holder of a valid certificate


@dataclass(eq=False)
class Removal(Record):
    """The node's certificates issued before `time` are refused: it was removed, or (removed False) another
    holder took its name over."""
    node: str
    time: float
    removed: bool = True


@dataclass(eq=False)
class Holder(Record):
    """The newest certificate the coordinator made for a node name."""
    node: str
    issued: float
    expires: float


@dataclass
class Trust:
    tokens: dict[str, JoinToken] = field(default_factory=dict)
    removals: dict[str, Removal] = field(default_factory=dict)
    holders: dict[str, Holder] = field(default_factory=dict)
    changes: ChangeLog = field(default_factory=ChangeLog)  # where records added and tokens dropped are told
    reserved: frozenset[str] = frozenset()  # the coordinator's own names: no node may be called so

    def log_to(self, changes: ChangeLog) -> None:
        """Changes go to this log from now on (the cluster's), and it learns of every record held now."""
        self.changes = changes
        for kind, records in (("token", self.tokens), ("removal", self.removals), ("holder", self.holders)):
            for key, record in records.items():
                changes.append(TrustAdded(kind, key, record))

    # ---- tokens ----------------------------------------------------------------------------------

    def create_token(self, now: float, ttl: float = 0.0, node: str = "", reusable: bool = False,
                     replace: bool = False) -> tuple[str, JoinToken]:
        ttl = ttl or DEFAULT_TOKEN_TTL_SECONDS
        if not 0 < ttl <= MAX_TOKEN_TTL_SECONDS:
            raise ValueError(f"ttl_seconds: expected more than 0 and at most {MAX_TOKEN_TTL_SECONDS / 86400:g} days, "
                             f"got {ttl:g} s")
        if replace and not node:
            raise ValueError("replace: a token that replaces a node names it (--node NAME)")
        token_id, secret = secrets.token_hex(3), secrets.token_urlsafe(24)
        record = self.tokens[token_id] = JoinToken(token_id, token_hash(secret), now + ttl, node, reusable,
                                                   created=now, replace=replace)
        self.changes.append(TrustAdded("token", token_id, record))
        return f"{token_id}.{secret}", record

    def check(self, token: str, node: str, now: float) -> JoinToken:
        """The token's record if node may join with it now, else TokenRefused (the same words whatever is wrong
        with a secret)."""
        token_id, _, secret = token.partition(".")
        record = self.tokens.get(token_id)
        if record is None or not hmac.compare_digest(record.secret_hash, token_hash(secret)):
            raise TokenRefused("unknown join token")
        if now > record.expires:
            raise TokenRefused("the join token has expired; create another with `tfcluster token create`")
        if record.used and not record.reusable:
            raise TokenRefused("the join token was used already; each node needs its own (or --reusable)")
        if record.node and record.node != node:
            raise TokenRefused(f"the join token is for node {record.node!r}, not {node!r}")
        return record

    def expire(self, now: float) -> None:
        for token_id in [t for t, record in self.tokens.items() if record.expires + EXPIRED_KEPT_SECONDS < now]:
            del self.tokens[token_id]
            self.changes.append(TokenDropped(token_id))

    # ---- certificates ----------------------------------------------------------------------------

    def join(self, token: str, node: str, csr: bytes, authority: Authority, now: float,
             lifetime: datetime.timedelta, addresses: list[str] = (), registered: str = "") -> bytes:
        """A node's certificate for a join token (raises TokenRefused or PkiError). registered: the state of the
        cluster's node of that name ("": none), whose agent may hold a certificate this coordinator has no
        record of (made by an earlier release). The token is used up only when a certificate is made."""
        record = self.check(token, node, now)
        check_node_name(node, set(self.reserved))
        self._may_take(record, node, now, registered)
        if record.replace:
            self.revoke(node, now, removed=False)
        cert = self.issue(authority, csr, node, now, lifetime, addresses)
        record.used += 1
        return cert

    def _may_take(self, token: JoinToken, node: str, now: float, registered: str) -> None:
        removal, holder = self.removals.get(node), self.holders.get(node)
        if removal is not None and removal.removed and token.created < removal.time:
            raise TokenRefused(f"node {node!r} was removed from the cluster at {_when(removal.time)}: only a token "
                               f"made after that lets it join again (`tfcluster token create --node {node}`)")
        if token.replace:
            return
        if registered == NodeState.READY or self.holds_valid_certificate(node, now):
            until = f" (until {_when(holder.expires)})" if holder is not None and holder.expires > now else ""
            raise TokenRefused(f"node {node!r} holds a valid certificate{until}: a second agent cannot take its name. "
                               f"If this machine replaces it, an admin makes a token for that: `tfcluster token "
                               f"create --node {node} --replace`; else give this agent another --name")
        if (holder is not None or registered) and token.node != node:
            expired = f" (it expired at {_when(holder.expires)})" if holder is not None else ""
            raise TokenRefused(f"node {node!r} has held a certificate before{expired}: an admin lets it back in with "
                               f"a token made for it: `tfcluster token create --node {node}`")

    def holds_valid_certificate(self, node: str, now: float) -> bool:
        holder = self.holders.get(node)
        removal = self.removals.get(node)
        return holder is not None and holder.expires > now and (removal is None or holder.issued >= removal.time)

    def issue(self, authority: Authority, csr: bytes, node: str, now: float, lifetime: datetime.timedelta,
              addresses: list[str] = ()) -> bytes:
        """Signs a certificate for node and records it as the name's newest. addresses: those the coordinator saw
        the node's call come from (a TCP peer that completed a handshake is there), never what the node says. A certificate carries its issue time
        in whole seconds: after a revocation it is dated a second later, so that it is not taken for a revoked one."""
        removal = self.removals.get(node)
        issued = max(now, removal.time + 1.0) if removal is not None else now
        cert = authority.sign_node(csr, node, lifetime, list(addresses),
                                   datetime.datetime.fromtimestamp(issued, datetime.timezone.utc))
        holder = self.holders[node] = Holder(node, float(int(issued)), issued + lifetime.total_seconds())
        self.changes.append(TrustAdded("holder", node, holder))
        return cert

    def revoke(self, node: str, now: float, removed: bool = True) -> None:
        """Refuses node's certificates issued until now: it leaves the cluster (removed), or its name gets a new
        holder."""
        removal = self.removals[node] = Removal(node, now, removed)
        self.changes.append(TrustAdded("removal", node, removal))

    def knows(self, node: str) -> bool:
        """The coordinator made a certificate for this name (it may never have registered)."""
        return node in self.holders

    def refusal(self, who: Identity) -> str:
        """Why who's certificate is no longer accepted ("" while it is): a node certificate issued before its node
        was removed, or before its name got a new holder."""
        removal = self.removals.get(who.name) if who.role == NODE else None
        if removal is None or who.issued >= removal.time:
            return ""
        return REMOVED if removal.removed else REPLACED

    def revoked(self) -> tuple[tuple[str, float], ...]:
        """Every (node, time) whose certificates issued before time are refused, for the agents' peer ports."""
        return tuple(sorted((r.node, r.time) for r in self.removals.values()))


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(seconds))
