"""The coordinator's gRPC port as one server whose services change while its connections stay.

A standby serves refusals naming the leader on it (standby.py). When it wins, its term's services and their
interceptors (mutual-TLS identity checks, metrics) are served on the same server: the agents and clients already
connected to the standby call the new leader over the connections they have. Every agent keeps one to each
coordinator for its pulse (tfcluster/daemon/agent/session/pulse.py), so a failover costs no TLS handshake, when
thousands of agents move at once: a call over a new mutual-TLS connection costs the server about seven times the
CPU of one over an open connection (bench/connections.py). A coordinator on its own uses the same server with its
services from the start.

A term ends by stopping the server: every call of the term ends with it, and a standby listens anew.
"""

from __future__ import annotations

import functools

import grpc
from grpc_health.v1 import health_pb2_grpc

from tfcluster import security
from tfcluster.api.v1 import agent_pb2_grpc, control_pb2_grpc
from tfcluster.daemon.coordinator.rpc.stream_limits import DEFAULT_PER_CALLER

MAX_MESSAGE_BYTES = 64 << 20  # sent: one job's status with thousands of tasks still fits
# Taken in: the largest request any method takes (security.POLICY bounds each method below it).
MAX_RECEIVE_BYTES = security.MAX_REQUEST_BYTES
# Calls open at once on one connection (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS, unbounded in gRPC by default):
# a client's calls past it wait in the client for one to end. Every call gRPC takes in waits its turn on the
# event loop (about 0.3 ms each), ahead of the calls of the same method that come after it: a lower bound keeps
# fewer of one client's calls ahead of everyone else's. Twice the default share of open streams per caller (counted
# over all its connections), so that a client holding all of its share on one connection has as many places
# left for its other calls. An agent's session stream and its few other calls travel on a connection of its
# own, which no client's calls share.
STREAMS_PER_CONNECTION = 2 * DEFAULT_PER_CALLER
# Calls of one method waiting to be taken in (each method has a queue of its own, see _register_methods): past
# gRPC's default of 1,000 it drops calls at random with a bare CANCELLED, which would cost agents registering at once
# after a failover their calls. Every connection's streams bound the calls it may have waiting.
MAX_WAITING_CALLS = 100_000
# No BDP probing: it grows a connection's receive window to megabytes, and a message refused for its size from
# its length prefix would still come in up to that window (a 60 MB one cost 80 MB at a time). gRPC's 64 KiB
# window is ample for a LAN; what the coordinator sends is not affected. Pings without calls are allowed: an
# agent's kept connection to a standby carries none between its pulses.
OPTIONS = [("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.min_ping_interval_without_data_ms", 5000),
           ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES), ("grpc.http2.bdp_probe", 0),
           ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
           ("grpc.max_concurrent_streams", STREAMS_PER_CONNECTION),
           ("grpc.server.max_pending_requests", MAX_WAITING_CALLS),
           ("grpc.server.max_pending_requests_hard_limit", MAX_WAITING_CALLS)]


class Services:
    """The method handlers of gRPC services, collected as the generated add_*Servicer_to_server functions give
    them to a server."""

    def __init__(self) -> None:
        self.generic: list[grpc.GenericRpcHandler] = []
        self.registered: dict[str, dict[str, grpc.RpcMethodHandler]] = {}  # by service, by method

    def add_generic_rpc_handlers(self, handlers) -> None:
        self.generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self.registered[service] = dict(handlers)

    def handler(self, details) -> grpc.RpcMethodHandler | None:
        for generic in self.generic:
            found = generic.service(details)
            if found is not None:
                return found
        return None


def served(agent, control, health) -> Services:
    """The services of the coordinator's port, each given by its servicer."""
    services = Services()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(agent, services)
    control_pb2_grpc.add_ControlServiceServicer_to_server(control, services)
    health_pb2_grpc.add_HealthServicer_to_server(health, services)
    return services


class Listener(grpc.aio.ServerInterceptor):
    """A gRPC server on listen (credentials None: plain text) serving either refusals (refusal answers every
    method) or a term's services behind the term's interceptors. Not started here."""

    def __init__(self, listen: str, credentials: grpc.ServerCredentials | None,
                 refusal: grpc.GenericRpcHandler | None = None, options: list | None = None):
        self.refusal = refusal
        self.term: tuple[Services, list[grpc.aio.ServerInterceptor]] | None = None
        self.server = grpc.aio.server(interceptors=[self], options=OPTIONS if options is None else options)
        _register_methods(self.server)
        self.port = self.server.add_secure_port(listen, credentials) if credentials is not None else \
            self.server.add_insecure_port(listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {listen}")

    def serve(self, services: Services, interceptors: list[grpc.aio.ServerInterceptor]) -> None:
        """From the next call on, the services behind the interceptors (the first one outermost)."""
        self.term = (services, interceptors)

    async def intercept_service(self, continuation, details):
        term = self.term  # read once: a call is refused or goes through all of one term's interceptors
        if term is None:
            return self.refusal.service(details) if self.refusal is not None else None
        services, interceptors = term

        async def through(index: int, details):
            if index == len(interceptors):
                return services.handler(details)
            return await interceptors[index].intercept_service(functools.partial(through, index + 1), details)
        return await through(0, details)


def _register_methods(server: grpc.aio.Server) -> None:
    """Registers every method the port serves by name, before the server starts. gRPC then takes in the calls of
    each method through a queue of its own, each with a call asked for ahead: a status call is taken in at the
    event loop's next turn, not behind the thousands of streams or registrations that came in before it (an
    unregistered method's calls all wait in one queue, taken in one per turn). The handlers given here are the
    generated servicers' own, which answer UNIMPLEMENTED: each call still goes through intercept_service, which
    hands it to the term's services or to the refusal."""
    services = served(agent_pb2_grpc.AgentServiceServicer(), control_pb2_grpc.ControlServiceServicer(),
                      health_pb2_grpc.HealthServicer())
    for service, handlers in services.registered.items():
        server.add_registered_method_handlers(service, handlers)
