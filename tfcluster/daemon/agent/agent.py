"""The agent process: registers its node, keeps one stream to the coordinator (heartbeats and reports up;
launch, stop, shipping and log commands down), and reconnects with backoff and jitter when the coordinator
is away, without touching running tasks.

Nothing that must arrive is lost across reconnects: the registration carries every task's state (exits
included), every task's evaluations are sent again after it (the coordinator keeps one per checkpoint), and
the answers of checkpoint copies are kept and sent again until the coordinator stops asking. A coordinator
that refuses the agent (bad settings, its name held by another live agent, a wrong token) ends it: retrying
would not help.
"""

from __future__ import annotations

import functools
import json
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from tfcluster import __version__, wire
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.daemon.agent.discovery import HostInfo
from tfcluster.daemon.agent.logs import LogServer
from tfcluster.daemon.agent.metrics import AgentMetrics
from tfcluster.daemon.agent.identity import NodeIdentity
from tfcluster.daemon.agent.liveness import STAMP_EVERY_SECONDS, Liveness
from tfcluster.daemon.agent.peers import DEFAULT_QUOTA_BYTES, Expectation, PeerServer, PeerServicer, RevokedNodes
from tfcluster.daemon.agent.retention import Policy, RetentionPass, ask_coordinator, disk_condition, free_bytes
from tfcluster.daemon.agent.shipping import ShipError, Shipper, job_checkpoint_dir, peers, sync_dir
from tfcluster.daemon.agent.summaries import EvaluatorSummaries
from tfcluster.daemon.agent.supervisor import Supervisor, TaskRecord
from tfcluster.daemon.agent.tasklog import DEFAULT_LIMIT_BYTES
from tfcluster.daemon.agent.taskuser import TaskUsers, make_state_dir
from tfcluster.daemon.logformat import fields
from tfcluster.model import (CancelLog, Evaluation, ExpectFiles, FinishTraining, Gpu, Launch, NodeInfo, ReadLog,
                             Revocations, ShipCheckpoints, Stop, SyncCheckpoints, SyncResult)
from tfcluster.daemon.web import ThreadedWebListener, WebListener
from tfcluster.layout import INCOMING_PREFIX
from tfcluster.security import REMOVED, REPLACED, Credentials
from tfcluster.states import Phase

log = logging.getLogger("tfcluster.agent")

EVENTS_POLL_SECONDS = 0.2
BACKOFF_START_SECONDS = 0.5
# Short enough that agents are back well inside a restarted coordinator's reconnect grace.
BACKOFF_MAX_SECONDS = 2.0
REGISTER_TIMEOUT_SECONDS = 10.0
# Another agent holds this node's name: wait this long for it to turn out to be this node's own old
# registration (it expires), then give up.
NAME_CONFLICT_PATIENCE_SECONDS = 20.0
SYNC_RESULTS_KEPT = 100
LOG_BACKLOG_MESSAGES = 16  # log chunks of 64 KiB queued for the stream at most
LOG_BACKLOG_WAIT_SECONDS = 0.01
REFUSALS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


class Refused(Exception):
    """The coordinator will not take this agent; retrying does not change that."""


@dataclass(frozen=True)
class AgentConfig:
    coordinator: str
    name: str
    address: str
    port_range: tuple[int, int]
    gpus: tuple[Gpu, ...]
    host: HostInfo
    state_dir: Path
    peer_port: int = 0  # AgentPeerService (checkpoints from other agents); 0: none
    credentials: Credentials = field(default_factory=Credentials)  # the node's certificate; none: --insecure
    identity: NodeIdentity | None = None  # where the certificate lives, to renew it
    peer_quota_bytes: int = DEFAULT_QUOTA_BYTES  # checkpoint bytes other agents may send for one job
    retention: Policy = field(default_factory=Policy)  # what the node keeps of its jobs' files; its disk floor
    task_log_bytes: int = DEFAULT_LIMIT_BYTES  # output kept per task attempt (its head and its newest bytes)
    http_listen: str = ""  # HOST:PORT of /metrics; "": none
    allow_root_tasks: bool = False  # the operator lets tasks run as root here (taskuser.py)
    private_tmp: bool = False  # each job's tasks get a /tmp of their own (isolation.py)

    def node_info(self) -> NodeInfo:
        return NodeInfo(name=self.name, address=self.address, port_range=self.port_range, gpus=self.gpus,
                        hostname=self.host.hostname, cpu_count=self.host.cpu_count,
                        memory_bytes=self.host.memory_bytes, agent_version=__version__,
                        state_dir=str(self.state_dir), peer_port=self.peer_port)


class Agent:
    def __init__(self, config: AgentConfig):
        self.config = config
        self.outbound: queue.Queue = queue.Queue()
        self.task_users = TaskUsers(config.allow_root_tasks, private_tmp=config.private_tmp)
        make_state_dir(config.state_dir)  # its modes set right, whoever made it
        self.supervisor = Supervisor(config.state_dir, self._on_task_change, self.condition, config.task_log_bytes,
                                     self.task_users)
        self.logs = LogServer(self.supervisor, self._send_log)
        self._stop = threading.Event()
        self._call = None
        self.connected = threading.Event()
        self.registered = threading.Event()  # set at the first registration, for systemd's READY=1
        self.trouble = ""  # why the last try to reach the coordinator failed, until one succeeds
        self.liveness = Liveness(("connection", "events"))  # see liveness.py
        self.event_offsets: dict[tuple, int] = {}  # how far each attempt's events file has been sent
        self.events_lock = threading.Lock()
        self.summaries = EvaluatorSummaries()  # results of evaluators that only write TensorBoard summaries
        self.shippers: dict[tuple, Shipper] = {}
        self.sync_results: dict[tuple[str, int], SyncResult] = {}  # kept until the coordinator stops asking
        self.syncs_running: set[tuple[str, int]] = set()
        self.sync_lock = threading.Lock()
        self.peer_server: PeerServer | None = None
        self.refused = ""  # why the coordinator refused this agent, once it has
        self._renewed = threading.Event()  # the stream was ended to reconnect with a renewed certificate
        self.credentials = config.credentials  # replaced when the certificate is renewed
        # Jobs whose checkpoint files the peer port accepts, from the sender the coordinator named (a restarted
        # agent is told again when it registers); certificates it refuses.
        self.expected: dict[str, Expectation] = {}
        self.revoked = RevokedNodes()
        self.metrics = AgentMetrics(self.supervisor, config.gpus, str(config.state_dir))
        self.web: ThreadedWebListener | None = None

    # ---- lifecycle -----------------------------------------------------------------------------

    def run(self) -> None:
        """Registers and serves the stream until stop() or a refusal; reconnects with backoff on any failure."""
        adopted = self.supervisor.adopt_running()
        if adopted:
            log.info("reattached to %d running tasks", adopted)
        retention = RetentionPass(self.config.state_dir, self.config.retention, self._jobs_in_use,
                                  functools.partial(ask_coordinator, self.config.coordinator, lambda: self.credentials))
        threading.Thread(target=retention.run, args=(self._stop,), name="retention", daemon=True).start()
        threading.Thread(target=self._forward_events, name="events", daemon=True).start()
        if self.config.identity is not None:
            threading.Thread(target=self._renew_certificate, name="renew", daemon=True).start()
        if self.config.peer_port and self.peer_server is None:
            self.serve_peers()
        backoff, conflict_since = BACKOFF_START_SECONDS, 0.0
        # The transport's own reconnect backoff would otherwise grow to two minutes during a long coordinator
        # outage, and the agent would come back after its node had been declared lost.
        options = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
                   ("grpc.initial_reconnect_backoff_ms", int(BACKOFF_START_SECONDS * 1000)),
                   ("grpc.max_reconnect_backoff_ms", int(BACKOFF_MAX_SECONDS * 1000))]
        while not self._stop.is_set():
            self.liveness.stamp("connection")
            with self.credentials.channel(self.config.coordinator, options) as channel:  # the current certificate
                try:
                    self._session(agent_pb2_grpc.AgentServiceStub(channel))
                    backoff, conflict_since = BACKOFF_START_SECONDS, 0.0
                except grpc.RpcError as e:
                    if self._stop.is_set():
                        break
                    code = e.code() if hasattr(e, "code") else None
                    if code == grpc.StatusCode.CANCELLED and self._renewed.is_set():
                        self._renewed.clear()  # not a failure: the stream ended to start again with the new
                        backoff = BACKOFF_START_SECONDS  # certificate, at once (the node must not go LOST)
                        continue
                    if code == grpc.StatusCode.ALREADY_EXISTS:
                        conflict_since = conflict_since or time.monotonic()
                    if code in REFUSALS or (conflict_since and
                                            time.monotonic() - conflict_since > NAME_CONFLICT_PATIENCE_SECONDS):
                        self.refused = e.details() or code.name
                        log.error("the coordinator refused this agent: %s", self.refused)
                        # A removed or replaced node's tasks run on elsewhere; nobody will ever stop these.
                        self.stop(stop_tasks=REMOVED in self.refused or REPLACED in self.refused)
                        break
                    why = e.details() if code == grpc.StatusCode.ALREADY_EXISTS else \
                        f"unreachable ({code.name if code else e})"
                    log.warning("coordinator %s: %s; retrying in %.1f s", self.config.coordinator, why, backoff)
                    self.trouble = f"coordinator {self.config.coordinator}: {why}"
                finally:
                    self.connected.clear()
                if self._stop.wait(backoff * random.uniform(0.5, 1.5)):
                    break
                backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)

    def serve_peers(self) -> None:
        """Starts receiving checkpoints from other agents (raises OSError when the port is taken)."""
        servicer = PeerServicer(self.config.state_dir, self.expected.get, self.config.peer_quota_bytes,
                                is_revoked=self.revoked.refusal)
        self.peer_server = PeerServer(f"{self.config.address}:{self.config.peer_port}", servicer,
                                      lambda: self.credentials)
        self.peer_server.start()

    def serve_http(self) -> None:
        """Starts serving /metrics on --http-listen (raises OSError when the address cannot be served)."""
        if self.config.http_listen and self.web is None:
            listener = WebListener(self.config.http_listen, self.credentials, self.metrics.registry)
            self.web = ThreadedWebListener(listener).start()

    def _renew_certificate(self) -> None:
        """Renews the node's certificate at about two thirds of its life, then reconnects with the new one."""
        identity = self.config.identity
        while not self._stop.wait(max(0.0, identity.renew_at() - time.time())):
            try:
                with self.credentials.channel(self.config.coordinator) as channel:
                    self.credentials = identity.renew(channel)
                if self.web is not None:
                    self.web.renew(self.credentials)
            except grpc.RpcError as e:
                left = identity.expires_at() - time.time()
                log.warning("renewing the certificate failed (%s); it expires in %.0f s; retrying",
                            e.details() or e.code().name, left)
                if self._stop.wait(min(60.0, max(1.0, left / 10))):
                    return
                continue
            call = self._call
            if call is not None:
                self._renewed.set()
                call.cancel()  # the session starts again with the new certificate

    def stop(self, stop_tasks: bool = False, grace_seconds: float = 10.0) -> None:
        self._stop.set()
        self.logs.stopped.set()
        if self.peer_server is not None:
            self.peer_server.stop(1)
        if self.web is not None:
            self.web.stop()
        if self._call is not None:
            self._call.cancel()
        if stop_tasks:
            self.supervisor.stop_all(grace_seconds)

    def _session(self, stub: agent_pb2_grpc.AgentServiceStub) -> None:
        # What was queued for the old stream is covered by the registration and what follows it.
        while not self.outbound.empty():
            self.outbound.get_nowait()
        snapshot = [wire.task_report_to_proto(r.report()) for r in self.supervisor.snapshot()
                    if r.phase != Phase.STARTING]
        reply = stub.Register(agent_pb2.RegisterRequest(node=wire.node_info_to_proto(self.config.node_info()),
                                                        tasks=snapshot), timeout=REGISTER_TIMEOUT_SECONDS)
        with self.events_lock:
            self.event_offsets.clear()  # every evaluation again: a restarted coordinator gets them all
            self.summaries.read_again()
        with self.sync_lock:
            for result in self.sync_results.values():
                self.outbound.put(wire.sync_result_to_proto(result))
        interval = reply.heartbeat_interval_seconds or 1.0
        log.info("registered with %s as %s (%s)", self.config.coordinator, self.config.name, self.config.address)
        self.trouble = ""
        self.registered.set()

        def messages():
            yield agent_pb2.AgentMessage(open=agent_pb2.StreamOpen(node_name=self.config.name,
                                                                   session_id=reply.session_id))
            yield wire.heartbeat_to_proto(reply.session_id, self.supervisor.progress(), self.condition())
            next_beat = time.monotonic() + interval
            while not self._stop.is_set():
                self.liveness.stamp("connection")
                wait = min(STAMP_EVERY_SECONDS, max(0.0, next_beat - time.monotonic()))
                try:
                    item = self.outbound.get(timeout=wait)
                except queue.Empty:
                    item = None
                if item is _END:
                    return
                if item is not None:
                    yield item
                if time.monotonic() >= next_beat:
                    yield wire.heartbeat_to_proto(reply.session_id, self.supervisor.progress(), self.condition())
                    next_beat = time.monotonic() + interval

        self._call = stub.Connect(messages())
        self.connected.set()
        try:
            for message in self._call:
                self._handle(message)
        finally:
            self.outbound.put(_END)
            self._call = None

    def condition(self) -> str:
        """Why this node takes no new tasks now ("" while it takes them): its free disk is below the floor."""
        state_dir = self.config.state_dir
        return disk_condition(state_dir, free_bytes(state_dir), self.config.retention.min_free_bytes)

    # ---- up: reports, evaluations, logs --------------------------------------------------------

    def _on_task_change(self, record: TaskRecord) -> None:
        if record.exited.is_set():
            # What the task reported last (its final evaluation) must reach the coordinator before its exit.
            try:
                self._send_events(record)
            except Exception:  # its exit is reported whatever happened to its results
                log.exception("%s: reading its results failed", record.name)
        self.outbound.put(agent_pb2.AgentMessage(task=wire.task_report_to_proto(record.report())))

    def _jobs_in_use(self) -> set[str]:
        """Jobs whose files retention must leave alone: a task runs, or checkpoints are being copied (from here,
        or to here for a restart)."""
        with self.sync_lock:
            copying = {job_id for job_id, _ in self.syncs_running}
        receiving = {path.parent.name for path in self.config.state_dir.glob(f"jobs/*/{INCOMING_PREFIX}*")}
        return self.supervisor.running_jobs() | copying | receiving

    def _forward_events(self) -> None:
        """Sends what tasks append to their events files (evaluation results) to the coordinator."""
        while not self._stop.wait(EVENTS_POLL_SECONDS):
            self.liveness.stamp("events")
            if self.connected.is_set():
                for record in self.supervisor.snapshot():
                    try:
                        self._send_events(record)
                    except Exception:  # one task's unreadable results must not stop every other task's
                        log.exception("%s: reading its results failed", record.name)

    def _send_events(self, record: TaskRecord) -> None:
        key = record.attempt
        with self.events_lock:
            try:
                with open(record.events_path, "rb") as f:
                    f.seek(self.event_offsets.get(key, 0))
                    data = f.read()
            except OSError:
                data = b""  # nothing reported (yet): there may be summaries
            complete = data[:data.rfind(b"\n") + 1]
            if complete:
                self.event_offsets[key] = self.event_offsets.get(key, 0) + len(complete)
            for line in complete.splitlines():
                self._send_event(record, line)
            for result in self.summaries.poll(record):
                self.outbound.put(wire.evaluation_to_proto(record.attempt, result))

    def _send_event(self, record: TaskRecord, line: bytes) -> None:
        try:
            event = json.loads(line)
            if event.get("kind") != "evaluation":
                return
            result = Evaluation(checkpoint=str(event["checkpoint"]), step=int(event["step"]), time=float(event["time"]),
                                metrics={str(k): float(v) for k, v in event["metrics"].items()})
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("%s: ignoring a malformed event line: %r", record.name, line[:200],
                        extra=fields(record.attempt))
            return
        self.summaries.reports_itself(record.attempt)
        self.outbound.put(wire.evaluation_to_proto(record.attempt, result))

    def _send_log(self, data) -> None:
        """Called by the log threads: waits while the stream is busy, so reading a huge log neither fills this
        process's memory nor holds heartbeats up behind it."""
        while self.outbound.qsize() > LOG_BACKLOG_MESSAGES and not self._stop.is_set():
            time.sleep(LOG_BACKLOG_WAIT_SECONDS)
        self.outbound.put(wire.log_data_to_proto(data))

    # ---- down: commands ------------------------------------------------------------------------

    def _handle(self, message: agent_pb2.CoordinatorMessage) -> None:
        try:
            command = wire.command_from_proto(message, self.config.name)
            if isinstance(command, Launch):
                # In line, not in a thread: a stop that follows must find the task it stops.
                self.supervisor.launch(command)
            elif isinstance(command, ExpectFiles):
                self.expected[command.job_id] = Expectation(command.sender, command.uid, command.gid)
            elif isinstance(command, Revocations):
                self.revoked.update(command.revoked)
            elif isinstance(command, Stop):
                self.supervisor.stop(command.attempt, command.grace_seconds)
            elif isinstance(command, FinishTraining):
                self.supervisor.finish_training(command.attempt, command.final_checkpoint)
            elif isinstance(command, ShipCheckpoints):
                self._ship(command)
            elif isinstance(command, SyncCheckpoints):
                self._sync(command)
            elif isinstance(command, ReadLog):
                self.logs.read(command)
            elif isinstance(command, CancelLog):
                self.logs.cancel(command.request_id)
        except Exception:  # one bad command must not take the agent down
            log.exception("command %s failed", message.WhichOneof("kind"))

    def _ship(self, order: ShipCheckpoints) -> None:
        record = self.supervisor.current(order.attempt)
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
            record.name,
            lambda: self.credentials, on_sent=functools.partial(self.metrics.shipped, "new"),
            on_failed=functools.partial(self.metrics.ship_failed, "new")).start()

    def _sync(self, order: SyncCheckpoints) -> None:
        """Copies the job's checkpoint dir, once per sync id: asked again, the kept answer is sent again."""
        key = (order.job_id, order.sync_id)
        with self.sync_lock:
            if key in self.sync_results:
                self.outbound.put(wire.sync_result_to_proto(self.sync_results[key]))
                return
            if key in self.syncs_running:
                return
            self.syncs_running.add(key)
        threading.Thread(target=self._copy, args=(order,), name="sync", daemon=True).start()

    def _copy(self, order: SyncCheckpoints) -> None:
        directory = job_checkpoint_dir(self.config.state_dir, order.job_id)
        total, seconds, errors = 0, 0.0, []
        for target in peers(order.targets, order.target_nodes):
            try:
                size, took = sync_dir(target, order.job_id, str(directory), self.credentials) \
                    if directory.is_dir() else (0, 0.0)
                total, seconds = total + size, seconds + took
                self.metrics.shipped("copy", size, took)
            except (OSError, ShipError) as e:
                errors.append(str(e))
                self.metrics.ship_failed("copy")
        log.info("%s: copied checkpoints to %s: %.1f MB in %.2f s%s", order.job_id, ", ".join(order.targets),
                 total / 1e6, seconds, f"; failed: {'; '.join(errors)}" if errors else "",
                 extra=fields(job=order.job_id))
        result = SyncResult(order.job_id, order.sync_id, ok=not errors, message="; ".join(errors), bytes=total,
                            seconds=seconds)
        with self.sync_lock:
            self.syncs_running.discard((order.job_id, order.sync_id))
            self.sync_results[(order.job_id, order.sync_id)] = result
            while len(self.sync_results) > SYNC_RESULTS_KEPT:
                del self.sync_results[next(iter(self.sync_results))]
        self.outbound.put(wire.sync_result_to_proto(result))


_END = object()
