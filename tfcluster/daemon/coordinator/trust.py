"""Join tokens and removed nodes: the coordinator's part of who may be in the cluster. Pure.

A join token is `<id>.<secret>`; only the secret's SHA-256 is kept, so the store never holds a usable token.
It expires, is used once unless reusable, and may be bound to one node name. A removed node's certificates
(any issued before its removal) are refused from then on; joining again with a new token gives it a new one.
"""

from __future__ import annotations

import datetime
import hmac
import secrets
from dataclasses import dataclass, field

from tfcluster.daemon.coordinator.job import Record
from tfcluster.pki import NODE, Authority, Identity
from tfcluster.security import token_hash

DEFAULT_TOKEN_TTL_SECONDS = 3600.0
MAX_TOKEN_TTL_SECONDS = 30 * 86400.0
# An expired token is kept this long, so that a node that comes with it hears why it is refused.
EXPIRED_KEPT_SECONDS = 86400.0


class TokenRefused(Exception):
    """A join token that does not let this node in; the message says why."""


@dataclass(eq=False)
class JoinToken(Record):
    id: str
    secret_hash: str
    expires: float
    node: str = ""        # empty: any node name
    reusable: bool = False
    used: int = 0


@dataclass(eq=False)
class Removal(Record):
    node: str
    time: float


@dataclass
class Trust:
    tokens: dict[str, JoinToken] = field(default_factory=dict)
    removals: dict[str, Removal] = field(default_factory=dict)
    dropped_tokens: list[str] = field(default_factory=list)  # expired ones, until the store deleted them

    def create_token(self, now: float, ttl: float = 0.0, node: str = "",
                     reusable: bool = False) -> tuple[str, JoinToken]:
        ttl = ttl or DEFAULT_TOKEN_TTL_SECONDS
        if not 0 < ttl <= MAX_TOKEN_TTL_SECONDS:
            raise ValueError(f"ttl_seconds: expected more than 0 and at most {MAX_TOKEN_TTL_SECONDS / 86400:g} days, "
                             f"got {ttl:g} s")
        token_id, secret = secrets.token_hex(3), secrets.token_urlsafe(24)
        record = self.tokens[token_id] = JoinToken(token_id, token_hash(secret), now + ttl, node, reusable)
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

    def remove(self, node: str, now: float) -> None:
        self.removals[node] = Removal(node, now)

    def is_removed(self, who: Identity) -> bool:
        """A node certificate issued before its node was removed."""
        removal = self.removals.get(who.name) if who.role == NODE else None
        return removal is not None and who.issued < removal.time

    def join(self, token: str, node: str, csr: bytes, authority: Authority, now: float,
             lifetime: datetime.timedelta) -> bytes:
        """A node's first certificate, for a valid join token (raises TokenRefused or PkiError). The token is
        used up only when a certificate is made: a bad request leaves it as it was."""
        record = self.check(token, node, now)
        cert = authority.sign_node(csr, node, lifetime)
        record.used += 1
        return cert

    def expire(self, now: float) -> None:
        for token_id in [t for t, record in self.tokens.items() if record.expires + EXPIRED_KEPT_SECONDS < now]:
            del self.tokens[token_id]
            self.dropped_tokens.append(token_id)
