"""The coordinator's services for agents on grpc.aio: registration, the one stream each agent keeps,
certificate renewal, and joining (served on the join port). Thin: decode, call the Coordinator, encode.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from tfcluster import security, wire
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.codechunks import stream_archive
from tfcluster.daemon.coordinator.core.access.trust import TokenRefused
from tfcluster.daemon.coordinator.core.model.node_table import NameTaken
from tfcluster.daemon.coordinator.rpc.coordinator import Coordinator
from tfcluster.daemon.coordinator.rpc.outbox import StreamEnded
from tfcluster.daemon.logformat import fields
from tfcluster.leaders import LEASE_RAN_OUT
from tfcluster.pki import PkiError

log = logging.getLogger("tfcluster.coordinator")

SENDER_STOP_SECONDS = 5.0


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, coordinator: Coordinator):
        self.c = coordinator

    async def Register(self, request, context):
        if not self.c.acting():  # it would register the node in memory alone: the agent tries the next coordinator
            await context.abort(grpc.StatusCode.UNAVAILABLE, LEASE_RAN_OUT)
        try:
            session = self.c.register(request, security.caller())
        except NameTaken as e:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(e))
        except PermissionError as e:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return agent_pb2.RegisterResponse(session_id=session,
                                          heartbeat_interval_seconds=self.c.cluster.nodes.pace.interval)

    async def Connect(self, request_iterator, context):
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("kind") != "open":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message on Connect must be `open`")
        node, session = first.open.node_name, first.open.session_id
        try:
            outbox, generation = self.c.open_stream(node, session, security.caller())
        except PermissionError as e:
            code = grpc.StatusCode.PERMISSION_DENIED if "may not act" in str(e) else grpc.StatusCode.FAILED_PRECONDITION
            await context.abort(code, str(e))
        sender = Sender(context, outbox, generation)
        reason = ""
        try:
            while True:
                msg = await context.read()
                if msg is grpc.aio.EOF:
                    break
                if not self.c.on_agent_message(node, session, msg):
                    reason = "session no longer current; register again"
                    break
        except ValueError as e:
            reason = str(e)
        except Exception:  # a bug must cost one stream (the agent registers again), never the coordinator
            if not context.done():  # (reading a stream that the sender ended fails: nothing to report)
                log.exception("stream from %s failed", node, extra=fields(node=node))
                reason = "the coordinator failed to handle a message; register again"
        finally:
            await sender.stop()
            self.c.close_stream(node)
        if reason and not context.done():
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, reason)


    async def RenewCertificate(self, request, context):
        try:
            return agent_pb2.RenewCertificateResponse(certificate=self.c.renew(security.caller(), request.csr,
                                                                               _peer_ip(context)))
        except PkiError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    async def EndedJobs(self, request, context):
        try:
            job_ids = wire.ended_jobs_request_from_proto(request)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return wire.ended_jobs_response(self.c.ended_jobs(job_ids))

    async def FetchCode(self, request, context):
        who = security.caller()
        async for chunk in stream_archive(context, lambda: self.c.code_archive(request.sha256, request.job_id, who),
                                          request.offset):
            yield chunk


class JoinServicer(agent_pb2_grpc.JoinServiceServicer):
    def __init__(self, coordinator: Coordinator):
        self.c = coordinator

    async def Join(self, request, context):
        try:
            cert = self.c.join(request.token, request.node_name, request.csr, _peer_ip(context))
        except TokenRefused as e:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
        except PkiError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return agent_pb2.JoinResponse(certificate=cert, ca_certificate=self.c.authority.pem)


class Sender:
    """Writes a node's commands to its stream, beside the handler that reads the stream."""

    def __init__(self, context, outbox, generation: int):
        self.context, self.outbox, self.generation = context, outbox, generation
        self.stopping = False
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                message = await self.outbox.get(self.generation, lambda: self.stopping)
            except StreamEnded as e:
                await self.context.abort(e.code, str(e))
            if message is None:  # stopping
                return
            await self.context.write(message)

    async def stop(self) -> None:
        """Ends the sender after the write under way, if any: a write cancelled half-way and the stream's
        status sent after it collide in gRPC's core. A write stuck on a client that reads nothing is given up."""
        self.stopping = True
        self.outbox.wake()
        try:
            await asyncio.wait_for(asyncio.shield(self.task), SENDER_STOP_SECONDS)
        except asyncio.TimeoutError:
            self.task.cancel()
        except Exception:  # its abort, or the stream gone under its write: the stream is over either way
            pass


def _peer_ip(context) -> str:
    """The IPv4 address a call comes from (gRPC's `ipv4:10.0.0.11:52214`), "" for any other kind of peer."""
    peer = context.peer() or ""
    return peer[len("ipv4:"):].rsplit(":", 1)[0] if peer.startswith("ipv4:") else ""
