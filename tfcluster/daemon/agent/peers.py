"""The agent's peer port: checkpoint files from other agents into this node's host-local checkpoint dirs.

Files arrive in chunks under an incoming dir, each checked against its SHA-256, and on commit move into
<state-dir>/jobs/<job>/checkpoints with the state files last, so the evaluator (or TensorFlow) never sees a
checkpoint whose files are not all there. What a peer may send is bounded: only agents of the cluster call
(their certificates say so), only for jobs the coordinator told this agent about, at most a quota of bytes
per job, and never through a symbolic link: a path that leads out of the job's dir is refused.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from tfcluster import layout
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.security import Credentials
from tfcluster.task import STATE_FILE

log = logging.getLogger("tfcluster.agent")

CHUNK_BYTES = 1024 * 1024
JOB_ID_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,80}-\d+(-[a-z0-9]{1,8})?")
DEFAULT_QUOTA_BYTES = 64 * 1024 ** 3  # `--peer-quota 64G`


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


class PeerServicer(agent_pb2_grpc.AgentPeerServiceServicer):
    """Receives files into this node's host-local checkpoint dirs."""

    def __init__(self, state_dir: Path, expects: Callable[[str], bool] = lambda job: True,
                 quota_bytes: int = DEFAULT_QUOTA_BYTES):
        self.state_dir, self.expects, self.quota = state_dir, expects, quota_bytes

    def PutFiles(self, request_iterator, context):
        try:
            received, size = self._receive(request_iterator)
        except Refused as e:
            context.abort(e.code, str(e))
        return agent_pb2.PutFilesReply(bytes=size, files=len(received))

    def _receive(self, request_iterator) -> tuple[list[str], int]:
        job_dir = incoming = out = digest = None
        received: list[str] = []
        size = allowed = 0
        try:
            for chunk in request_iterator:
                if job_dir is None:
                    job_dir, allowed = self._job_dir(chunk.job_id)
                    incoming = job_dir.parent / f"{layout.INCOMING_PREFIX}{uuid.uuid4().hex}"
                    incoming.mkdir()
                if chunk.commit:
                    self._commit(incoming, job_dir, received)
                    return received, size
                size += len(chunk.data)
                if size > allowed:
                    raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  f"{chunk.job_id}: more than this node's quota of {self.quota} bytes per job")
                if out is None:
                    path = _safe_relative(chunk.path)
                    (incoming / path).parent.mkdir(parents=True, exist_ok=True)
                    out, digest = _create(incoming / path), hashlib.sha256()
                out.write(chunk.data)
                digest.update(chunk.data)
                if chunk.end_of_file:
                    out.close()
                    out = None
                    if digest.hexdigest() != chunk.sha256:
                        raise Refused(grpc.StatusCode.DATA_LOSS, f"{path}: checksum mismatch")
                    received.append(path)
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "stream ended before commit")
        finally:
            if out is not None:
                out.close()
            if incoming is not None:
                shutil.rmtree(incoming, ignore_errors=True)

    def _job_dir(self, job_id: str) -> tuple[Path, int]:
        """The job's checkpoint dir, and how many more bytes it may receive."""
        if not JOB_ID_RE.fullmatch(job_id):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"job_id: not a job id: {job_id[:100]!r}")
        if not self.expects(job_id):
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{job_id}: the coordinator has not told this node to "
                                                             f"expect files of that job")
        job_dir = Path(layout.host_checkpoint_dir(str(self.state_dir), job_id))
        _no_links(self.state_dir, job_dir)
        job_dir.mkdir(parents=True, exist_ok=True)
        return job_dir, self.quota - _size(job_dir)

    def _commit(self, incoming: Path, job_dir: Path, received: list[str]) -> None:
        """Moves files into place; state files last, each with an atomic rename."""
        for path in sorted(received, key=lambda p: os.path.basename(p) == STATE_FILE):
            target = job_dir / path
            _no_links(self.state_dir, target)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(incoming / path, target)


def _safe_relative(path: str) -> str:
    normal = os.path.normpath(path) if path else ""
    if not normal or os.path.isabs(normal) or normal == ".." or normal.startswith(("../", layout.INCOMING_PREFIX)) \
            or "\0" in normal:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                      f"path: must stay inside the job's checkpoint dir, got {path[:200]!r}")
    return normal


def _no_links(root: Path, path: Path) -> None:
    """Refuses a path with a symbolic link anywhere below root (an existing file or dir in the way included)."""
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode):
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{current}: a symbolic link on the way; refused")


def _create(path: Path):
    """A new file, never through a link (O_NOFOLLOW) and never an existing one (O_EXCL)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    return os.fdopen(fd, "wb")


def _size(directory: Path) -> int:
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


class PeerServer:
    """The peer port: mutual TLS with the node's certificate (a renewed one is taken up at the next
    handshake), or plain text with --insecure."""

    def __init__(self, address: str, servicer: PeerServicer, credentials: Callable[[], Credentials]):
        self.address, self.credentials = address, credentials
        current = credentials()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="peer"),
                                  options=[("grpc.max_receive_message_length", 8 * CHUNK_BYTES)],
                                  interceptors=current.interceptors())
        agent_pb2_grpc.add_AgentPeerServiceServicer_to_server(servicer, self.server)
        if current.insecure:
            port = self.server.add_insecure_port(address)
        else:
            port = self.server.add_secure_port(address, self._reloading(current))
        if not port:
            raise OSError(f"cannot listen for peers on {address}")

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
        self.server.start()
        log.info("receiving checkpoints from other agents on %s", self.address)

    def stop(self, grace: float = 1.0) -> None:
        self.server.stop(grace)
