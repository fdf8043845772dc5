"""The coordinator process: one asyncio event loop owns the cluster model, the store and the agents' streams.

Every event runs to completion on the loop (the model never awaits), so nothing needs a lock. What an
event changes is written by the writer task: it collects every unsaved record into one batch, writes it on
a thread of its own, and only then sends the commands the changes produced: agents never act on a
decision a crash could forget. Changes that arrive during a write go into the next batch, so under load
one transaction carries many events. A client that needs durability (a submission) waits for the batch
that holds its change.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from tfcluster import pki, wire
from tfcluster.api.v1 import agent_pb2
from tfcluster.daemon.coordinator.cluster import Cluster
from tfcluster.daemon.coordinator.node import LOST
from tfcluster.daemon.coordinator.logins import Logins
from tfcluster.daemon.coordinator.records import Changes, job_from_docs, node_from_doc, trust_from_docs
from tfcluster.daemon.coordinator.store import SqliteStore, Store
from tfcluster.daemon.coordinator.taskusers import UidRange
from tfcluster.daemon.coordinator.trust import Trust
from tfcluster.daemon.coordinator.watch import Watchers
from tfcluster.daemon.logformat import fields
from tfcluster.model import Attempt, CancelLog, Command, LogData, ReadLog, Revocations
from tfcluster.pki import Identity, PkiError
from tfcluster.security import REMOVED, REPLACED

log = logging.getLogger("tfcluster.coordinator")

TICK_SECONDS = 0.2
LATE_FORGIVEN_SECONDS = 0.1  # a tick this much later than due means heartbeats waited unread as long
RECONNECT_GRACE_SECONDS = 10.0
WRITE_RETRY_SECONDS = 1.0
OUTBOX_LIMIT = 10_000  # commands kept for a node whose stream is away (reconcile resends what is dropped)
PENDING_LIMIT = 100_000  # commands waiting for a write that succeeds
LOG_CHUNKS_BUFFERED = 256  # 64 KiB each: a log client this far behind the agent is told so


class StreamEnded(Exception):
    """The coordinator ends a node's stream: the code and the reason go to the agent as the stream's status."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


class Outbox:
    """Commands waiting for a node's stream. It outlives streams; a new stream takes it over."""

    def __init__(self) -> None:
        self.items: collections.deque = collections.deque(maxlen=OUTBOX_LIMIT)
        self.ready = asyncio.Event()
        self.generation = 0
        self.ended: StreamEnded | None = None  # why the node's stream must end now (it was removed), once it must

    def put(self, message) -> None:
        self.items.append(message)
        self.ready.set()

    def take_over(self) -> int:
        self.generation += 1
        self.ready.set()  # wakes the old stream's sender, which sees it was replaced
        return self.generation

    def end(self, reason: StreamEnded) -> None:
        self.ended = reason
        self.ready.set()

    def wake(self) -> None:
        self.ready.set()

    async def get(self, generation: int, stopping: Callable[[], bool] = lambda: False):
        """The next message for the stream of this generation; None once it is stopping. Raises StreamEnded when
        the stream must end: the node was removed, or a newer stream of it took over (the agent hears so, rather
        than keeping a call that nobody answers)."""
        while True:
            if self.ended:
                raise self.ended
            if self.generation != generation:
                raise StreamEnded(grpc.StatusCode.ABORTED, "a newer connection of this node took over its stream")
            if stopping():
                return None
            if self.items:
                return self.items.popleft()
            self.ready.clear()
            await self.ready.wait()


class LogWaiter:
    def __init__(self, node: str):
        self.node = node
        self.chunks: asyncio.Queue[LogData] = asyncio.Queue(maxsize=LOG_CHUNKS_BUFFERED + 1)

    def put(self, data: LogData) -> bool:
        """Queues a chunk for the client; False (and an error for it instead) when it has fallen too far behind."""
        if self.chunks.qsize() >= LOG_CHUNKS_BUFFERED:
            self.fail(data.request_id, "the log arrives faster than the client reads it; try --tail")
            return False
        self.chunks.put_nowait(data)
        return True

    def fail(self, request_id: int, error: str) -> None:
        while self.chunks.full():
            self.chunks.get_nowait()
        self.chunks.put_nowait(LogData(request_id, eof=True, error=error))


class Coordinator:
    """The model and everything around it that runs on the event loop."""

    def __init__(self, store: Store, cluster: Cluster, heartbeat_interval: float,
                 clock: Callable[[], float] = time.time, authority: pki.Authority | None = None):
        self.store, self.cluster, self.clock = store, cluster, clock
        self.authority = authority  # the CA that signs node certificates; None: no TLS (--insecure)
        self.node_cert_lifetime = datetime.timedelta(hours=pki.NODE_HOURS)
        self.trust = Trust()
        self.heartbeat_interval = heartbeat_interval
        self.changes = Changes()
        self.outboxes: dict[str, Outbox] = collections.defaultdict(Outbox)
        self.streams: dict[str, asyncio.Task] = {}  # node -> the handler serving its current stream
        self.log_waiters: dict[int, LogWaiter] = {}
        self.log_ids = itertools.count(1)
        self.pending: list[Command] = []
        self.next_write: asyncio.Future | None = None
        self.wake = asyncio.Event()
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self.tasks: list[asyncio.Task] = []
        self.started = self.clock()
        self.logins = Logins()     # the dashboard's one-time links and browser sessions
        self.watchers = Watchers()  # clients following a job (WatchJob): woken after each store write
        self.dashboard_port = 0    # where the dashboard is served; 0: nowhere

    # ---- loading and running -------------------------------------------------------------------

    def load(self, reconnect_grace: float) -> None:
        loaded = self.store.load()
        now = self.clock()
        for job_doc, task_docs, evaluation_docs in loaded.jobs:
            job = job_from_docs(job_doc, task_docs, evaluation_docs)
            job.seen.last_progress = now  # the hang watchdog counts from now: progress was not seen meanwhile
            self.cluster.add_job(job)
        for doc in loaded.nodes:
            node = node_from_doc(doc)
            # Agents retry with backoff while the coordinator is away: they get the reconnect grace on top of the
            # usual timeout before their nodes (and the tasks on them) count as lost.
            node.seen.last_seen = now + reconnect_grace
            self.cluster.add_node(node)
        self.cluster.next_number = max(self.cluster.next_number, loaded.next_job_number)
        self.cluster.cluster_tag = base36(loaded.cluster_tag)
        self.trust = trust_from_docs(loaded.trust)
        self.changes.loaded(self.cluster, self.trust)
        self.cluster.assign_missing_uids()  # after `loaded`: the store writes the UIDs given now
        if loaded.jobs or loaded.nodes:
            log.info("loaded %d jobs and %d nodes from %s", len(loaded.jobs), len(loaded.nodes), self.store.path)

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._write_loop(), name="writer"),
                      asyncio.create_task(self._tick_loop(), name="ticker")]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self._write()  # what changed last is stored too
        self.writer.shutdown(wait=True)
        self.store.close()

    # ---- changes: store them, then send what they decided --------------------------------------

    def apply(self, commands: list[Command] = ()) -> asyncio.Future:
        """Something changed; commands go out once it is stored. The future is done once it is stored."""
        self.pending.extend(commands)
        if self.next_write is None:
            self.next_write = asyncio.get_running_loop().create_future()
        self.wake.set()
        return self.next_write

    async def _write_loop(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            try:
                written = await self._write()
            except Exception:  # a bug here must not stop every later write
                log.exception("writing the state failed")
                written = False
            if not written:
                await asyncio.sleep(WRITE_RETRY_SECONDS)
                self.wake.set()

    async def _write(self) -> bool:
        """Writes what changed, then sends the commands those changes decided. When the write fails (a full
        disk) nothing is sent: the commands wait for a write that succeeds, so no agent acts on a decision
        a restart could forget; a client waiting for the write is told it failed."""
        done, self.next_write = self.next_write, None
        commands, self.pending = self.pending, []
        batch = self.changes.collect(self.cluster, self.trust)
        error = None
        if batch:
            started = time.monotonic()
            try:
                await asyncio.get_running_loop().run_in_executor(self.writer, self.store.write, batch)
            except Exception as e:  # a full disk must not take the coordinator down; the next batch retries
                self.changes.failed(batch, self.cluster)
                error = e
                log.error("cannot write the state to %s: %s", self.store.path, e)
            self.cluster.observer.stored(time.monotonic() - started, ok=error is None)
        if error is None:
            self.send(commands)
            self.watchers.changed()
        else:
            self.pending[:0] = commands[-PENDING_LIMIT:]  # reconcile resends what is dropped here
            del self.pending[PENDING_LIMIT:]
        if done is not None and not done.done():
            done.set_exception(OSError(f"cannot store the change: {error}")) if error else done.set_result(None)
        return error is None

    def send(self, commands: list[Command]) -> None:
        for command in commands:
            if isinstance(command, (ReadLog, CancelLog)):
                log.debug("%s to %s", type(command).__name__, command.node)
            else:
                log.info("%s", command, extra=fields(getattr(command, "attempt", None), command.node,
                                                     job=getattr(command, "job_id", "")))
            self.outboxes[command.node].put(wire.command_to_proto(command))

    async def _tick_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + TICK_SECONDS
            await asyncio.sleep(TICK_SECONDS)
            late = loop.time() - due
            try:
                if late > LATE_FORGIVEN_SECONDS:
                    # The loop was too busy to read heartbeats on time (a reconnect storm, an overload): that
                    # silence is the coordinator's, not the nodes'.
                    self.cluster.forgive_silence(late)
                now = self.clock()
                self.trust.expire(now)
                self.apply(self.cluster.tick(now))
            except Exception:  # a bug in one tick must not stop the next
                log.exception("tick failed")

    # ---- agents --------------------------------------------------------------------------------

    def register(self, request: agent_pb2.RegisterRequest, caller: Identity | None = None) -> str:
        """Raises ValueError (a bad field, ports overlapping another agent's), NameTaken, or PermissionError
        (the caller's certificate is another node's)."""
        info = wire.node_info_from_proto(request.node)
        _acts_for_itself(caller, info.name)
        if len(request.tasks) > wire.MAX_TASKS_PER_NODE:
            raise ValueError(f"tasks: at most {wire.MAX_TASKS_PER_NODE} per node, got {len(request.tasks)}")
        reports = [wire.task_report_from_proto(t) for t in request.tasks]
        session = uuid.uuid4().hex
        commands = self.cluster.register(info, reports, session, self.clock())
        if self.streams.pop(info.name, None) is not None:  # the agent came back: its old stream is over
            self.outboxes[info.name].take_over()
        self.outboxes[info.name].items.clear()  # what was queued for the old session is stale
        self._fail_logs(info.name)
        self.apply(commands)
        log.info("node %s registered: %s, %d GPUs, ports %d-%d, agent %s, %d tasks", info.name, info.address,
                 len(info.gpus), *info.port_range, info.agent_version, len(reports), extra=fields(node=info.name))
        return session

    def open_stream(self, node: str, session: str, caller: Identity | None = None) -> tuple[Outbox, int]:
        _acts_for_itself(caller, node)
        if not self.cluster.alive(node, session, self.clock()):
            raise PermissionError(f"node {node!r} has no current registration for this session; register again")
        old = self.streams.get(node)
        if old is not None and old is not asyncio.current_task():
            self._fail_logs(node)  # the old stream's sender ends it when the outbox is taken over below
        self.streams[node] = asyncio.current_task()
        outbox = self.outboxes[node]
        generation = outbox.take_over()
        self.send(self._revocations([node]))  # its peer port refuses what the cluster refuses
        return outbox, generation

    def close_stream(self, node: str) -> None:
        if self.streams.get(node) is asyncio.current_task():
            del self.streams[node]
            self._fail_logs(node)

    def _fail_logs(self, node: str) -> None:
        """The node's stream ended or was replaced: the logs it was sending will not arrive."""
        for request_id, waiter in list(self.log_waiters.items()):
            if waiter.node == node:
                waiter.fail(request_id, f"node {node} disconnected")

    def on_agent_message(self, node: str, session: str, msg: agent_pb2.AgentMessage) -> bool:
        """Handles one message from a node's stream; False ends the stream (the node must register again)."""
        kind = msg.WhichOneof("kind")
        now = self.clock()
        if kind == "heartbeat":  # the hot path: thousands a second
            progress = wire.progress_from_proto(msg.heartbeat) if msg.heartbeat.progress else []
            commands = self.cluster.heartbeat(node, session, now, progress, wire.condition_from_proto(msg.heartbeat))
            if commands:
                self.apply(commands)
            return commands is not None
        if not self.cluster.alive(node, session, now):
            return False
        if kind == "task":
            self.apply(self.cluster.report(node, wire.task_report_from_proto(msg.task), now))
        elif kind == "sync_done":
            r = wire.sync_result_from_proto(msg.sync_done)
            log.info("%s: checkpoint copy %d %s (%s; %.1f MB in %.2f s)", r.job_id, r.sync_id,
                     "done" if r.ok else "failed", r.message or "ok", r.bytes / 1e6, r.seconds,
                     extra=fields(job=r.job_id, node=node))
            self.apply(self.cluster.sync_done(node, r.job_id, r.sync_id, r.ok, r.message, now))
        elif kind == "evaluation":
            attempt, result = wire.evaluation_from_proto(msg.evaluation)
            self.apply(self.cluster.evaluation(node, attempt, result, now))
        elif kind == "log":
            data = wire.log_data_from_proto(msg.log)
            waiter = self.log_waiters.get(data.request_id)
            if waiter is not None and waiter.node == node and not waiter.put(data):
                self.send([CancelLog(node, data.request_id)])
        return True

    # ---- clients -------------------------------------------------------------------------------

    def open_log(self, job_id: str, task_type: str, task_index: int, attempt: int, follow: bool,
                 tail_lines: int) -> tuple[int, LogWaiter]:
        job = self.cluster.jobs.get(job_id)
        if job is None:
            raise KeyError(f"unknown job {job_id!r}")
        task = job.task(task_type, task_index)
        if task is None:
            raise KeyError(f"job {job_id} has no task {task_type}:{task_index} "
                           f"(tasks: {', '.join(t.key for t in job.tasks[:20])})")
        if not task.node or task.attempt == 0:
            raise LookupError(f"{task.key} of {job_id} has not been launched yet")
        if attempt > task.attempt:
            raise LookupError(f"{task.key} of {job_id} has had {task.attempt} attempts, not {attempt}")
        node = self.cluster.nodes.get(task.node)
        if node is None or node.state == LOST or task.node not in self.streams:
            raise ConnectionError(f"node {task.node} (where {task.key} ran) is not connected")
        request_id = next(self.log_ids)
        waiter = self.log_waiters[request_id] = LogWaiter(task.node)
        self.send([ReadLog(task.node, request_id, Attempt(job_id, task_type, task_index, attempt or task.attempt),
                           follow, tail_lines)])
        return request_id, waiter

    def close_log(self, request_id: int, cancel: bool) -> None:
        waiter = self.log_waiters.pop(request_id, None)
        if waiter is not None and cancel:
            self.send([CancelLog(waiter.node, request_id)])

    # ---- members of the cluster ----------------------------------------------------------------

    def join(self, token: str, node: str, csr: bytes, seen_from: str = "") -> bytes:
        """A node's first certificate for a join token; raises TokenRefused or PkiError. seen_from: the address
        its connection came from, the one address its certificate may name."""
        if self.authority is None:
            raise PkiError("this coordinator runs without TLS (--insecure): there is nothing to join")
        record = self.trust.tokens.get(token.partition(".")[0])
        replaces = record is not None and record.replace
        cert = self.trust.join(token, node, csr, self.authority, self.clock(), self.node_cert_lifetime,
                               [seen_from] if seen_from else [], registered=getattr(self.cluster.nodes.get(node),
                                                                                    "state", ""))
        if replaces:  # the old holder's stream ends now; its certificate is refused from now on, everywhere
            self.outboxes.pop(node, Outbox()).end(StreamEnded(grpc.StatusCode.PERMISSION_DENIED,
                                                              f"node {node} {REPLACED}"))
        self.apply(self._revocations() if replaces else [])
        log.info("node %s joined the cluster%s", node, " as its name's new holder" if replaces else "",
                 extra=fields(node=node))
        return cert

    def renew(self, caller: Identity, csr: bytes, seen_from: str = "") -> bytes:
        if self.authority is None or caller is None:
            raise PkiError("this coordinator runs without TLS (--insecure): there is nothing to renew")
        cert = self.trust.issue(self.authority, csr, caller.name, self.clock(), self.node_cert_lifetime,
                                [seen_from] if seen_from else [])
        self.apply()
        return cert

    def create_token(self, ttl: float, node: str, reusable: bool,
                     replace: bool = False) -> tuple[str, float, asyncio.Future]:
        token, record = self.trust.create_token(self.clock(), ttl, node, reusable, replace)
        log.info("join token %s created (expires in %.0f s%s%s%s)", record.id, record.expires - self.clock(),
                 f", for node {node}" if node else "", ", reusable" if reusable else "",
                 ", replaces the node's current holder" if replace else "")
        return token, record.expires, self.apply()

    def remove_node(self, name: str) -> tuple[int, asyncio.Future]:
        """The node leaves the cluster; its certificates are refused from now on, here and at every peer port. A
        name that holds a certificate but never registered can be removed too. Raises KeyError."""
        now = self.clock()
        if name not in self.cluster.nodes and not self.trust.knows(name):
            raise KeyError(name)
        lost = sum(1 for job in self.cluster.live.values() for t in job.tasks if t.node == name and t.live)
        commands = self.cluster.remove_node(name, now) if name in self.cluster.nodes else []
        self.trust.revoke(name, now)
        # Its stream ends with the reason (a cancelled handler would leave the agent's call open, unanswered).
        self.outboxes.pop(name, Outbox()).end(StreamEnded(grpc.StatusCode.PERMISSION_DENIED, f"node {name} {REMOVED}"))
        log.info("node %s removed from the cluster (%d tasks lost)", name, lost, extra=fields(node=name))
        return lost, self.apply(commands + self._revocations())

    def _revocations(self, nodes=None) -> list[Command]:
        """The revoked node certificates, for the agents' peer ports: every connected node, or those given."""
        revoked = self.trust.revoked()
        return [Revocations(node, revoked) for node in (self.streams if nodes is None else nodes)] if revoked else []

    def ended_jobs(self, job_ids: list[str]) -> list[str]:
        """Those of the jobs that are over: ended, or made here and since removed (by retention), so nothing
        will ever run them again and their files on a node may go. An id this coordinator never made (another
        cluster's, or one from a state dir restored from an older backup) is not known to be over: kept."""
        def over(job_id: str) -> bool:
            if job_id in self.cluster.jobs:
                return self.cluster.jobs[job_id].ended
            _, number, tag = (["", ""] + job_id.rsplit("-", 2))[-3:]
            return bool(tag) and tag == self.cluster.cluster_tag and number.isdigit() and \
                int(number) < self.cluster.next_number
        return [job_id for job_id in job_ids if over(job_id)]

    def running_tasks(self) -> dict[str, int]:
        running: dict[str, int] = collections.Counter()
        for job in self.cluster.live.values():
            for task in job.tasks:
                if task.live:
                    running[task.node] += 1
        return running


def _acts_for_itself(caller: Identity | None, node: str) -> None:
    """A node's certificate speaks for that node only (no certificate: no TLS, nothing to check)."""
    if caller is not None and caller.name != node:
        raise PermissionError(f"node {caller.name!r} may not act for node {node!r}")


def base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while number:
        number, digit = divmod(number, 36)
        text = digits[digit] + text
    return text


def build(state_dir: Path, lost_after_seconds: float, heartbeat_interval_seconds: float,
          keep_finished_jobs: int, keep_finished_seconds: float, authority: pki.Authority | None = None,
          reconnect_grace_seconds: float = RECONNECT_GRACE_SECONDS,
          task_uids: UidRange = UidRange()) -> Coordinator:
    cluster = Cluster(lost_after_seconds, resend_after_seconds=max(3 * heartbeat_interval_seconds, 1.0),
                      keep_finished_jobs=keep_finished_jobs, keep_finished_seconds=keep_finished_seconds,
                      task_uids=task_uids)
    coordinator = Coordinator(SqliteStore(Path(state_dir)), cluster, heartbeat_interval_seconds,
                              authority=authority)
    coordinator.load(reconnect_grace_seconds)
    return coordinator

