"""A coordinator's gRPC port is one server whose services change while its connections stay
(tfcluster/daemon/coordinator/rpc/listener.py): a standby that wins serves its term over the connections clients
already had to it, behind the term's interceptors, and a term's end drops them. Real gRPC over real sockets; the
connections are read from the kernel's table of this process's sockets."""

from __future__ import annotations

import asyncio

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from tfcluster.daemon.coordinator.ha.standby import Refusal
from tfcluster.daemon.coordinator.rpc.listener import Listener, Services
from tfcluster.leaders import leader_hint

LEADER = "10.0.0.9:7070"


def connections_to(port: int) -> set[int]:
    """The local ports of this process's established TCP connections to port on this host."""
    return {c.laddr.port for c in psutil.Process().net_connections(kind="tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED}


class Recording(grpc.aio.ServerInterceptor):
    """Notes each call it sees in order; refuses the method `refused` with PERMISSION_DENIED."""

    def __init__(self, name: str, seen: list, refused: str = ""):
        self.name, self.seen, self.refused = name, seen, refused

    async def intercept_service(self, continuation, details):
        self.seen.append(self.name)
        if details.method == self.refused:
            async def deny(request, context):
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{self.name} refuses {details.method}")
            return grpc.unary_unary_rpc_method_handler(deny)
        return await continuation(details)


async def health_term(seen: list, refused: str = "") -> tuple[Services, list]:
    servicer = HealthServicer()
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    services = Services()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, services)
    return services, [Recording("outer", seen), Recording("inner", seen, refused)]


async def check(channel) -> health_pb2.HealthCheckResponse:
    return await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)


def test_a_standby_that_wins_serves_over_the_connection_it_refused_on():
    async def scenario():
        listener = Listener("127.0.0.1:0", None, Refusal(lambda: LEADER))
        await listener.server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{listener.port}") as channel:
            try:
                await check(channel)
                raise AssertionError("a standby served")
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE and leader_hint(e) == LEADER
            before = connections_to(listener.port)
            assert len(before) == 1
            seen: list[str] = []
            listener.serve(*await health_term(seen))
            assert (await check(channel)).status == health_pb2.HealthCheckResponse.SERVING
            assert seen == ["outer", "inner"], "the term's interceptors, outermost first"
            assert connections_to(listener.port) == before, "the same connection: no new handshake"
            await listener.server.stop(0)  # a term ends by stopping its server: its connections go with it
            try:
                await check(channel)
                raise AssertionError("a stopped server answered")
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE
            assert connections_to(listener.port) == set()
    asyncio.run(scenario())


def test_the_terms_interceptors_refuse_over_a_carried_connection_and_unknown_methods_are_unimplemented():
    async def scenario():
        listener = Listener("127.0.0.1:0", None, Refusal(lambda: LEADER))
        await listener.server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{listener.port}") as channel:
                check_call = channel.unary_unary("/grpc.health.v1.Health/Check",
                                            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                            response_deserializer=health_pb2.HealthCheckResponse.FromString)
                unknown = channel.unary_unary("/tfcluster.v1.Nothing/Here")
                for call, request in ((check_call, health_pb2.HealthCheckRequest()), (unknown, b"")):
                    try:  # a standby refuses everything, known to it or not
                        await call(request, timeout=5)
                        raise AssertionError("a standby answered")
                    except grpc.aio.AioRpcError as e:
                        assert e.code() == grpc.StatusCode.UNAVAILABLE
                seen: list[str] = []
                listener.serve(*await health_term(seen, refused="/grpc.health.v1.Health/Check"))
                try:
                    await check_call(health_pb2.HealthCheckRequest(), timeout=5)
                    raise AssertionError("the term's interceptor was passed by")
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "inner refuses" in e.details()
                try:
                    await unknown(b"", timeout=5)
                    raise AssertionError("a method no service has was answered")
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.UNIMPLEMENTED
        finally:
            await listener.server.stop(0)
    asyncio.run(scenario())
