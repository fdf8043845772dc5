"""The agent's peer port: checkpoint files from other agents into this node's host-local checkpoint dirs, and
the node's cache of jobs' code out to the agents the coordinator sends here for it (code/fetch.py).

Files arrive in chunks under an incoming dir, each checked against its SHA-256, and on commit move into
<state-dir>/jobs/<job>/checkpoints with the state files last, so the evaluator (or TensorFlow) never sees a
checkpoint whose files are not all there (peers/files.py). What a peer may send is bounded: only agents of the
cluster call (their certificates say so, and none the coordinator revoked), only for jobs the coordinator
told this agent about and only from the node it named as their sender, at most a quota of bytes per job,
and never through a symbolic link.

A sender cannot hold the port: the server runs on asyncio, on a thread and event loop of its own (a stalled
stream costs a coroutine, not a thread), each transfer has a deadline and an idle timeout between chunks,
and one sender (and all of them together) may run only so many transfers at once. File work runs on a
small pool of threads, off the loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from tfcluster import auth
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.daemon.agent.code.fetch import CodeServing
from tfcluster.daemon.agent.peers.files import JOB_ID_RE, Refused, as_refusal, open_incoming, owner
from tfcluster.pki import NODE, Identity
from tfcluster.security import AsyncGuard, Credentials, Gate, caller

log = logging.getLogger("tfcluster.agent")

CHUNK_BYTES = 1024 * 1024
DEFAULT_QUOTA_BYTES = 64 * 1024 ** 3  # `--peer-quota 64G`
FILE_THREADS = 4
START_SECONDS = 30.0
EXPECT_POLL_SECONDS = 0.05  # how often a sender that came first looks again for the coordinator's word


@dataclass(frozen=True)
class Expectation:
    """What the coordinator said of a job's files (ExpectFiles): the node that alone may send them ("": any
    node of the cluster, as a coordinator before 0.3 says), and the task user they go to (0: none)."""
    sender: str = ""
    uid: int = 0
    gid: int = 0


ANYONE = Expectation()


@dataclass(frozen=True)
class Limits:
    """How long one transfer may take, how long it may send nothing, and how many may run at once."""
    deadline_seconds: float = 600.0  # as long as a sender waits (shipping.SEND_TIMEOUT_SECONDS)
    idle_seconds: float = 10.0  # a sender that streams a file never pauses this long between 1 MiB chunks
    per_sender: int = 8
    total: int = 32
    # The coordinator tells this node to expect a job's files and the sender to send them in one breath, on two
    # streams: the sender can be here first. Its files wait this long for the coordinator's word before refusal.
    expect_wait_seconds: float = 2.0


class RevokedNodes:
    """The node certificates the coordinator no longer accepts (its Revocations list, whole each time)."""

    def __init__(self):
        self.before: dict[str, float] = {}

    def update(self, revoked: tuple[tuple[str, float], ...]) -> None:
        self.before = dict(revoked)  # replaced at once: the gate reads it from another thread

    def refusal(self, who: Identity) -> str:
        before = self.before.get(who.name) if who.role == NODE else None
        if before is None or who.issued >= before:
            return ""
        return "holds a certificate the coordinator revoked (the node was removed from the cluster or replaced)"


class PeerServicer(agent_pb2_grpc.AgentPeerServiceServicer):
    """Receives files into this node's host-local checkpoint dirs. `expects` says what the coordinator told of
    a job (None: nothing, its files are refused); `is_revoked` why a caller's certificate is refused."""

    def __init__(self, state_dir: Path, expects: Callable[[str], Expectation | None] = lambda job: ANYONE,
                 quota_bytes: int = DEFAULT_QUOTA_BYTES, limits: Limits = Limits(),
                 is_revoked: Callable[[Identity], str] = lambda who: "", code: CodeServing | None = None):
        self.state_dir, self.expects, self.quota, self.limits = state_dir, expects, quota_bytes, limits
        self.is_revoked = is_revoked
        self.code = code or CodeServing(lambda hex_digest: None)  # the node's cache of jobs' code, to serve
        state_dir.mkdir(parents=True, exist_ok=True)
        self.files = futures.ThreadPoolExecutor(max_workers=FILE_THREADS, thread_name_prefix="peer-files")
        self.streams: Counter[str] = Counter()  # transfers under way per sender; touched on the loop only

    async def PutFiles(self, request_iterator, context):
        who = caller()
        sender = who.name if who is not None else context.peer().rpartition(":")[0]
        try:
            self._admit(sender)
        except Refused as e:
            await context.abort(e.code, str(e))
        self.streams[sender] += 1
        try:
            files, size = await self._receive(request_iterator, who)
        except Refused as e:
            log.warning("refused checkpoint files from %s: %s", who or sender, e)
            await context.abort(e.code, str(e))
        finally:
            self.streams[sender] -= 1
            if not self.streams[sender]:
                del self.streams[sender]
        return agent_pb2.PutFilesReply(bytes=size, files=files)

    async def GetCode(self, request, context):
        who = caller()
        async for chunk in self.code.stream(context, request, self.files, who.name if who is not None else None):
            yield chunk

    def _admit(self, sender: str) -> None:
        if self.streams[sender] >= self.limits.per_sender:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{sender} already sends {self.limits.per_sender} transfers to this node, the most one "
                          f"sender may; try again when one has ended")
        if sum(self.streams.values()) >= self.limits.total:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"this node already receives {self.limits.total} transfers, the most it takes at once; "
                          f"try again when one has ended")

    async def _receive(self, requests, who: Identity | None) -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.deadline_seconds
        chunks, incoming = requests.__aiter__(), None
        try:
            while True:
                chunk = await self._next(chunks, deadline)
                if incoming is None:
                    expected = await self._expected(chunk.job_id, who)
                    incoming = await self._run(chunk.job_id, open_incoming, self.state_dir, chunk.job_id,
                                               self.quota, owner(expected.uid, expected.gid))
                if chunk.commit:
                    if who is not None and self.is_revoked(who):  # revoked while it was sending
                        raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{who} {self.is_revoked(who)}")
                    await self._run(chunk.job_id, incoming.commit)
                    return len(incoming.received), incoming.size
                await self._run(chunk.job_id, incoming.write, chunk.path, chunk.data, chunk.end_of_file,
                                chunk.sha256, self.quota)
        finally:
            if incoming is not None:
                # Awaited, so that an answered transfer has left nothing behind; shielded, so that the files of
                # a cancelled one are removed all the same.
                await asyncio.shield(loop.run_in_executor(self.files, incoming.close))

    async def _next(self, chunks, deadline: float) -> agent_pb2.FileChunk:
        left = deadline - asyncio.get_running_loop().time()
        wait = min(self.limits.idle_seconds, left)
        try:
            return await asyncio.wait_for(chunks.__anext__(), max(wait, 0.0))
        except StopAsyncIteration:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "stream ended before commit") from None
        except asyncio.TimeoutError:
            why = f"nothing arrived for {self.limits.idle_seconds:g} s" if wait < left else \
                f"the transfer took longer than {self.limits.deadline_seconds:g} s"
            raise Refused(grpc.StatusCode.DEADLINE_EXCEEDED, f"{why}; ended") from None

    async def _expected(self, job_id: str, who: Identity | None) -> Expectation:
        """What the coordinator told of the job, once the caller is the sender it named; waited for a while
        (Limits.expect_wait_seconds), as the coordinator's word may still be on its way."""
        if not JOB_ID_RE.fullmatch(job_id):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"job_id: not a job id: {job_id[:100]!r}")
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.limits.expect_wait_seconds
        expected = self.expects(job_id)
        while expected is None and loop.time() < give_up:
            await asyncio.sleep(EXPECT_POLL_SECONDS)
            expected = self.expects(job_id)
        if expected is None:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED,
                          f"{job_id}: the coordinator has not told this node to expect files of that job (waited "
                          f"{self.limits.expect_wait_seconds:g} s for it)")
        if expected.sender and who is not None and who.name != expected.sender:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED,
                          f"{job_id}: the coordinator named node {expected.sender} as the sender of this job's "
                          f"files; {who} may not send them")
        return expected

    async def _run(self, job_id: str, function, *args):
        try:
            return await asyncio.get_running_loop().run_in_executor(self.files, function, *args)
        except OSError as e:
            raise as_refusal(e, job_id) from None


class PeerServer:
    """The peer port: mutual TLS with the node's certificate (a renewed one is taken up at the next
    handshake), or plain text with --insecure; a grpc.aio server on a thread and event loop of its own."""

    def __init__(self, address: str, servicer: PeerServicer, credentials: Callable[[], Credentials]):
        self.address, self.servicer, self.credentials = address, servicer, credentials
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="peers", daemon=True)
        self.thread.start()
        try:
            self.server = self._on_loop(self._bind())
        except BaseException:
            self._end_loop()
            raise

    def _on_loop(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=START_SECONDS)

    async def _bind(self) -> grpc.aio.Server:
        current = self.credentials()
        interceptors = auth.async_server_interceptors(current.token) if current.insecure else \
            [AsyncGuard(Gate(self.servicer.is_revoked))]
        server = grpc.aio.server(interceptors=interceptors,
                                 options=[("grpc.max_receive_message_length", 8 * CHUNK_BYTES)])
        agent_pb2_grpc.add_AgentPeerServiceServicer_to_server(self.servicer, server)
        try:
            port = server.add_insecure_port(self.address) if current.insecure else \
                server.add_secure_port(self.address, self._reloading(current))
        except RuntimeError as e:  # grpc raises where it once returned 0
            raise OSError(f"cannot listen for peers on {self.address}: {e}") from None
        if not port:
            raise OSError(f"cannot listen for peers on {self.address}")
        return server

    def _reloading(self, initial: Credentials) -> grpc.ServerCredentials:
        served = [initial]

        def configuration(creds: Credentials):
            return grpc.ssl_server_certificate_configuration([(creds.key, creds.cert)], root_certificates=creds.ca)

        def fetch():
            latest = self.credentials()
            if latest is served[0]:
                return None
            served[0] = latest
            return configuration(latest)
        return grpc.dynamic_ssl_server_credentials(configuration(initial), fetch,
                                                   require_client_authentication=True)

    def start(self) -> None:
        self._on_loop(self.server.start())
        log.info("receiving checkpoints from other agents on %s", self.address)

    def stop(self, grace: float = 1.0) -> None:
        if self.thread.is_alive():
            try:
                self._on_loop(self.server.stop(grace))
            finally:
                self._end_loop()
        self.servicer.files.shutdown(wait=False)

    def _end_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
