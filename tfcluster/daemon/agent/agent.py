"""The agent process: registers its node, keeps one stream to the coordinator (heartbeats and task reports
up; launch, stop and log commands down), and reconnects with backoff when the coordinator is away without
touching running tasks. Registration carries every task the agent supervises, so nothing said while
disconnected is lost.
"""

from __future__ import annotations

import json
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from tfcluster import __version__, auth
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.api.v1 import types_pb2 as pb
from tfcluster.daemon.agent.discovery import HostInfo
from tfcluster.daemon.agent.shipping import (CHUNK_BYTES, PeerServicer, ShipError, Shipper, job_checkpoint_dir,
                                             sync_dir)
from tfcluster.daemon.agent.supervisor import Supervisor, TaskRecord
from tfcluster.daemon.coordinator.scheduler import Gpu
from tfcluster.wire import gpu_to_proto

log = logging.getLogger("tfcluster.agent")

LOG_CHUNK_BYTES = 64 * 1024
LOG_FOLLOW_POLL_SECONDS = 0.1
EVENTS_POLL_SECONDS = 0.2
BACKOFF_START_SECONDS = 0.5
# Short enough that agents are back well inside a restarted coordinator's reconnect grace.
BACKOFF_MAX_SECONDS = 2.0
PHASES = {"RUNNING": pb.TASK_PHASE_RUNNING, "EXITED": pb.TASK_PHASE_EXITED,
          "FAILED_TO_START": pb.TASK_PHASE_FAILED_TO_START}


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
    token: str | None = None  # the cluster token, on every call made and required on every call served


def task_report(record: TaskRecord) -> pb.TaskReport:
    msg = pb.TaskReport(job_id=record.job_id, task_type=record.task_type, task_index=record.task_index,
                        attempt=record.attempt, phase=PHASES[record.phase], pid=record.pid, message=record.message,
                        log_tail=record.log_tail, log_path=str(record.log_path), busy_port=record.busy_port,
                        listening=record.listening, final_checkpoint=record.final_checkpoint)
    if record.exit_code is not None:
        msg.exit_code = record.exit_code
    if record.signal is not None:
        msg.signal = record.signal
    return msg


class Agent:
    def __init__(self, config: AgentConfig):
        self.config = config
        self.outbound: queue.Queue = queue.Queue()
        self.supervisor = Supervisor(config.state_dir, self._on_task_change)
        self.log_cancels: dict[int, threading.Event] = {}
        self._stop = threading.Event()
        self._call = None
        self.connected = threading.Event()
        self.event_offsets: dict[tuple, int] = {}  # how far each task's events file has been sent
        self.events_lock = threading.Lock()
        self.shippers: dict[tuple, Shipper] = {}
        self.peer_server = None

    # ---- lifecycle -----------------------------------------------------------------------------

    def run(self) -> None:
        """Registers and serves the stream until stop(); reconnects with backoff on any failure."""
        adopted = self.supervisor.adopt_running()
        if adopted:
            log.info("reattached to %d running tasks", adopted)
        threading.Thread(target=self._forward_events, name="events", daemon=True).start()
        if self.config.peer_port and self.peer_server is None:
            self.serve_peers()
        backoff = BACKOFF_START_SECONDS
        with auth.channel(self.config.coordinator, self.config.token, options=[
                ("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000)]) as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            while not self._stop.is_set():
                try:
                    self._session(stub)
                    backoff = BACKOFF_START_SECONDS
                except grpc.RpcError as e:
                    if self._stop.is_set():
                        break
                    code = e.code() if hasattr(e, "code") else None
                    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED):
                        log.error("coordinator refused this agent: %s", e.details())
                    else:
                        log.warning("coordinator %s unreachable (%s); retrying in %.1f s", self.config.coordinator,
                                    code.name if code else e, backoff)
                finally:
                    self.connected.clear()
                if self._stop.wait(backoff * random.uniform(0.8, 1.2)):
                    break
                backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)

    def serve_peers(self) -> None:
        """Starts receiving checkpoints from other agents (raises OSError when the port is taken)."""
        from concurrent import futures

        self.peer_server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="peer"),
                                       options=[("grpc.max_receive_message_length", 8 * CHUNK_BYTES)],
                                       interceptors=auth.server_interceptors(self.config.token))
        agent_pb2_grpc.add_AgentPeerServiceServicer_to_server(PeerServicer(self.config.state_dir), self.peer_server)
        address = f"{self.config.address}:{self.config.peer_port}"
        if not self.peer_server.add_insecure_port(address):
            raise OSError(f"cannot listen for peers on {address}")
        self.peer_server.start()
        log.info("receiving checkpoints from other agents on %s", address)

    def stop(self, stop_tasks: bool = False, grace_seconds: float = 10.0) -> None:
        self._stop.set()
        if self.peer_server is not None:
            self.peer_server.stop(1)
        if self._call is not None:
            self._call.cancel()
        if stop_tasks:
            self.supervisor.stop_all(grace_seconds)

    def _session(self, stub: agent_pb2_grpc.AgentServiceStub) -> None:
        # Reports queued before this point are covered by the snapshot sent with the registration.
        while not self.outbound.empty():
            self.outbound.get_nowait()
        request = agent_pb2.RegisterRequest(node=self._node_info(),
                                            tasks=[task_report(r) for r in self.supervisor.snapshot()
                                                   if r.phase != "STARTING"])
        reply = stub.Register(request, timeout=10)
        with self.events_lock:
            # The coordinator keeps one result per checkpoint, so re-sending every task's events after a
            # registration costs nothing, and a restarted coordinator gets them all.
            self.event_offsets.clear()
        interval = reply.heartbeat_interval_seconds or 1.0
        log.info("registered with %s as %s (%s)", self.config.coordinator, self.config.name, self.config.address)

        def messages():
            yield agent_pb2.AgentMessage(open=agent_pb2.StreamOpen(node_name=self.config.name,
                                                                   session_id=reply.session_id))
            yield self._heartbeat(reply.session_id)
            next_beat = time.monotonic() + interval
            while not self._stop.is_set():
                try:
                    item = self.outbound.get(timeout=max(0.0, next_beat - time.monotonic()))
                except queue.Empty:
                    item = None
                if item is _END:
                    return
                if item is not None:
                    yield item
                if time.monotonic() >= next_beat:
                    yield self._heartbeat(reply.session_id)
                    next_beat = time.monotonic() + interval

        self._call = stub.Connect(messages())
        self.connected.set()
        try:
            for command in self._call:
                self._handle(command)
        finally:
            self.outbound.put(_END)
            self._call = None

    def _heartbeat(self, session_id: str) -> agent_pb2.AgentMessage:
        progress = [agent_pb2.TaskProgress(job_id=r.job_id, task_type=r.task_type, task_index=r.task_index,
                                           attempt=r.attempt, output_bytes=size, checkpoint=checkpoint)
                    for r, size, checkpoint in self.supervisor.progress()]
        return agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(session_id=session_id, progress=progress))

    def _node_info(self) -> pb.NodeInfo:
        c = self.config
        return pb.NodeInfo(name=c.name, hostname=c.host.hostname, address=c.address,
                           port_range_start=c.port_range[0], port_range_end=c.port_range[1],
                           cpu_count=c.host.cpu_count, memory_bytes=c.host.memory_bytes,
                           gpus=[gpu_to_proto(g) for g in c.gpus], agent_version=__version__,
                           state_dir=str(c.state_dir), peer_port=c.peer_port)

    def _on_task_change(self, record: TaskRecord) -> None:
        if record.exited.is_set():
            # What the task reported last (its final evaluation) must reach the coordinator before its exit.
            self._send_events(record)
        self.outbound.put(agent_pb2.AgentMessage(task=task_report(record)))

    def _forward_events(self) -> None:
        """Sends what tasks append to their events files (evaluation results) to the coordinator."""
        while not self._stop.wait(EVENTS_POLL_SECONDS):
            if self.connected.is_set():
                for record in self.supervisor.snapshot():
                    self._send_events(record)

    def _send_events(self, record: TaskRecord) -> None:
        key = (record.key, record.attempt)
        with self.events_lock:
            try:
                with open(record.events_path, "rb") as f:
                    f.seek(self.event_offsets.get(key, 0))
                    data = f.read()
            except OSError:
                return
            complete = data[:data.rfind(b"\n") + 1]
            self.event_offsets[key] = self.event_offsets.get(key, 0) + len(complete)
            for line in complete.splitlines():
                self._send_event(record, line)

    def _send_event(self, record: TaskRecord, line: bytes) -> None:
        try:
            event = json.loads(line)
            if event.get("kind") != "evaluation":
                return
            message = pb.Evaluation(job_id=record.job_id, task_type=record.task_type, task_index=record.task_index,
                                    attempt=record.attempt, checkpoint=str(event["checkpoint"]),
                                    step=int(event["step"]), time=float(event["time"]),
                                    metrics={str(k): float(v) for k, v in event["metrics"].items()})
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("%s: ignoring a malformed event line: %r", record.name, line[:200])
            return
        self.outbound.put(agent_pb2.AgentMessage(evaluation=message))

    # ---- commands ------------------------------------------------------------------------------

    def _handle(self, command: agent_pb2.CoordinatorMessage) -> None:
        kind = command.WhichOneof("kind")
        try:
            if kind == "launch":
                m = command.launch
                # In line, not in a thread: a stop that follows must find the task it stops.
                self.supervisor.launch(job_id=m.job_id, task_type=m.task_type, task_index=m.task_index,
                                       attempt=m.attempt, command=list(m.command), env=dict(m.env),
                                       workdir=m.workdir, port=m.port, stop_grace_seconds=m.stop_grace_seconds,
                                       report_listening=m.report_listening)
            elif kind == "ship":
                self._ship(command.ship)
            elif kind == "sync":
                threading.Thread(target=self._sync, args=(command.sync,), name="sync", daemon=True).start()
            elif kind == "finish_training":
                m = command.finish_training
                self.supervisor.finish_training(m.job_id, m.task_type, m.task_index, m.attempt, m.final_checkpoint)
            elif kind == "stop":
                m = command.stop
                self.supervisor.stop(m.job_id, m.task_type, m.task_index, m.attempt, m.grace_seconds)
            elif kind == "read_log":
                cancel = self.log_cancels[command.read_log.request_id] = threading.Event()
                threading.Thread(target=self._serve_log, args=(command.read_log, cancel), name="log",
                                 daemon=True).start()
            elif kind == "cancel_log":
                event = self.log_cancels.pop(command.cancel_log.request_id, None)
                if event is not None:
                    event.set()
        except Exception:  # one bad command must not take the agent down
            log.exception("command %s failed", kind)

    def _ship(self, m: agent_pb2.ShipCheckpoints) -> None:
        record = self.supervisor.find(m.job_id, m.task_type, m.task_index, m.attempt)
        if record is None or record.exited.is_set() or not record.checkpoint_dir:
            return
        key = (record.key, record.attempt)
        shipper = self.shippers.get(key)
        if shipper is not None and shipper.thread.is_alive():
            shipper.retarget(list(m.targets))
            return
        for old in [k for k, s in self.shippers.items() if not s.thread.is_alive()]:
            del self.shippers[old]
        self.shippers[key] = Shipper(m.job_id, record.checkpoint_dir, list(m.targets), record.exited,
                                     record.name, self.config.token).start()

    def _sync(self, m: agent_pb2.SyncCheckpoints) -> None:
        directory = job_checkpoint_dir(self.config.state_dir, m.job_id)
        total, seconds, errors = 0, 0.0, []
        for target in m.targets:
            try:
                size, took = sync_dir(target, m.job_id, str(directory), self.config.token) \
                    if directory.is_dir() else (0, 0.0)
                total, seconds = total + size, seconds + took
            except (OSError, ShipError) as e:
                errors.append(str(e))
        log.info("%s: copied checkpoints to %s: %.1f MB in %.2f s%s", m.job_id, ", ".join(m.targets), total / 1e6,
                 seconds, f"; failed: {'; '.join(errors)}" if errors else "")
        self.outbound.put(agent_pb2.AgentMessage(sync_done=agent_pb2.SyncDone(
            job_id=m.job_id, sync_id=m.sync_id, ok=not errors, message="; ".join(errors), bytes=total,
            seconds=seconds)))

    def _serve_log(self, request: agent_pb2.ReadLog, cancel: threading.Event) -> None:
        def send(**fields) -> None:
            self.outbound.put(agent_pb2.AgentMessage(log=agent_pb2.LogData(request_id=request.request_id, **fields)))

        try:
            record = self.supervisor.find(request.job_id, request.task_type, request.task_index, request.attempt)
            if record is None:
                send(eof=True, error=f"no log for {request.task_type}:{request.task_index} attempt "
                                     f"{request.attempt} on {self.config.name}")
                return
            path = record.log_path
            while not path.exists() and request.follow and not record.exited.is_set() and not cancel.is_set():
                time.sleep(LOG_FOLLOW_POLL_SECONDS)
            if not path.exists():
                send(eof=True)
                return
            with open(path, "rb") as f:
                if request.tail_lines:
                    f.seek(tail_offset(f, request.tail_lines))
                while not cancel.is_set() and not self._stop.is_set():
                    data = f.read(LOG_CHUNK_BYTES)
                    if data:
                        send(data=data)
                        continue
                    if not request.follow or record.exited.is_set():
                        # The shim closes the log before it records the exit: one more read drains it.
                        rest = f.read()
                        if rest:
                            send(data=rest)
                        break
                    time.sleep(LOG_FOLLOW_POLL_SECONDS)
            send(eof=True)
        finally:
            self.log_cancels.pop(request.request_id, None)


_END = object()


def tail_offset(f, lines: int) -> int:
    """Offset where the last `lines` lines of a binary file start."""
    end = f.seek(0, 2)
    pos, found, block = end, 0, 8192
    if end == 0:
        return 0
    f.seek(end - 1)
    skip_last_newline = f.read(1) == b"\n"
    while pos > 0:
        step = min(block, pos)
        pos -= step
        f.seek(pos)
        chunk = f.read(step)
        if skip_last_newline and pos + step == end:
            chunk = chunk[:-1]
        for i in range(len(chunk) - 1, -1, -1):
            if chunk[i] == 0x0A:
                found += 1
                if found == lines:
                    return pos + i + 1
    return 0
