"""The coordinator process: gRPC servicers around the pure Cluster model, the SQLite store, and one
command stream per agent. Every change runs under one lock, is persisted, then its actions are queued to
the agents' streams. Nothing a client or agent sends can crash it: bad fields get INVALID_ARGUMENT.
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tfcluster import __version__
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc, control_pb2, control_pb2_grpc
from tfcluster.api.v1 import types_pb2 as pb
from tfcluster.auth import server_interceptors
from tfcluster.daemon.coordinator import jobs as J
from tfcluster.daemon.coordinator.cluster import Cluster, LOST, NodeInfo, Progress, READY, Report, Unplaceable
from tfcluster.daemon.coordinator.store import Store
from tfcluster.spec import SpecError
from tfcluster.wire import PHASE_NAMES, gpu_from_proto, gpu_to_proto, spec_from_proto

log = logging.getLogger("tfcluster.coordinator")

HEARTBEAT_INTERVAL_SECONDS = 1.0
TICK_SECONDS = 0.2
RECONNECT_GRACE_SECONDS = 10.0
LOG_POLL_SECONDS = 0.5


class _Outbox:
    """Commands waiting for a node's current stream; survives reconnects so nothing queued is lost."""

    def __init__(self) -> None:
        self.items: collections.deque = collections.deque()
        self.cond = threading.Condition()
        self.generation = 0

    def put(self, item) -> None:
        with self.cond:
            self.items.append(item)
            self.cond.notify_all()

    def take_over(self) -> int:
        with self.cond:
            self.generation += 1
            self.cond.notify_all()
            return self.generation

    def get(self, generation: int, timeout: float):
        """The next item for the stream of this generation; None on timeout; raises EOFError once replaced."""
        with self.cond:
            deadline = time.monotonic() + timeout
            while not self.items:
                if self.generation != generation:
                    raise EOFError
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)
            if self.generation != generation:
                raise EOFError
            return self.items.popleft()


class _LogWaiter:
    def __init__(self, node: str):
        self.node = node
        self.chunks: queue.Queue = queue.Queue()


class Coordinator:
    def __init__(self, state_dir: Path, lost_after_seconds: float = 3.0,
                 heartbeat_interval_seconds: float = HEARTBEAT_INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.time,
                 reconnect_grace_seconds: float = RECONNECT_GRACE_SECONDS):
        self.reconnect_grace = reconnect_grace_seconds
        self.clock = clock
        self.heartbeat_interval = heartbeat_interval_seconds
        self.cluster = Cluster(lost_after_seconds)
        self.store = Store(Path(state_dir))
        self.lock = threading.RLock()
        self.outboxes: dict[str, _Outbox] = collections.defaultdict(_Outbox)
        self.connected: dict[str, int] = {}
        self.log_waiters: dict[int, _LogWaiter] = {}
        self.log_ids = itertools.count(1)
        self._load()

    def _load(self) -> None:
        now = self.clock()
        for job in self.store.load_jobs():
            if not job.terminal:  # the hang watchdog counts from now: progress was not seen while away
                job.last_progress = now
            self.cluster.jobs[job.id] = job
        for node in self.store.load_nodes():
            # After a coordinator restart, agents get the reconnect grace (they retry with backoff) on top of
            # the usual timeout before their nodes, and the tasks on them, count as lost.
            node.last_seen = now + self.reconnect_grace
            node.session_id = ""
            self.cluster.nodes[node.info.name] = node
        if self.cluster.jobs:
            log.info("loaded %d jobs and %d nodes from %s", len(self.cluster.jobs), len(self.cluster.nodes),
                     self.store.path)

    # ---- applying changes ----------------------------------------------------------------------

    def mutate(self, change: Callable[[float], list[J.Action]]):
        with self.lock:
            actions = change(self.clock())
            self._persist()
            for action in actions:
                self._send(action)

    def _persist(self) -> None:
        c = self.cluster
        jobs = [c.jobs[j] for j in c.dirty_jobs if j in c.jobs]
        nodes = [c.nodes[n] for n in c.dirty_nodes if n in c.nodes]
        c.dirty_jobs.clear()
        c.dirty_nodes.clear()
        self.store.save(jobs, nodes)

    def _send(self, action: J.Action) -> None:
        if isinstance(action, J.Launch):
            task = action.task
            msg = agent_pb2.CoordinatorMessage(launch=pb.TaskLaunch(
                job_id=action.job_id, task_type=task.type, task_index=task.index, attempt=task.attempt,
                command=action.command, env=action.env, workdir=action.workdir, port=task.port,
                stop_grace_seconds=action.stop_grace_seconds, report_listening=action.report_listening))
            log.info("launch %s %s attempt %d on %s", action.job_id, task.key, task.attempt, action.node)
        elif isinstance(action, J.ShipCheckpoints):
            msg = agent_pb2.CoordinatorMessage(ship=agent_pb2.ShipCheckpoints(
                job_id=action.job_id, task_type=action.task_type, task_index=action.task_index,
                attempt=action.attempt, targets=action.targets))
            log.info("%s: %s ships %s:%d's checkpoints to %s", action.job_id, action.node, action.task_type,
                     action.task_index, ", ".join(action.targets))
        elif isinstance(action, J.SyncCheckpoints):
            msg = agent_pb2.CoordinatorMessage(sync=agent_pb2.SyncCheckpoints(
                job_id=action.job_id, sync_id=action.sync_id, targets=action.targets))
            log.info("%s: copying checkpoints from %s to %s", action.job_id, action.node, ", ".join(action.targets))
        elif isinstance(action, J.FinishTraining):
            msg = agent_pb2.CoordinatorMessage(finish_training=agent_pb2.FinishTraining(
                job_id=action.job_id, task_type=action.task_type, task_index=action.task_index,
                attempt=action.attempt, final_checkpoint=action.final_checkpoint))
            log.info("training of %s finished: evaluator told the final checkpoint is %r", action.job_id,
                     action.final_checkpoint)
        else:
            msg = agent_pb2.CoordinatorMessage(stop=agent_pb2.StopTask(
                job_id=action.job_id, task_type=action.task_type, task_index=action.task_index,
                attempt=action.attempt, grace_seconds=action.grace_seconds))
            log.info("stop %s %s:%d attempt %d on %s", action.job_id, action.task_type, action.task_index,
                     action.attempt, action.node)
        self.outboxes[action.node].put(msg)

    def tick(self) -> None:
        self.mutate(self.cluster.tick)

    # ---- agent side ----------------------------------------------------------------------------

    def register(self, request: agent_pb2.RegisterRequest) -> agent_pb2.RegisterResponse:
        info = _node_info(request.node)
        reports = [_report(t) for t in request.tasks]
        session = uuid.uuid4().hex
        self.mutate(lambda now: self.cluster.register(info, reports, session, now))
        log.info("node %s registered: %s, %d GPUs, ports %d-%d, agent %s, %d tasks", info.name, info.address,
                 len(info.gpus), *info.port_range, info.agent_version, len(reports))
        return agent_pb2.RegisterResponse(session_id=session, heartbeat_interval_seconds=self.heartbeat_interval)

    def open_stream(self, node_name: str, session_id: str) -> tuple[_Outbox, int]:
        with self.lock:
            node = self.cluster.nodes.get(node_name)
            if node is None or node.session_id != session_id or node.state != READY:
                raise PermissionError(f"node {node_name!r} has no current registration for this session; register again")
            outbox = self.outboxes[node_name]
            generation = outbox.take_over()
            self.connected[node_name] = generation
            return outbox, generation

    def close_stream(self, node_name: str, generation: int) -> None:
        with self.lock:
            if self.connected.get(node_name) == generation:
                del self.connected[node_name]
            waiters = [w for w in self.log_waiters.values() if w.node == node_name]
        for waiter in waiters:
            waiter.chunks.put(agent_pb2.LogData(error=f"node {node_name} disconnected"))

    def on_agent_message(self, node_name: str, session_id: str, msg: agent_pb2.AgentMessage) -> bool:
        """Handles one message from a node's stream; False ends the stream (the node must register again)."""
        kind = msg.WhichOneof("kind")
        if kind == "heartbeat":
            progress = [Progress(p.job_id, p.task_type, p.task_index, p.attempt, p.output_bytes, p.checkpoint)
                        for p in msg.heartbeat.progress]
            with self.lock:
                return self.cluster.heartbeat(node_name, session_id, self.clock(), progress)
        if kind == "task":
            with self.lock:
                if not self.cluster.heartbeat(node_name, session_id, self.clock()):
                    return False
            report = _report(msg.task)
            self.mutate(lambda now: self.cluster.report(node_name, report, now))
        elif kind == "sync_done":
            d = msg.sync_done
            log.info("%s: checkpoint copy %d %s (%s; %.1f MB in %.2f s)", d.job_id, d.sync_id,
                     "done" if d.ok else "failed", d.message or "ok", d.bytes / 1e6, d.seconds)
            self.mutate(lambda now: self.cluster.sync_done(d.job_id, d.sync_id, d.ok, d.message, now))
        elif kind == "evaluation":
            e = msg.evaluation
            result = {"checkpoint": e.checkpoint, "step": e.step, "metrics": dict(e.metrics), "time": e.time}
            self.mutate(lambda now: self.cluster.evaluation(node_name, e.job_id, e.task_type, e.task_index,
                                                            e.attempt, result) or [])
        elif kind == "log":
            waiter = self.log_waiters.get(msg.log.request_id)
            if waiter is not None:
                waiter.chunks.put(msg.log)
        return True

    # ---- client side ---------------------------------------------------------------------------

    def submit(self, spec_msg: pb.JobSpec) -> J.Job:
        spec = spec_from_proto(spec_msg)
        number = self.store.next_job_number()
        job_id = f"{spec.name}-{number}"
        result = {}

        def change(now: float) -> list[J.Action]:
            job, actions = self.cluster.submit(job_id, spec, now)
            result["job"] = job
            return actions
        self.mutate(change)
        log.info("job %s submitted (%s, %d tasks): %s", job_id, result["job"].strategy, len(result["job"].tasks),
                 result["job"].state)
        return result["job"]

    def stop(self, job_id: str, graceful: bool) -> str:
        with self.lock:
            if job_id not in self.cluster.jobs:
                raise KeyError(job_id)
            self.mutate(lambda now: self.cluster.stop(job_id, now, graceful))
            return self.cluster.jobs[job_id].state

    def open_log(self, job_id: str, task_type: str, task_index: int, attempt: int, follow: bool,
                 tail_lines: int) -> tuple[int, _LogWaiter]:
        with self.lock:
            job = self.cluster.jobs.get(job_id)
            if job is None:
                raise KeyError(f"unknown job {job_id!r}")
            task = job.task(task_type, task_index)
            if task is None:
                raise KeyError(f"job {job_id} has no task {task_type}:{task_index} "
                               f"(tasks: {', '.join(t.key for t in job.tasks)})")
            if not task.node or task.attempt == 0:
                raise LookupError(f"{task.key} of {job_id} has not been launched yet")
            node = self.cluster.nodes.get(task.node)
            if node is None or node.state == LOST or task.node not in self.connected:
                raise ConnectionError(f"node {task.node} (where {task.key} ran) is not connected")
            request_id = next(self.log_ids)
            waiter = self.log_waiters[request_id] = _LogWaiter(task.node)
            self.outboxes[task.node].put(agent_pb2.CoordinatorMessage(read_log=agent_pb2.ReadLog(
                request_id=request_id, job_id=job_id, task_type=task_type, task_index=task_index,
                attempt=attempt or task.attempt, follow=follow, tail_lines=tail_lines)))
            return request_id, waiter

    def close_log(self, request_id: int, cancel: bool) -> None:
        with self.lock:
            waiter = self.log_waiters.pop(request_id, None)
            if waiter is not None and cancel:
                self.outboxes[waiter.node].put(agent_pb2.CoordinatorMessage(
                    cancel_log=agent_pb2.CancelLog(request_id=request_id)))

    def status(self, job_id: str) -> control_pb2.GetStatusResponse:
        with self.lock:
            now = self.clock()
            if job_id and job_id not in self.cluster.jobs:
                raise KeyError(job_id)
            response = control_pb2.GetStatusResponse()
            running: dict[str, int] = collections.Counter()
            for job in self.cluster.jobs.values():
                for task in job.tasks:
                    if task.live:
                        running[task.node] += 1
            for node in sorted(self.cluster.nodes.values(), key=lambda n: n.info.name):
                i = node.info
                response.nodes.append(control_pb2.NodeStatus(
                    name=i.name, address=i.address, state=node.state, gpus=[gpu_to_proto(g) for g in i.gpus],
                    hostname=i.hostname, cpu_count=i.cpu_count, memory_bytes=i.memory_bytes,
                    agent_version=i.agent_version, last_seen_seconds_ago=max(0.0, now - node.last_seen),
                    port_range_start=i.port_range[0], port_range_end=i.port_range[1],
                    running_tasks=running[i.name]))
            jobs = [self.cluster.jobs[job_id]] if job_id else sorted(self.cluster.jobs.values(),
                                                                      key=lambda j: (j.created, j.id))
            for job in jobs:
                response.jobs.append(_job_status(job))
            return response


def _job_status(job: J.Job) -> control_pb2.JobStatus:
    message = job.message
    if job.last_failure and job.last_failure.describe() not in message:
        message = f"{message}; last failure: {job.last_failure.describe()}" if message else \
            f"last failure: {job.last_failure.describe()}"
    status = control_pb2.JobStatus(id=job.id, name=job.spec.name, state=job.state, strategy=job.strategy,
                                   restarts=job.restarts, message=message, created=job.created,
                                   finished=job.finished)
    for t in job.tasks:
        ts = control_pb2.TaskStatus(type=t.type, index=t.index, node=t.node, address=t.address,
                                    gpus=[gpu_to_proto(g) for g in t.gpus], state=t.state, pid=t.pid,
                                    attempt=t.attempt, message=t.message, tf_config=t.tf_config)
        if t.exit_code is not None:
            ts.exit_code = t.exit_code
        if t.signal is not None:
            ts.signal = t.signal
        status.tasks.append(ts)
    for e in job.evaluations:
        status.evaluations.append(control_pb2.EvaluationResult(checkpoint=e["checkpoint"], step=e["step"],
                                                               metrics=e["metrics"], time=e["time"]))
    if job.evaluations:
        status.last_evaluation.CopyFrom(status.evaluations[-1])
    f = job.last_failure
    if f is not None:
        status.last_failure.CopyFrom(control_pb2.Failure(task=f.task, node=f.node, message=f.message,
                                                         log_tail=f.log_tail, time=f.time,
                                                         description=f.describe()))
        if f.exit_code is not None:
            status.last_failure.exit_code = f.exit_code
        if f.signal is not None:
            status.last_failure.signal = f.signal
    status.evaluator_restarts, status.preemptions = job.evaluator_restarts, job.preemptions
    return status


def _node_info(msg: pb.NodeInfo) -> NodeInfo:
    if not msg.name:
        raise ValueError("node.name: required")
    if not msg.address:
        raise ValueError("node.address: required (an IP other nodes can reach)")
    if not (0 < msg.port_range_start <= msg.port_range_end <= 65535):
        raise ValueError(f"node.port_range_start/end: expected 1 <= start <= end <= 65535, got "
                         f"{msg.port_range_start}-{msg.port_range_end}")
    indexes = [g.index for g in msg.gpus]
    if len(set(indexes)) != len(indexes):
        raise ValueError("node.gpus: GPU indexes must be unique")
    return NodeInfo(name=msg.name, address=msg.address, port_range=(msg.port_range_start, msg.port_range_end),
                    gpus=tuple(gpu_from_proto(g) for g in msg.gpus), hostname=msg.hostname,
                    cpu_count=msg.cpu_count, memory_bytes=msg.memory_bytes, agent_version=msg.agent_version,
                    state_dir=msg.state_dir, peer_port=msg.peer_port)


def _report(msg: pb.TaskReport) -> Report:
    if msg.phase not in PHASE_NAMES:
        raise ValueError(f"task.phase: expected RUNNING, EXITED or FAILED_TO_START, got {msg.phase}")
    return Report(job_id=msg.job_id, task_type=msg.task_type, task_index=msg.task_index, attempt=msg.attempt,
                  phase=PHASE_NAMES[msg.phase], pid=msg.pid,
                  exit_code=msg.exit_code if msg.HasField("exit_code") else None,
                  signal=msg.signal if msg.HasField("signal") else None,
                  message=msg.message, log_tail=list(msg.log_tail), busy_port=msg.busy_port,
                  listening=msg.listening, final_checkpoint=msg.final_checkpoint)


# ---- gRPC servicers ----------------------------------------------------------------------------

class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, coordinator: Coordinator):
        self.c = coordinator

    def Register(self, request, context):
        try:
            return self.c.register(request)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    def Connect(self, request_iterator, context) -> Iterator[agent_pb2.CoordinatorMessage]:
        try:
            first = next(request_iterator)
        except StopIteration:
            return
        if first.WhichOneof("kind") != "open":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message on Connect must be `open`")
        node, session = first.open.node_name, first.open.session_id
        try:
            outbox, generation = self.c.open_stream(node, session)
        except PermissionError as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        ended = threading.Event()
        reason: list[str] = []

        def read() -> None:
            try:
                for msg in request_iterator:
                    if not self.c.on_agent_message(node, session, msg):
                        reason.append("session no longer current; register again")
                        break
            except ValueError as e:
                reason.append(str(e))
            except grpc.RpcError:
                pass
            except Exception:  # a bug must cost one stream, never the coordinator
                log.exception("stream from %s failed", node)
            finally:
                ended.set()

        threading.Thread(target=read, name=f"stream-{node}", daemon=True).start()
        try:
            while not ended.is_set() and context.is_active():
                try:
                    item = outbox.get(generation, timeout=LOG_POLL_SECONDS)
                except EOFError:
                    break
                if item is not None:
                    yield item
        finally:
            self.c.close_stream(node, generation)
        if reason:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, reason[0])


class ControlServicer(control_pb2_grpc.ControlServiceServicer):
    def __init__(self, coordinator: Coordinator):
        self.c = coordinator

    def SubmitJob(self, request, context):
        try:
            job = self.c.submit(request.spec)
        except SpecError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except Unplaceable as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"job cannot ever be placed: {e}")
        return control_pb2.SubmitJobResponse(job_id=job.id, state=job.state)

    def PlanJob(self, request, context):
        try:
            spec = spec_from_proto(request.spec)
        except SpecError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        with self.c.lock:
            plan = self.c.cluster.plan(spec, self.c.clock())
            scratch = J.Job(id=f"{spec.name}-plan", spec=plan.spec or spec, strategy=plan.strategy)
        response = control_pb2.PlanJobResponse(fits=plan.placement is not None, reason=plan.reason,
                                               strategy=plan.strategy)
        for p in plan.placement or []:
            task = J.Task(type=p.type, index=p.index, node=p.node, host=p.host, port=p.port, gpus=list(p.gpus),
                          tf_config=plan.tf_configs[(p.type, p.index)])
            response.tasks.append(control_pb2.PlannedTask(
                task_type=p.type, task_index=p.index, node=p.node, address=p.address,
                gpus=[gpu_to_proto(g) for g in p.gpus], tf_config=task.tf_config,
                command=scratch.command_for(task)))
        return response

    def StopJob(self, request, context):
        try:
            return control_pb2.StopJobResponse(state=self.c.stop(request.job_id, request.graceful))
        except KeyError:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown job {request.job_id!r}")

    def GetStatus(self, request, context):
        try:
            return self.c.status(request.job_id)
        except KeyError:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown job {request.job_id!r}")

    def StreamLogs(self, request, context):
        if not request.task_type:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "task_type: required")
        try:
            request_id, waiter = self.c.open_log(request.job_id, request.task_type, request.task_index,
                                                 request.attempt, request.follow, request.tail_lines)
        except KeyError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, e.args[0] if e.args else str(e))
        except LookupError as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except ConnectionError as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        finished = False
        try:
            while context.is_active():
                try:
                    chunk = waiter.chunks.get(timeout=LOG_POLL_SECONDS)
                except queue.Empty:
                    continue
                if chunk.error:
                    finished = True
                    context.abort(grpc.StatusCode.UNAVAILABLE if "disconnected" in chunk.error
                                  else grpc.StatusCode.NOT_FOUND, chunk.error)
                if chunk.data:
                    yield control_pb2.LogChunk(data=chunk.data)
                if chunk.eof:
                    finished = True
                    return
        finally:
            self.c.close_log(request_id, cancel=not finished)


class CoordinatorServer:
    """A running coordinator: the gRPC server plus the ticker that expires nodes and places jobs."""

    def __init__(self, listen: str, state_dir: Path, lost_after_seconds: float = 3.0,
                 heartbeat_interval_seconds: float = HEARTBEAT_INTERVAL_SECONDS, max_workers: int = 64,
                 token: str | None = None):
        self.coordinator = Coordinator(state_dir, lost_after_seconds, heartbeat_interval_seconds)
        self.token = token
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rpc"),
                                  interceptors=server_interceptors(token),
                                  options=[("grpc.keepalive_permit_without_calls", 1),
                                           ("grpc.http2.min_ping_interval_without_data_ms", 5000)])
        agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentServicer(self.coordinator), self.server)
        control_pb2_grpc.add_ControlServiceServicer_to_server(ControlServicer(self.coordinator), self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {listen}")
        host = listen.rsplit(":", 1)[0]
        self.address = f"{'127.0.0.1' if host in ('0.0.0.0', '[::]', '') else host}:{self.port}"
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick_loop, name="ticker", daemon=True)

    def start(self) -> "CoordinatorServer":
        self.server.start()
        for service in ("", "tfcluster.v1.AgentService", "tfcluster.v1.ControlService"):
            self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._ticker.start()
        log.info("coordinator %s listening on %s (state: %s)", __version__, self.address,
                 self.coordinator.store.path)
        if not self.token:
            log.warning("no cluster token (--token-file): anyone who reaches %s can make the agents run "
                        "commands", self.address)
        return self

    def _tick_loop(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            try:
                self.coordinator.tick()
            except Exception:
                log.exception("tick failed")

    def stop(self, grace: float = 1.0) -> None:
        self._stop.set()
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()
        self.coordinator.store.close()

    def wait(self) -> None:
        self.server.wait_for_termination()
