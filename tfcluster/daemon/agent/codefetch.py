"""Fetching a job's code archive for this node's cache (codecache.py), and serving the cache to other agents.

The launch names the agents that already hold the archive (`host:peer_port`), the coordinator after them: each
is tried in turn, and a transfer cut off goes on from the bytes already here with the next source. The
archive is checked against its SHA-256 before it is used, so a peer can at worst waste a try.

A peer serves an archive only for a job whose code it has itself (a task of that job used it here) and only
to nodes of the cluster (their certificates say so; the peer port's gate checks that). The coordinator, which
knows where each task is placed, serves only a node that has a task of the job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.codechunks import CodeError, hex_of, write_chunks
from tfcluster.security import Credentials

log = logging.getLogger("tfcluster.agent")

FETCH_TIMEOUT_SECONDS = 600.0  # a 256 MiB archive at a slow 1 MB/s still arrives


class Fetcher:
    """Fetches archives for the cache: `coordinator` is its address, `credentials` the node's (read at each
    fetch, so a renewed certificate is used)."""

    def __init__(self, coordinator: str, credentials: Callable[[], Credentials],
                 timeout_seconds: float = FETCH_TIMEOUT_SECONDS):
        self.coordinator, self.credentials, self.timeout = coordinator, credentials, timeout_seconds

    def __call__(self, hex_digest: str, job_id: str, sources: tuple[str, ...], dest: Path) -> None:
        failures = []
        for source in (*sources, ""):
            name = source or f"the coordinator ({self.coordinator})"
            try:
                offset = dest.stat().st_size if dest.exists() else 0
                request = agent_pb2.FetchCodeRequest(sha256=f"sha256:{hex_digest}", offset=offset, job_id=job_id)
                with self._channel(source) as channel:
                    chunks = self._call(channel, source, request)
                    size = write_chunks(chunks, dest, hex_digest)
                log.info("code: fetched sha256:%s (%d bytes) from %s for %s", hex_digest[:12], size, name, job_id)
                return
            except grpc.RpcError as e:
                failures.append(f"{name}: {e.details() or e.code().name}")
            except CodeError as e:
                failures.append(f"{name}: {e}")
            except OSError as e:  # the cache's disk: no other source helps
                raise CodeError(f"cannot write the code archive sha256:{hex_digest[:12]}...: {e}") from None
        raise CodeError(f"cannot fetch the job's code sha256:{hex_digest[:12]}...: " + "; ".join(failures))

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


class CodeServing:
    """What the peer port serves: the cache's archives, each for the jobs whose tasks used it here."""

    def __init__(self, archive_of: Callable[[str], Path | None]):
        self.archive_of = archive_of  # the archive's file if the cache holds it
        self.lock = threading.Lock()
        self.jobs: dict[str, str] = {}  # job id -> the hex digest of its code, as its launches named it

    def used_by(self, job_id: str, hex_digest: str) -> None:
        with self.lock:
            self.jobs[job_id] = hex_digest

    def path_for(self, sha256: str, job_id: str) -> Path:
        """The archive to serve, or CodeError saying why not."""
        hex_digest = hex_of(sha256)
        with self.lock:
            known = self.jobs.get(job_id)
        path = self.archive_of(hex_digest) if known == hex_digest else None
        if path is None:
            raise CodeError(f"this node holds no code sha256:{hex_digest[:12]}... of job {job_id[:100]!r}")
        return path
