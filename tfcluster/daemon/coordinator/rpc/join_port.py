"""The join port: the one listener that takes callers without a certificate, so a server of its own, small.

It serves JoinService and health only, takes a request of a join's size at most (gRPC refuses a larger one
from its length prefix, before it is buffered), few streams per connection, and drops idle, old or
half-open connections; every source address may join at a bounded rate.
"""

from __future__ import annotations

import collections
import ipaddress
import time
import urllib.parse

import grpc
from grpc_health.v1 import health_pb2_grpc

from tfcluster import security
from tfcluster.api.v1 import agent_pb2_grpc

# A join is a token, a node name and the CSR of a P-256 key: under 2 KB. gRPC's own bound on the port is the
# policy's for Join (16 KiB), so nothing larger is ever read into memory, let alone decoded.
JOIN_MAX_BYTES = security.POLICY[security.JOIN + "Join"].max_request_bytes
# What the port answers: a certificate and the CA's, about 2 KB; health answers are a few bytes.
JOIN_MAX_SEND_BYTES = 64 * 1024
# A joining agent makes one call on its connection; a few more streams leave room for a health probe.
STREAMS_PER_CONNECTION = 4
# Calls served at once on the whole port; gRPC refuses more (RESOURCE_EXHAUSTED) without running them.
CONCURRENT_CALLS = 64
HANDSHAKE_SECONDS = 5      # a connection that has not finished TLS by then is dropped (slow handshakes)
IDLE_SECONDS = 10          # a connection without calls for that long is closed
MAX_AGE_SECONDS = 30       # any connection is closed after that, its calls given GRACE_SECONDS to finish
GRACE_SECONDS = 20         # the agent's join timeout is 20 s
METADATA_BYTES = 8 * 1024  # headers of a call

# Joins per source (an IPv4 address, an IPv6 /64): a bucket of JOIN_BURST calls refilled at JOIN_RATE per
# second. An agent refused for the rate waits and tries again (identity.py); the burst spares the wait to a
# fleet started at once behind one NAT: 100 at once, and 300 started over a minute get through at once (100 +
# 5 a second for the 40 s it takes to start the other 200). One source cannot make the coordinator look at
# more than 5 tokens and CSRs a second once its burst is spent.
JOIN_BURST = 100
JOIN_RATE = 5.0
SOURCES_KEPT = 4096  # buckets kept; the least recently used goes first (it only gets a fresh, full bucket)


def server_options() -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", JOIN_MAX_BYTES),
            ("grpc.max_send_message_length", JOIN_MAX_SEND_BYTES),
            ("grpc.max_concurrent_streams", STREAMS_PER_CONNECTION),
            ("grpc.server_handshake_timeout_ms", HANDSHAKE_SECONDS * 1000),
            ("grpc.max_connection_idle_ms", IDLE_SECONDS * 1000),
            ("grpc.max_connection_age_ms", MAX_AGE_SECONDS * 1000),
            ("grpc.max_connection_age_grace_ms", GRACE_SECONDS * 1000),
            ("grpc.max_metadata_size", METADATA_BYTES),
            ("grpc.http2.bdp_probe", 0),  # the receive window stays 64 KiB (see CoordinatorServer.start)
            ("grpc.keepalive_permit_without_calls", 0)]


def join_server(listen: str, credentials: security.Credentials, servicer, health, outer: list,
                limiter: "JoinLimiter") -> tuple[grpc.aio.Server, int]:
    """The join port on the running event loop, not started: JoinService and health only, behind the gate
    (a caller without a certificate may only join), then the limiter. outer: interceptors in front (metrics)."""
    guard = security.AsyncGuard(security.Gate(), admit=limiter.admit)
    server = grpc.aio.server(interceptors=[*outer, guard], options=server_options(),
                             maximum_concurrent_rpcs=CONCURRENT_CALLS)
    agent_pb2_grpc.add_JoinServiceServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_secure_port(listen, credentials.join_server())
    if port == 0:
        raise OSError(f"cannot listen for joining nodes on {listen}")
    return server, port


class JoinLimiter:
    """A token bucket per source address, checked before a join's token or CSR is looked at."""

    def __init__(self, burst: int = JOIN_BURST, rate: float = JOIN_RATE, kept: int = SOURCES_KEPT,
                 clock=time.monotonic):
        self.burst, self.rate, self.kept, self.clock = burst, rate, kept, clock
        self.buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def take(self, source: str) -> bool:
        """Whether source may make one more call now (and counts it)."""
        now = self.clock()
        tokens, then = self.buckets.pop(source, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        allowed = tokens >= 1.0
        self.buckets[source] = (tokens - 1.0 if allowed else tokens, now)
        while len(self.buckets) > self.kept:
            self.buckets.popitem(last=False)
        return allowed

    def admit(self, context) -> None:
        """The guard's hook on the join port: raises Refused once the call's source has used its joins."""
        source = source_of(context.peer() or "")
        if not self.take(source):
            raise security.Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"too many joins from {source}: at most {self.burst} at once, then "
                                   f"{self.rate:g} a second; retry later")


def source_of(peer: str) -> str:
    """Where a call comes from, as the limiter counts it: gRPC's `ipv4:10.0.0.11:52214` is 10.0.0.11, an IPv6
    peer (`ipv6:[2001:db8::1]:443`, maybe %-escaped) its /64, since one host commonly holds a whole /64."""
    kind, _, rest = urllib.parse.unquote(peer).partition(":")
    host = rest.rsplit(":", 1)[0].strip("[]") if rest else ""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return peer or "unknown"  # a unix socket or an unknown kind: counted as it is named
    if address.version == 4:
        return str(address)
    if address.ipv4_mapped:
        return str(address.ipv4_mapped)
    return str(ipaddress.ip_network(f"{address}/64", strict=False))
