"""The coordinator process: one asyncio event loop owns the cluster model, the store and the agents' streams.

Every event runs to completion on the loop (the model never awaits), so nothing needs a lock. What an event
changes is stored before the commands it decided are sent (persistence.py).
"""

from __future__ import annotations

import dataclasses

import asyncio
import collections
import datetime
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tfcluster import layout
from tfcluster import pki, wire
from tfcluster.api.v1 import agent_pb2
from tfcluster.codechunks import CodeError, hex_of
from tfcluster.commands import CancelLog, Command, Probe, ReadLog, SetPace
from tfcluster.daemon.coordinator.core.access.logins import Logins
from tfcluster.daemon.coordinator.core.access.trust import Trust
from tfcluster.daemon.coordinator.core.cluster import Cluster
from tfcluster.daemon.coordinator.core.model.node_table import STARTUP_GRACE_SECONDS
from tfcluster.daemon.coordinator.core.model.task_uids import UidRange
from tfcluster.daemon.coordinator.core.model.usage_history import UsageHistory
from tfcluster.daemon.coordinator.rpc.code_service import sweep_code, sweep_summaries
from tfcluster.daemon.coordinator.rpc.membership import Membership
from tfcluster.daemon.coordinator.rpc.outbox import LogWaiter, Outbox, tell_all
from tfcluster.daemon.coordinator.rpc.probes import Probes
from tfcluster.daemon.coordinator.rpc.watchers import Watchers
from tfcluster.daemon.coordinator.store.api import Store
from tfcluster.daemon.coordinator.store.code_archives import DEFAULT_MAX_BYTES as DEFAULT_MAX_CODE_BYTES
from tfcluster.daemon.coordinator.store.code_archives import DEFAULT_STORE_BYTES as DEFAULT_CODE_STORE_BYTES
from tfcluster.daemon.coordinator.store.code_archives import CodeStore
from tfcluster.daemon.coordinator.store.open import open_store
from tfcluster.daemon.coordinator.store.persistence import Persistence
from tfcluster.daemon.coordinator.store.summaries import SummaryError, SummaryStore
from tfcluster.daemon.logformat import fields
from tfcluster.model import Attempt
from tfcluster.pki import Identity
from tfcluster.states import NodeState

if TYPE_CHECKING:
    from tfcluster.daemon.coordinator.store.etcd_gateway import EtcdTls

log = logging.getLogger("tfcluster.coordinator")

TICK_SECONDS = 0.2
LATE_FORGIVEN_SECONDS = 0.1  # a tick this much later than due means heartbeats waited unread as long
RECONNECT_GRACE_SECONDS = 10.0


class Coordinator(Membership):
    """The model and everything around it that runs on the event loop; joining, renewing, removing and draining
    nodes are rpc/membership.py."""

    def __init__(self, store: Store, cluster: Cluster, clock: Callable[[], float] = time.time, authority: pki.Authority | None = None,
                 code: CodeStore | None = None, summaries: SummaryStore | None = None):
        self.cluster, self.clock = cluster, clock
        self.code = code  # the jobs' code archives; None: none kept (a job that names one is refused)
        self.summaries = summaries  # the jobs' TensorBoard event files; None: none kept
        self.authority = authority  # the CA that signs node certificates; None: no TLS (--insecure)
        self.node_cert_lifetime = datetime.timedelta(hours=pki.NODE_HOURS)
        self.persistence = Persistence(store, cluster, self._stored)
        self.store = store
        self.apply = self.persistence.apply  # something changed: the commands go out once it is stored
        cluster.schedule_per_batch = True  # one scheduling pass per write, for every event the write carries
        self.persistence.before_write = lambda: cluster.schedule(self.clock())
        self.outboxes: dict[str, Outbox] = collections.defaultdict(Outbox)
        self.streams: dict[str, asyncio.Task] = {}  # node -> the handler serving its current stream
        self.log_waiters: dict[int, LogWaiter] = {}
        self.log_ids = itertools.count(1)
        self.tasks: list[asyncio.Task] = []
        self.telling_pace: asyncio.Task | None = None  # a new heartbeat interval on its way to every agent
        self.started = self.clock()
        self.logins = Logins()     # the dashboard's one-time links and browser sessions
        self.watchers = Watchers()  # clients following a job (WatchJob): woken after each store write
        self.probes = Probes()      # `tfcluster doctor`'s questions to the agents, waiting for their answers
        self.usage = UsageHistory()  # each running task's CPU and memory over time, for the dashboard
        self.dashboard_port = 0    # where the dashboard is served; 0: nowhere
        self.leader_address = ""   # where clients reach this coordinator while it leads (status says it)
        # Whether this coordinator may still act: with several coordinators, only while it holds the leadership
        # (leadership.py); a command decided before it lost it is dropped, never sent.
        self.acting: Callable[[], bool] = lambda: True

    @property
    def trust(self) -> Trust:
        return self.persistence.trust

    # ---- loading and running -------------------------------------------------------------------

    def load(self, reconnect_grace: float) -> None:
        self.persistence.load(self.clock(), reconnect_grace)

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self.persistence.run(), name="writer"),
                      asyncio.create_task(self._tick_loop(), name="ticker")]
        if self.code is not None:
            self.tasks.append(asyncio.create_task(sweep_code(self), name="code sweeper"))
        if self.summaries is not None:
            self.tasks.append(asyncio.create_task(sweep_summaries(self), name="summaries sweeper"))

    async def close(self) -> None:
        background = [*self.tasks[1:], *([self.telling_pace] if self.telling_pace else [])]
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await self.persistence.close(self.tasks[0] if self.tasks else None)

    # ---- sending what the stored changes decided -----------------------------------------------

    def _stored(self, commands: list[Command]) -> None:
        """A write succeeded: the commands it decided go out, and clients following a job see its new state."""
        self.send(commands)
        self.watchers.changed()

    def send(self, commands: list[Command]) -> None:
        if commands and not self.acting():
            log.warning("%d commands not sent: this coordinator no longer leads", len(commands))
            return
        for command in commands:
            if isinstance(command, (ReadLog, CancelLog, SetPace, Probe)):  # routine, and to every node at once
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
                    self.cluster.nodes.forgive_silence(late)
                now = self.clock()
                self.trust.expire(now)
                self.apply(self.cluster.tick(now))
                self._tell_pace()
            except Exception:  # a bug in one tick must not stop the next
                log.exception("tick failed")

    def _tell_pace(self) -> None:
        """The cluster grew past the heartbeat bound: the agents registered meanwhile are told the longer interval
        (nodes.Pace). Nothing to store: an agent registering again is given it anyway."""
        interval = self.cluster.nodes.pace.to_tell()
        if interval is not None:
            if self.telling_pace is not None:
                self.telling_pace.cancel()  # the longer interval supersedes one not yet told to every agent
            self.telling_pace = asyncio.create_task(tell_all(self.send, list(self.streams),
                                                             lambda node: SetPace(node, interval),
                                                             self.streams.__contains__))

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
        commands = self.cluster.register(info, reports, session, self.clock(), wire.health_from_proto(request),
                                         wire.conditions_from_proto(request))
        if self.streams.pop(info.name, None) is not None:  # the agent came back: its old stream is over
            self.outboxes[info.name].take_over()
        self.outboxes[info.name].items.clear()  # what was queued for the old session is stale
        if caller is not None:  # doctor warns of a certificate its agent did not renew in time
            self._certificate_seen(info.name, caller.issued, caller.expires)
        self._fail_logs(info.name)
        self.apply(commands)
        log.info("node %s registered: %s, %d GPUs, ports %d-%d, agent %s, %d tasks", info.name, info.address,
                 len(info.gpus), *info.port_range, info.agent_version, len(reports), extra=fields(node=info.name))
        return session

    def open_stream(self, node: str, session: str, caller: Identity | None = None) -> tuple[Outbox, int]:
        _acts_for_itself(caller, node)
        if not self.cluster.nodes.alive(node, session, self.clock()):
            raise PermissionError(f"node {node!r} has no current registration for this session; register again")
        old = self.streams.get(node)
        if old is not None and old is not asyncio.current_task():
            self._fail_logs(node)  # the old stream's sender ends it when the outbox is taken over below
        self.streams[node] = asyncio.current_task()
        outbox = self.outboxes[node]
        generation = outbox.take_over()
        self.send(self._revocations([node]))  # its peer port refuses what the cluster refuses
        pace = self.cluster.nodes.pace
        if pace.interval != pace.base_interval:
            # Its registration may have been answered before the latest stretch, and the agents were told it
            # (_tell_pace) before this stream opened: it is told now, twice at worst.
            self.send([SetPace(node, pace.interval)])
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
            beat = msg.heartbeat
            commands = self.cluster.heartbeat(node, session, now, progress, wire.condition_from_proto(beat),
                                              wire.health_from_proto(beat),
                                              wire.conditions_from_proto(beat) if beat.conditions else ())
            if commands:
                self.apply(commands)
            if progress and commands is not None:
                self.usage.heartbeat(node, progress, now)
            return commands is not None
        if not self.cluster.nodes.alive(node, session, now):
            return False
        if kind == "task":
            self.apply(self.cluster.report(node, wire.task_report_from_proto(msg.task), now))
        elif kind == "sync_done":
            r = wire.sync_result_from_proto(msg.sync_done)
            log.info("%s: checkpoint copy %d %s (%s; %.1f MB in %.2f s)", r.job_id, r.sync_id,
                     "done" if r.ok else "failed", r.message or "ok", r.bytes / 1e6, r.seconds,
                     extra=fields(job=r.job_id, node=node))
            self.apply(self.cluster.sync_done(node, r.job_id, r.sync_id, r.ok, r.message, now))
        elif kind == "leaving":
            self.cluster.leaving(node)
        elif kind == "probe_answer":
            self.probes.answer(node, wire.probe_answer_from_proto(msg.probe_answer), now)
        elif kind == "evaluation":
            attempt, result = wire.evaluation_from_proto(msg.evaluation)
            self.apply(self.cluster.evaluation(node, attempt, result, now))
        elif kind == "summary":
            self._keep_summary(node, wire.summary_from_proto(msg.summary))
        elif kind == "log":
            data = wire.log_data_from_proto(msg.log)
            waiter = self.log_waiters.get(data.request_id)
            if waiter is not None and waiter.node == node and not waiter.put(data):
                self.send([CancelLog(node, data.request_id)])
        return True

    def _keep_summary(self, node: str, chunk) -> None:
        """Event file bytes of a task that ran on the node sending them; any other is dropped."""
        job = self.cluster.jobs.get(chunk.job_id)
        task = job.task(chunk.task_type, chunk.task_index) if job else None
        if self.summaries is None or task is None or task.node != node:
            return
        try:
            self.summaries.write(chunk)
        except (SummaryError, OSError) as e:
            log.debug("summary bytes of %s from %s not kept: %s", chunk.key, node, e, extra=fields(job=chunk.job_id))

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
        self._connected(task.node, f"(where {task.key} ran)")
        return self._read_log(ReadLog(task.node, 0, Attempt(job_id, task_type, task_index, attempt or task.attempt),
                                      follow, tail_lines))

    def open_environment_log(self, job_id: str, node: str, follow: bool, tail_lines: int) -> tuple[int, LogWaiter]:
        """The build log of the job's environment on one of its nodes."""
        job = self.cluster.jobs.get(job_id)
        if job is None:
            raise KeyError(f"unknown job {job_id!r}")
        if not any(t.node == node for t in job.tasks):
            used = sorted({t.node for t in job.tasks if t.node})
            raise KeyError(f"job {job_id} has no task on node {node!r} (its nodes: {', '.join(used) or 'none yet'})")
        self._connected(node, "")
        return self._read_log(ReadLog(node, 0, Attempt(job_id, "", 0, 0), follow, tail_lines, environment=True))

    def _connected(self, name: str, where: str) -> None:
        node = self.cluster.nodes.get(name)
        if node is None or node.state == NodeState.LOST or name not in self.streams:
            raise ConnectionError(" ".join(filter(None, (f"node {name}", where, "is not connected"))))

    def _read_log(self, request: ReadLog) -> tuple[int, LogWaiter]:
        request_id = next(self.log_ids)
        waiter = self.log_waiters[request_id] = LogWaiter(request.node)
        self.send([dataclasses.replace(request, request_id=request_id)])
        return request_id, waiter

    def close_log(self, request_id: int, cancel: bool) -> None:
        waiter = self.log_waiters.pop(request_id, None)
        if waiter is not None and cancel:
            self.send([CancelLog(waiter.node, request_id)])

    def ended_jobs(self, job_ids: list[str]) -> list[str]:
        """Those of the jobs that are over: ended, or made here and since removed (by retention), so nothing
        will ever run them again and their files on a node may go. An id this coordinator never made (another
        cluster's, or one from a state dir restored from an older backup) is not known to be over: kept."""
        def over(job_id: str) -> bool:
            if job_id in self.cluster.jobs:
                return self.cluster.jobs[job_id].ended
            _, number, tag = (["", ""] + job_id.rsplit("-", 2))[-3:]
            return bool(tag) and tag == self.cluster.jobs.cluster_tag and number.isdigit() and \
                int(number) < self.cluster.jobs.next_number
        return [job_id for job_id in job_ids if over(job_id)]

    def code_archive(self, sha256: str, job_id: str, caller: Identity | None) -> Path:
        """The stored archive a node asks for: the code of a job that names it and has a task placed on that
        node (no certificate: no TLS, any caller). Raises CodeError, in the same words for an archive that is
        not here and for one the node may not have, so that asking tells nothing of what is stored."""
        hex_digest = hex_of(sha256)
        job = self.cluster.jobs[job_id] if job_id in self.cluster.jobs else None
        allowed = job is not None and job.spec.code_sha256 == f"sha256:{hex_digest}" and \
            (caller is None or any(task.node == caller.name and task.live for task in job.tasks))
        path = self.code.path(f"sha256:{hex_digest}") if allowed and self.code is not None else None
        if path is None or not path.is_file():
            raise CodeError(f"the coordinator holds no code sha256:{hex_digest[:12]}... for this node's tasks of "
                            f"job {job_id[:100]!r} (`tfcluster start` uploads it)")
        return path

    def memory_allocated(self) -> dict[str, int]:
        """Node -> what the memory limits of the tasks placed there add up to."""
        return dict(self.cluster.held.memory())

    def running_tasks(self) -> dict[str, int]:
        running: dict[str, int] = collections.Counter()
        for job in self.cluster.jobs.live.values():
            for task in job.tasks:
                if task.live:
                    running[task.node] += 1
        return running


def _acts_for_itself(caller: Identity | None, node: str) -> None:
    """A node's certificate speaks for that node only (no certificate: no TLS, nothing to check)."""
    if caller is not None and caller.name != node:
        raise PermissionError(f"node {caller.name!r} may not act for node {node!r}")


def build(state_dir: Path, lost_after_seconds: float, heartbeat_interval_seconds: float,
          keep_finished_jobs: int, keep_finished_seconds: float, authority: pki.Authority | None = None,
          max_heartbeats_per_second: float = 0.0,
          reconnect_grace_seconds: float = RECONNECT_GRACE_SECONDS,
          task_uids: UidRange = UidRange(), store_url: str = "", etcd_tls: EtcdTls | None = None,
          max_code_bytes: int = DEFAULT_MAX_CODE_BYTES, code_store_bytes: int = DEFAULT_CODE_STORE_BYTES,
          store: Store | None = None, max_code_unpacked_bytes: int | None = None) -> Coordinator:
    """A coordinator with its state loaded from the store given, else from the one --store names (store/api.py; "":
    under the state dir), and its jobs' code archives under the state dir (max_code_unpacked_bytes None: 16
    times max_code_bytes)."""
    cluster = Cluster(lost_after_seconds, resend_after_seconds=max(3 * heartbeat_interval_seconds, 1.0),
                      keep_finished_jobs=keep_finished_jobs, keep_finished_seconds=keep_finished_seconds,
                      task_uids=task_uids, heartbeat_interval_seconds=heartbeat_interval_seconds,
                      max_heartbeats_per_second=max_heartbeats_per_second,
                      startup_grace_seconds=STARTUP_GRACE_SECONDS)
    store = store if store is not None else open_store(store_url, Path(state_dir), etcd_tls)
    code = CodeStore(layout.code_cache_dir(state_dir), max_code_bytes, store_bytes=code_store_bytes,
                     max_unpacked_bytes=max_code_unpacked_bytes)
    coordinator = Coordinator(store, cluster, authority=authority, code=code,
                              summaries=SummaryStore(Path(state_dir) / layout.SUMMARIES_NAME))
    coordinator.load(reconnect_grace_seconds)
    return coordinator

