"""Fetching a job's code archive for this node's cache (code/cache.py), and serving the cache to other agents.

The launch names the agents that already hold the archive (`host:peer_port`), the coordinator after them: each
is tried in turn, and a transfer cut off goes on from the bytes already here with the next source. The
archive is checked against its SHA-256 before it is used, so a peer can at worst waste a try.

A peer serves an archive only for a job whose code it has itself (a task of that job used it here) and only
to the nodes the coordinator sent to it for that job's code (ServeCode: their launches name this node as a
source), each known by its certificate. The coordinator, which knows where each task is placed, serves only a
node that has a task of the job. Both answer a node they do not serve as they answer for an archive they
do not hold, so that asking tells nothing of another job's code.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.codechunks import CodeError, hex_of, stream_archive, write_chunks
from tfcluster.daemon.agent.code.relay import Transfer, Transfers, relay
from tfcluster.security import Credentials

log = logging.getLogger("tfcluster.agent")

FETCH_TIMEOUT_SECONDS = 600.0  # a 256 MiB archive at a slow 1 MB/s still arrives
# A peer that sends nothing for this long is left for the next source: a relay whose own source stalled.
PEER_IDLE_SECONDS = 10.0
# How long a peer asked for an archive waits to learn of it: its own launch of the job may come after the
# asking node's (both are sent at once).
PEER_WAIT_SECONDS = 5.0


class Fetcher:
    """Fetches archives for the cache: `coordinator` is its address, `credentials` the node's (read at each
    fetch, so a renewed certificate is used). `transfers` says how far each fetch under way has got, for the
    peers this node relays it to (code/relay.py)."""

    def __init__(self, coordinator: str | Callable[[], str], credentials: Callable[[], Credentials],
                 timeout_seconds: float = FETCH_TIMEOUT_SECONDS, peer_idle_seconds: float = PEER_IDLE_SECONDS):
        # An address, or where the agent's session finds the leading coordinator now (several may stand by).
        self._coordinator = coordinator if callable(coordinator) else (lambda: coordinator)
        self.credentials, self.timeout = credentials, timeout_seconds
        self.peer_idle = peer_idle_seconds
        self.transfers = Transfers()

    @property
    def coordinator(self) -> str:
        return self._coordinator()

    def __call__(self, hex_digest: str, job_id: str, sources: tuple[str, ...], dest: Path) -> None:
        failures: list[str] = []
        transfer = self.transfers.start(hex_digest, dest)
        tries, fetched = [*sources, ""], False
        try:
            while tries:
                source = tries.pop(0)
                offset = dest.stat().st_size if dest.exists() else 0
                error = self._try(source, hex_digest, job_id, offset, dest, transfer)
                if not error:
                    fetched = True
                    return
                failures.append(f"{source or f'the coordinator ({self.coordinator})'}: {error}")
                if not dest.exists() and transfer.progress()[1]:  # its bytes were wrong: what relays read is gone
                    transfer.fail()
                    transfer = self.transfers.start(hex_digest, dest)
                    if not source and offset:  # the coordinator's own copy, whole, once more
                        tries.append("")
        except OSError as e:  # the cache's disk: no other source helps
            raise CodeError(f"cannot write the code archive sha256:{hex_digest[:12]}...: {e}") from None
        finally:
            self.transfers.end(hex_digest, transfer)
            if not fetched:  # relays reading it give up too, and their peers go to their next source
                transfer.fail()
        raise CodeError(f"cannot fetch the job's code sha256:{hex_digest[:12]}...: " + "; ".join(failures))

    def _try(self, source: str, hex_digest: str, job_id: str, offset: int, dest: Path, transfer: Transfer) -> str:
        """One source's try from `offset`: "" once the archive is whole and checked, else why not."""
        name = source or f"the coordinator ({self.coordinator})"
        request = agent_pb2.FetchCodeRequest(sha256=f"sha256:{hex_digest}", offset=offset, job_id=job_id)
        try:
            with self._channel(source) as channel:
                call = self._call(channel, source, request)
                with _Watchdog(call, self.peer_idle if source else None) as chunks:
                    size = write_chunks(chunks, dest, hex_digest, transfer.advanced)
        except grpc.RpcError as e:
            return e.details() or e.code().name
        except CodeError as e:
            return str(e)
        log.info("code: fetched sha256:%s (%d bytes) from %s for %s", hex_digest[:12], size, name, job_id)
        return ""

    def _channel(self, source: str) -> grpc.Channel:
        credentials = self.credentials()
        if not source:
            return credentials.channel(self.coordinator)
        # A peer's certificate names the address the coordinator saw it at (pki.py), which is what the
        # coordinator lists as its source.
        return credentials.channel(source, server_name=source.rsplit(":", 1)[0].strip("[]"))

    def _call(self, channel: grpc.Channel, source: str, request: agent_pb2.FetchCodeRequest):
        if source:
            return agent_pb2_grpc.AgentPeerServiceStub(channel).GetCode(request, timeout=self.timeout)
        return agent_pb2_grpc.AgentServiceStub(channel).FetchCode(request, timeout=self.timeout)


class _Watchdog:
    """The chunks of a streaming call, which it cancels when no chunk has come for `idle` seconds: a relay whose
    own source stalled is left for the next source, with the bytes it gave kept."""

    def __init__(self, call, idle: float | None):
        self.call, self.idle = call, idle
        self.last = time.monotonic()
        self.done = threading.Event()

    def __enter__(self):
        if self.idle is None:  # the coordinator: the call's own deadline is enough
            return self.call
        threading.Thread(target=self._watch, name="code-watchdog", daemon=True).start()
        return self._chunks()

    def __exit__(self, *exc) -> None:
        self.done.set()

    def _chunks(self):
        for chunk in self.call:
            self.last = time.monotonic()
            yield chunk

    def _watch(self) -> None:
        while not self.done.wait(min(1.0, self.idle)):
            if time.monotonic() - self.last > self.idle:
                log.warning("code: a source sent nothing for %.0f s; trying the next", self.idle)
                self.call.cancel()
                return


class CodeServing:
    """What the peer port serves: the archives of the jobs whose launches here named them, whole from the cache,
    or as far as this node's own fetch has got (code/relay.py)."""

    def __init__(self, archive_of: Callable[[str], Path | None],
                 in_flight: Callable[[str], Transfer | None] = lambda hex_digest: None,
                 wait_seconds: float = PEER_WAIT_SECONDS):
        self.archive_of = archive_of  # the archive's file once whole and checked
        self.in_flight, self.wait = in_flight, wait_seconds
        self.lock = threading.Lock()
        self.jobs: dict[str, str] = {}  # job id -> the hex digest of its code, as its launches named it
        self.fetchers: dict[str, set[str]] = {}  # job id -> the nodes the coordinator sent here for its code

    def used_by(self, job_id: str, hex_digest: str) -> None:
        with self.lock:
            self.jobs[job_id] = hex_digest

    def forget(self, job_ids: set[str]) -> None:
        """This node keeps no attempt of these jobs any more: a peer that asks for their code is told NOT_FOUND,
        and fetches it from the coordinator."""
        with self.lock:
            for job_id in job_ids:
                self.jobs.pop(job_id, None)
                self.fetchers.pop(job_id, None)

    def serve_to(self, job_id: str, node: str) -> None:
        """The coordinator sent `node` here for the job's code (ServeCode)."""
        with self.lock:
            self.fetchers.setdefault(job_id, set()).add(node)

    def source_for(self, sha256: str, job_id: str, asker: str | None = None) -> Path | Transfer | None:
        """The archive's file, or its fetch under way here, for a job whose launch named it, to a node the
        coordinator sent here for it (asker None: no certificate, with --insecure); None: neither (yet).
        Raises CodeError for a name that is no archive's."""
        hex_digest = hex_of(sha256)
        with self.lock:
            if self.jobs.get(job_id) != hex_digest:
                return None
            if asker is not None and asker not in self.fetchers.get(job_id, ()):
                return None
        return self.archive_of(hex_digest) or self.in_flight(hex_digest)

    async def stream(self, context, request, executor=None, asker: str | None = None):
        """A GetCode answer to node `asker`. A node asked before its own launch of the job came, or before the
        coordinator's word that the asker may have it (or between its fetch and the archive's place in the
        cache), waits a moment for it, then says NOT_FOUND: the same for code not here and code not the
        asker's."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait
        while True:
            try:
                source = self.source_for(request.sha256, request.job_id, asker)
            except CodeError as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            if isinstance(source, Path):
                async for chunk in stream_archive(context, lambda: source, request.offset, executor):
                    yield chunk
                return
            if source is not None:
                try:
                    file = open(source.path, "rb")  # the fetch may have just ended: its file is renamed
                except FileNotFoundError:
                    source = None
                else:
                    async for chunk in relay(context, file, source, hex_of(request.sha256), request.offset, executor):
                        yield chunk
                    return
            if loop.time() >= deadline:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"this node holds no code {request.sha256[:19]}... "
                                                               f"of job {request.job_id[:100]!r}")
            await asyncio.sleep(0.05)
