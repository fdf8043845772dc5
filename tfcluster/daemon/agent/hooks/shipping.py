"""Checkpoints between nodes without shared storage, agent to agent over gRPC (AgentPeerService): sending.

A Shipper follows one task's checkpoint dir through its `checkpoint` state file and, for each newly
committed checkpoint, streams its files and then the state file to every target; ShippingHook starts one
for each ShipCheckpoints order. `sync_dir` copies a whole checkpoint dir (a restarted group's new nodes need
the chief's backups too: copies.py). Receiving is peers/server.py. Only what the task itself wrote leaves the node: a
file is sent only if it is a regular file of the task's user, reached without following a link (handback.py).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import grpc

from tfcluster import layout, pki
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.checkpoints import STATE_FILE, latest_checkpoint
from tfcluster.commands import ShipCheckpoints
from tfcluster.daemon.agent.hooks.api import TaskHook
from tfcluster.daemon.agent.tasks import handback
from tfcluster.daemon.logformat import fields
from tfcluster.model import Attempt
from tfcluster.security import Credentials

log = logging.getLogger("tfcluster.agent")

CHUNK_BYTES = 1024 * 1024
FOLLOW_POLL_SECONDS = 0.2
FINAL_TRIES = 5
FINAL_RETRY_SECONDS = 1.0
SEND_TIMEOUT_SECONDS = 600.0


class ShipError(Exception):
    pass


class Peer(NamedTuple):
    """Where files go: a node's peer address, and the node the coordinator says is there (the sender accepts
    that node's certificate alone)."""
    address: str
    node: str

    def __str__(self) -> str:
        return f"{self.node} ({self.address})" if self.node else self.address


def peers(addresses: tuple[str, ...], nodes: tuple[str, ...]) -> list[Peer]:
    """The targets of a shipping or copy order; a coordinator before 0.3 names no nodes ("")."""
    return [Peer(address, node) for address, node in zip(addresses, nodes or ("",) * len(addresses))]


def job_checkpoint_dir(state_dir: Path, job_id: str) -> Path:
    """A job's host-local checkpoint dir on a node (what the coordinator gives its tasks)."""
    return Path(layout.host_checkpoint_dir(str(state_dir), job_id))


def checkpoint_files(directory: str, prefix: str) -> list[str]:
    """The files of a committed checkpoint: its index and its data shards."""
    base = os.path.basename(prefix)
    names = [n for n in os.listdir(directory) if n == f"{base}.index" or n.startswith(f"{base}.data-")]
    return sorted(names, key=lambda n: n.endswith(".index"))  # data first, index after


def _chunks(job_id: str, opened: deque[tuple[str, int]], extra: dict[str, bytes]) -> Iterator[agent_pb2.FileChunk]:
    """The files opened (name, descriptor: each is taken off `opened` and closed once read), then in-memory files
    (a state file captured when the checkpoint was seen)."""
    while opened:
        name, fd = opened.popleft()
        digest = hashlib.sha256()
        with os.fdopen(fd, "rb") as f:
            while True:
                data = f.read(CHUNK_BYTES)
                digest.update(data)
                if len(data) < CHUNK_BYTES:
                    yield agent_pb2.FileChunk(job_id=job_id, path=name, data=data, end_of_file=True,
                                              sha256=digest.hexdigest())
                    break
                yield agent_pb2.FileChunk(job_id=job_id, path=name, data=data)
    for name, data in extra.items():
        yield agent_pb2.FileChunk(job_id=job_id, path=name, data=data, end_of_file=True,
                                  sha256=hashlib.sha256(data).hexdigest())
    yield agent_pb2.FileChunk(job_id=job_id, commit=True)


def put_files(target: Peer, job_id: str, directory: str, names: list[str], credentials: Credentials,
              extra: dict[str, bytes] | None = None) -> tuple[int, float]:
    """Sends files to the agent of target (only that node's certificate is accepted); returns (bytes, seconds).
    Raises OSError (handback.NotTheTasks: a file the task did not make) before anything is sent."""
    if not target.node and not credentials.insecure:
        raise ShipError(f"{target}: the coordinator did not say which node is there (it is older than this agent: "
                        f"upgrade it)")
    owner = handback.owner_of(directory)
    opened: deque[tuple[str, int]] = deque()
    try:
        for name in names:
            opened.append((name, handback.open_below(directory, name, owner)))
        started = time.monotonic()
        with credentials.channel(target.address, server_name=pki.node_server_name(target.node)) as channel:
            stub = agent_pb2_grpc.AgentPeerServiceStub(channel)
            try:
                reply = stub.PutFiles(_chunks(job_id, opened, extra or {}), timeout=SEND_TIMEOUT_SECONDS)
            except grpc.RpcError as e:
                raise ShipError(f"{target}: {e.details() or e.code().name}") from None
    finally:
        while opened:  # those the stream did not reach
            os.close(opened.popleft()[1])
    return reply.bytes, time.monotonic() - started


def sync_dir(target: Peer, job_id: str, directory: str, credentials: Credentials) -> tuple[int, float]:
    """Copies every file under directory (state files last) to the agent of target."""
    names = [name for name, _, _ in handback.files_under(directory)]
    names.sort(key=lambda n: (os.path.basename(n) == STATE_FILE, n))
    return put_files(target, job_id, directory, names, credentials)


class Shipper:
    """Ships each new committed checkpoint of one task to its targets until the task has ended."""

    def __init__(self, job_id: str, directory: str, targets: list[Peer], task_ended: threading.Event,
                 name: str, credentials: Callable[[], Credentials],
                 on_sent: Callable[[int, float], None] = lambda size, seconds: None,
                 on_failed: Callable[[], None] = lambda: None):
        self.job_id, self.directory, self.name = job_id, directory, name
        self.on_sent, self.on_failed = on_sent, on_failed  # the agent's metrics
        self.credentials = credentials  # the node's current ones: a renewed certificate is used from then on
        self.targets = list(targets)
        self.task_ended = task_ended
        self.shipped: dict[Peer, str] = {}  # target -> last checkpoint sent there
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"ship-{name}", daemon=True)

    def start(self) -> "Shipper":
        self.thread.start()
        return self

    def retarget(self, targets: list[Peer]) -> None:
        with self.lock:
            self.targets = list(targets)

    def _run(self) -> None:
        while not self.task_ended.is_set():
            self._ship_newest()
            self.task_ended.wait(FOLLOW_POLL_SECONDS)
        # The task has ended: its last checkpoint is the final one the evaluator waits for.
        for attempt in range(FINAL_TRIES):
            if self._ship_newest():
                return
            time.sleep(FINAL_RETRY_SECONDS * (attempt + 1))
        log.error("%s: the final checkpoint could not be shipped after %d tries", self.name, FINAL_TRIES,
                  extra=fields(job=self.job_id))

    def _ship_newest(self) -> bool:
        """Ships the newest committed checkpoint where it has not gone yet; True when every target has it."""
        try:
            state = handback.read_bytes(os.path.join(self.directory, STATE_FILE), handback.owner_of(self.directory))
        except OSError:
            return True
        prefix = latest_checkpoint(self.directory, state.decode(errors="replace"))
        if prefix is None:
            return True
        with self.lock:
            targets = [t for t in self.targets if self.shipped.get(t) != prefix]
        failed = False
        for target in targets:
            try:
                names = checkpoint_files(self.directory, prefix)
                size, seconds = put_files(target, self.job_id, self.directory, names, self.credentials(),
                                          {STATE_FILE: state})
            except (OSError, ShipError) as e:  # deleted meanwhile (max_to_keep), or the peer is away
                log.warning("%s: shipping %s to %s failed: %s", self.name, os.path.basename(prefix), target, e,
                            extra=fields(job=self.job_id))
                self.on_failed()
                failed = True
                continue
            self.shipped[target] = prefix
            self.on_sent(size, seconds)
            log.info("%s: shipped %s to %s: %.1f MB in %.3f s (%.1f MB/s)", self.name, os.path.basename(prefix),
                     target, size / 1e6, seconds, size / 1e6 / max(seconds, 1e-6), extra=fields(job=self.job_id))
        return not failed


class ShippingHook(TaskHook):
    """Carries out ShipCheckpoints: a Shipper for the attempt, or new targets for the one it has."""
    commands = (ShipCheckpoints,)

    def __init__(self, current: Callable[[Attempt], object], credentials: Callable[[], Credentials], metrics):
        self.current = current  # the supervisor's record of exactly this attempt, if it is the task's newest
        self.credentials = credentials
        self.metrics = metrics  # the agent's (metrics.py)
        self.shippers: dict[Attempt, Shipper] = {}

    def handle(self, order: ShipCheckpoints) -> None:
        record = self.current(order.attempt)
        if record is None or record.exited.is_set() or not record.checkpoint_dir:
            return
        shipper = self.shippers.get(order.attempt)
        if shipper is not None and shipper.thread.is_alive():
            shipper.retarget(peers(order.targets, order.target_nodes))
            return
        for old in [k for k, s in self.shippers.items() if not s.thread.is_alive()]:
            del self.shippers[old]
        self.shippers[order.attempt] = Shipper(
            order.attempt.job_id, record.checkpoint_dir, peers(order.targets, order.target_nodes), record.exited,
            record.name, self.credentials, on_sent=functools.partial(self.metrics.shipped, "new"),
            on_failed=functools.partial(self.metrics.ship_failed, "new")).start()
