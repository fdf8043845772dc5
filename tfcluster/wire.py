"""Every conversion between tfcluster's values and the wire messages (tfcluster.api.v1), in one place.

What arrives from the network is checked here, at the edge: a bad or oversized field raises ValueError
naming it (the servers answer INVALID_ARGUMENT), so nothing malformed reaches the core. What the CLI prints
with --json, built from these messages, is in views.py.
"""

from __future__ import annotations

import ipaddress
import math
import os
import posixpath
from collections.abc import Sequence
from typing import Any

from tfcluster import summaries
from tfcluster.api.v1 import agent_pb2, control_pb2
from tfcluster.api.v1 import types_pb2 as pb
from tfcluster.conditions import MAX_CONDITION_MESSAGE, MAX_CONDITIONS, NodeCondition
from tfcluster.labels import label_problem
from tfcluster.model import CHIEF, DEFAULT_STOP_SIGNAL, STOP_SIGNALS, WORKER
from tfcluster.model import (MAX_CODE_SOURCES, MAX_DRAIN_REASON, MAX_GPUS_PER_NODE, NODE_NAME_RE, Attempt,
                             CancelLog, Command, EnvironmentSpec, Evaluation, ExpectFiles, FinishTraining, Gpu, Launch,
                             LogData, NodeInfo, Probe, ProbeAnswer, ProbeOutcome, ProbeTarget, ReadLog, Revocations,
                             ServeCode, SetPace, ShipCheckpoints, Stop, SyncCheckpoints, SyncResult, TaskExit,
                             TaskProgress, TaskReport, control_character, printable)
from tfcluster.spec import JobSpec, RestartPolicy, RoleSpec, SpecError, validate
from tfcluster.states import JobState, Phase
from tfcluster.summaries import SummaryChunk
from tfcluster.sweepspec import DEFAULT_REDUCTION_FACTOR, SweepSpec, validate_sweep

MAX_TEXT = 4096        # a message, a path, a name of a GPU
MAX_LOG_TAIL_LINES = 50
MAX_TASKS_PER_NODE = 10_000  # task reports with a registration, progress entries with a heartbeat
MAX_JOB_IDS = 1000           # asked about in one EndedJobs call
MAX_HEARTBEAT_INTERVAL_SECONDS = 3600.0  # what a coordinator may tell an agent (Pace)
MAX_PROBE_TARGETS = 64           # ports one agent connects to for `tfcluster doctor`
MAX_PROBE_LISTEN_SECONDS = 60.0
PHASES = {Phase.RUNNING: pb.TASK_PHASE_RUNNING, Phase.EXITED: pb.TASK_PHASE_EXITED,
          Phase.FAILED_TO_START: pb.TASK_PHASE_FAILED_TO_START}
PHASE_NAMES = {v: k for k, v in PHASES.items()}


def _text(value: str, field: str, limit: int = MAX_TEXT) -> str:
    if len(value) > limit:
        raise ValueError(f"{field}: expected at most {limit} characters, got {len(value)}")
    bad = control_character(value)
    if bad:
        raise ValueError(f"{field}: must not contain control characters, found {bad} in {value[:80]!r}")
    return value


# ---- nodes and GPUs -----------------------------------------------------------------------------

def gpu_to_proto(gpu: Gpu) -> pb.Gpu:
    return pb.Gpu(index=gpu.index, uuid=gpu.uuid, name=gpu.name, memory_mib=gpu.memory_mib)


def gpu_from_proto(msg: pb.Gpu) -> Gpu:
    return Gpu(index=msg.index, uuid=_text(msg.uuid, "gpu.uuid", 256), name=_text(msg.name, "gpu.name", 256),
               memory_mib=msg.memory_mib)


def node_info_to_proto(info: NodeInfo) -> pb.NodeInfo:
    return pb.NodeInfo(name=info.name, hostname=info.hostname, address=info.address,
                       port_range_start=info.port_range[0], port_range_end=info.port_range[1],
                       cpu_count=info.cpu_count, memory_bytes=info.memory_bytes,
                       gpus=[gpu_to_proto(g) for g in info.gpus], agent_version=info.agent_version,
                       state_dir=info.state_dir, peer_port=info.peer_port, labels=info.labels,
                       gpu_driver=info.gpu_driver, cuda_version=info.cuda_version)


def node_info_from_proto(msg: pb.NodeInfo) -> NodeInfo:
    """A registering node, checked: a name, an IP, sane ports, a bounded GPU list, an absolute state dir."""
    if not NODE_NAME_RE.fullmatch(msg.name):
        raise ValueError(f"node.name: expected letters, digits, '.', '_' or '-' (at most 253), got {msg.name[:80]!r}")
    try:
        address = ipaddress.ip_address(msg.address)
    except ValueError:
        raise ValueError(f"node.address: expected an IP address other nodes can reach, got {msg.address[:80]!r}") \
            from None
    if address.is_unspecified:
        raise ValueError(f"node.address: {msg.address} is not an address other nodes can reach")
    if address.version != 4:
        raise ValueError(f"node.address: {msg.address}: only IPv4 addresses are supported")
    if not (0 < msg.port_range_start <= msg.port_range_end <= 65535):
        raise ValueError(f"node.port_range_start/end: expected 1 <= start <= end <= 65535, got "
                         f"{msg.port_range_start}-{msg.port_range_end}")
    if msg.peer_port > 65535 or msg.port_range_start <= msg.peer_port <= msg.port_range_end:
        raise ValueError(f"node.peer_port: expected a port outside the task ports, got {msg.peer_port}")
    if len(msg.gpus) > MAX_GPUS_PER_NODE:
        raise ValueError(f"node.gpus: at most {MAX_GPUS_PER_NODE} GPUs per node, got {len(msg.gpus)}")
    if len({g.index for g in msg.gpus}) != len(msg.gpus):
        raise ValueError("node.gpus: GPU indexes must be unique")
    if not os.path.isabs(msg.state_dir):
        raise ValueError(f"node.state_dir: expected an absolute path, got {msg.state_dir[:80]!r}")
    problem = label_problem(msg.labels)
    if problem:
        raise ValueError(f"node.labels: {problem}")
    return NodeInfo(name=msg.name, address=str(address), port_range=(msg.port_range_start, msg.port_range_end),
                    gpus=tuple(gpu_from_proto(g) for g in msg.gpus), hostname=_text(msg.hostname, "node.hostname", 253),
                    cpu_count=msg.cpu_count, memory_bytes=msg.memory_bytes,
                    agent_version=_text(msg.agent_version, "node.agent_version", 64),
                    state_dir=_text(msg.state_dir, "node.state_dir"), peer_port=msg.peer_port,
                    labels=tuple(msg.labels), gpu_driver=_text(msg.gpu_driver, "node.gpu_driver", 64),
                    cuda_version=_text(msg.cuda_version, "node.cuda_version", 16))


# ---- agent to coordinator -----------------------------------------------------------------------

def _attempt(msg, field: str) -> Attempt:
    return Attempt(_text(msg.job_id, f"{field}.job_id", 256), _text(msg.task_type, f"{field}.task_type", 32),
                   msg.task_index, msg.attempt)


def _attempt_fields(a: Attempt) -> dict[str, Any]:
    return {"job_id": a.job_id, "task_type": a.type, "task_index": a.index, "attempt": a.number}


def task_report_to_proto(r: TaskReport) -> pb.TaskReport:
    msg = pb.TaskReport(**_attempt_fields(r.attempt), phase=PHASES[r.phase], pid=r.pid, listening=r.listening)
    if r.exit is not None:
        e = r.exit
        msg.message, msg.busy_port, msg.final_checkpoint = e.message, e.busy_port, e.final_checkpoint
        msg.cpu_seconds, msg.peak_rss_bytes, msg.permanent = e.cpu_seconds, e.peak_rss_bytes, e.permanent
        msg.log_tail.extend(e.log_tail)
        if e.exit_code is not None:
            msg.exit_code = e.exit_code
        if e.signal is not None:
            msg.signal = e.signal
    return msg


def task_report_from_proto(msg: pb.TaskReport) -> TaskReport:
    if msg.phase not in PHASE_NAMES:
        raise ValueError(f"task.phase: expected {', '.join(PHASES)}, got {msg.phase}")
    phase = PHASE_NAMES[msg.phase]
    exit = None
    if phase != Phase.RUNNING:
        exit = TaskExit(exit_code=msg.exit_code if msg.HasField("exit_code") else None,
                        signal=msg.signal if msg.HasField("signal") else None, message=msg.message[:MAX_TEXT],
                        log_tail=tuple(line[:MAX_TEXT] for line in msg.log_tail[-MAX_LOG_TAIL_LINES:]),
                        busy_port=msg.busy_port, final_checkpoint=_text(msg.final_checkpoint, "task.final_checkpoint"),
                        cpu_seconds=_seconds(msg.cpu_seconds),
                        peak_rss_bytes=msg.peak_rss_bytes, permanent=msg.permanent and phase == Phase.FAILED_TO_START)
    return TaskReport(_attempt(msg, "task"), phase, pid=msg.pid, listening=msg.listening, exit=exit)


def heartbeat_to_proto(session_id: str, progress: list[TaskProgress], condition: str = "",
                       health_failure: str = "", conditions: Sequence[NodeCondition] = ()) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(
        session_id=session_id, condition=condition, health_failure=health_failure,
        conditions=conditions_to_proto(conditions), progress=[
        agent_pb2.TaskProgress(**_attempt_fields(p.attempt), output_bytes=p.output_bytes, checkpoint=p.checkpoint,
                               cpu_seconds=p.cpu_seconds, rss_bytes=p.rss_bytes, peak_rss_bytes=p.peak_rss_bytes,
                               phase_detail=p.phase_detail)
        for p in progress]))


def environment_to_proto(e: EnvironmentSpec) -> pb.EnvironmentSpec:
    return pb.EnvironmentSpec(requirements=e.requirements, isolated=e.isolated, project=e.project)


def environment_from_proto(msg: pb.EnvironmentSpec) -> EnvironmentSpec:
    """Paths inside the workdir only: the agent reads these files as root."""
    for name in ("requirements", "project"):
        value = _text(getattr(msg, name), f"environment.{name}", 1024)
        if value and (posixpath.isabs(value) or ".." in value.split("/")):
            raise ValueError(f"environment.{name}: must be a path inside the workdir, got {value!r}")
    return EnvironmentSpec(msg.requirements, msg.isolated, msg.project)


def condition_from_proto(msg: agent_pb2.Heartbeat) -> str:
    """Why the node takes no new tasks ("" when it does): shown as it is, so made one safe line."""
    return printable(msg.condition[:MAX_TEXT])


def health_from_proto(msg: agent_pb2.Heartbeat | agent_pb2.RegisterRequest) -> str:
    """The agent's failed health check's line ("" when it passed or none runs), made a safe drain reason."""
    return printable(msg.health_failure.strip()[:MAX_DRAIN_REASON])


def conditions_to_proto(conditions: Sequence[NodeCondition]) -> list[pb.NodeCondition]:
    return [pb.NodeCondition(gpu=c.gpu, kind=c.kind, message=c.message, since=c.since) for c in conditions]


def conditions_from_proto(msg: agent_pb2.Heartbeat | agent_pb2.RegisterRequest) -> tuple[NodeCondition, ...]:
    """What the agent's GPU check found, each made one safe line. A kind this coordinator does not know (a newer
    agent's) is shown and excludes nothing."""
    if len(msg.conditions) > MAX_CONDITIONS:
        raise ValueError(f"conditions: at most {MAX_CONDITIONS}, got {len(msg.conditions)}")
    found = []
    for c in msg.conditions:
        if c.HasField("gpu") and c.gpu >= MAX_GPUS_PER_NODE:
            raise ValueError(f"conditions.gpu: expected a GPU index below {MAX_GPUS_PER_NODE}, got {c.gpu}")
        found.append(NodeCondition(gpu=c.gpu if c.HasField("gpu") else None, kind=printable(c.kind[:40]),
                                   message=printable(c.message[:MAX_CONDITION_MESSAGE]),
                                   since=c.since if math.isfinite(c.since) else 0.0))
    return tuple(found)


def progress_from_proto(msg: agent_pb2.Heartbeat) -> list[TaskProgress]:
    if len(msg.progress) > MAX_TASKS_PER_NODE:
        raise ValueError(f"heartbeat.progress: at most {MAX_TASKS_PER_NODE} tasks, got {len(msg.progress)}")
    return [TaskProgress(_attempt(p, "progress"), p.output_bytes, p.checkpoint[:MAX_TEXT],
                         cpu_seconds=_seconds(p.cpu_seconds), rss_bytes=p.rss_bytes, peak_rss_bytes=p.peak_rss_bytes,
                         phase_detail=printable(p.phase_detail[:MAX_TEXT]))
            for p in msg.progress]


def evaluation_to_proto(attempt: Attempt, e: Evaluation) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(evaluation=pb.Evaluation(**_attempt_fields(attempt), checkpoint=e.checkpoint,
                                                           step=e.step, metrics=e.metrics, time=e.time))


def evaluation_from_proto(msg: pb.Evaluation) -> tuple[Attempt, Evaluation]:
    if len(msg.metrics) > 256:
        raise ValueError(f"evaluation.metrics: at most 256, got {len(msg.metrics)}")
    if not math.isfinite(msg.time):
        raise ValueError(f"evaluation.time: expected a Unix time, got {msg.time}")
    return _attempt(msg, "evaluation"), Evaluation(_text(msg.checkpoint, "evaluation.checkpoint"), msg.step,
                                                   {k[:256]: v for k, v in msg.metrics.items()}, msg.time)


def sync_result_to_proto(r: SyncResult) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(sync_done=agent_pb2.SyncDone(job_id=r.job_id, sync_id=r.sync_id, ok=r.ok,
                                                               message=r.message, bytes=r.bytes, seconds=r.seconds))


def sync_result_from_proto(msg: agent_pb2.SyncDone) -> SyncResult:
    return SyncResult(_text(msg.job_id, "sync_done.job_id", 256), msg.sync_id, msg.ok,
                      printable(msg.message[:MAX_TEXT]), msg.bytes, msg.seconds)


def log_data_to_proto(d: LogData) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(log=agent_pb2.LogData(request_id=d.request_id, data=d.data, eof=d.eof,
                                                        error=d.error))


def summary_to_proto(c: SummaryChunk) -> pb.SummaryData:
    return pb.SummaryData(job_id=c.job_id, task_type=c.task_type, task_index=c.task_index, path=c.path,
                          offset=c.offset, data=c.data)


def summary_from_proto(msg: pb.SummaryData) -> SummaryChunk:
    problem = summaries.path_problem(msg.path)
    if problem:
        raise ValueError(f"summary.path: {problem}")
    if len(msg.data) > summaries.MAX_CHUNK_BYTES:
        raise ValueError(f"summary.data: at most {summaries.MAX_CHUNK_BYTES} bytes, got {len(msg.data)}")
    return SummaryChunk(_text(msg.job_id, "summary.job_id", 256), _text(msg.task_type, "summary.task_type", 32),
                        msg.task_index, msg.path, msg.offset, msg.data)


def log_data_from_proto(msg: agent_pb2.LogData) -> LogData:
    return LogData(msg.request_id, msg.data, msg.eof, msg.error[:MAX_TEXT])


def _probe_target_to_proto(t: ProbeTarget) -> agent_pb2.ProbeTarget:
    return agent_pb2.ProbeTarget(node=t.node, address=t.address, port=t.port, what=t.what)


def _probe_target_from_proto(m: agent_pb2.ProbeTarget) -> ProbeTarget:
    if not 0 < m.port <= 65535:
        raise ValueError(f"probe.target.port: expected 1-65535, got {m.port}")
    return ProbeTarget(_text(m.node, "probe.target.node", 253), _text(m.address, "probe.target.address", 256), m.port,
                       _text(m.what, "probe.target.what", 16))


def probe_answer_to_proto(a: ProbeAnswer) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(probe_answer=agent_pb2.ProbeAnswer(
        probe_id=a.probe_id, port=a.port, error=a.error, agent_time=a.agent_time, interface=a.interface,
        outcomes=[agent_pb2.ProbeOutcome(target=_probe_target_to_proto(o.target), ok=o.ok, error=o.error,
                                         seconds=o.seconds) for o in a.outcomes]))


def probe_answer_from_proto(m: agent_pb2.ProbeAnswer) -> ProbeAnswer:
    """An agent's answer, bounded and made safe to show (a node's own words)."""
    if len(m.outcomes) > MAX_PROBE_TARGETS:
        raise ValueError(f"probe_answer.outcomes: at most {MAX_PROBE_TARGETS}, got {len(m.outcomes)}")
    outcomes = tuple(ProbeOutcome(_probe_target_from_proto(o.target), o.ok, printable(o.error[:MAX_TEXT]), o.seconds)
                     for o in m.outcomes)
    return ProbeAnswer(m.probe_id, m.port if m.port <= 65535 else 0, printable(m.error[:MAX_TEXT]), outcomes,
                       m.agent_time, printable(m.interface[:64]))


def ended_jobs_request(job_ids: list[str]) -> agent_pb2.EndedJobsRequest:
    return agent_pb2.EndedJobsRequest(job_ids=job_ids)


def ended_jobs_request_from_proto(msg: agent_pb2.EndedJobsRequest) -> list[str]:
    if len(msg.job_ids) > MAX_JOB_IDS:
        raise ValueError(f"job_ids: at most {MAX_JOB_IDS}, got {len(msg.job_ids)}")
    return [_text(job_id, "job_ids", 256) for job_id in msg.job_ids]


def ended_jobs_response(job_ids: list[str]) -> agent_pb2.EndedJobsResponse:
    return agent_pb2.EndedJobsResponse(ended_job_ids=job_ids)


def ended_jobs_from_proto(msg: agent_pb2.EndedJobsResponse, asked: list[str]) -> set[str]:
    """The jobs the coordinator says are over, of those asked about (nothing else is ever removed for it)."""
    return set(msg.ended_job_ids) & set(asked)


# ---- coordinator to agent -----------------------------------------------------------------------

def command_to_proto(c: Command) -> agent_pb2.CoordinatorMessage:
    M = agent_pb2.CoordinatorMessage
    if isinstance(c, Launch):
        return M(launch=pb.TaskLaunch(**_attempt_fields(c.attempt), command=c.command, env=c.env, workdir=c.workdir,
                                      port=c.port, stop_grace_seconds=c.stop_grace_seconds,
                                      report_listening=c.report_listening, uid=c.uid, gid=c.gid, owner=c.owner,
                                      memory_bytes=c.memory_bytes, code_sha256=c.code_sha256,
                                      code_sources=c.code_sources, environment=environment_to_proto(c.environment),
                                      stop_signal=c.stop_signal))
    if isinstance(c, Stop):
        return M(stop=agent_pb2.StopTask(**_attempt_fields(c.attempt), grace_seconds=c.grace_seconds))
    if isinstance(c, FinishTraining):
        return M(finish_training=agent_pb2.FinishTraining(**_attempt_fields(c.attempt),
                                                          final_checkpoint=c.final_checkpoint))
    if isinstance(c, ShipCheckpoints):
        return M(ship=agent_pb2.ShipCheckpoints(**_attempt_fields(c.attempt), targets=c.targets,
                                                target_nodes=c.target_nodes))
    if isinstance(c, SyncCheckpoints):
        return M(sync=agent_pb2.SyncCheckpoints(job_id=c.job_id, sync_id=c.sync_id, targets=c.targets,
                                                target_nodes=c.target_nodes))
    if isinstance(c, ExpectFiles):
        return M(expect_files=agent_pb2.ExpectFiles(job_id=c.job_id, sender=c.sender, uid=c.uid, gid=c.gid))
    if isinstance(c, ServeCode):
        return M(serve_code=agent_pb2.ServeCode(job_id=c.job_id, node=c.fetcher))
    if isinstance(c, Revocations):
        return M(revocations=agent_pb2.Revocations(nodes=[agent_pb2.RevokedNode(node=node, issued_before=before)
                                                          for node, before in c.revoked]))
    if isinstance(c, SetPace):
        return M(pace=agent_pb2.Pace(heartbeat_interval_seconds=c.heartbeat_interval_seconds))
    if isinstance(c, ReadLog):
        return M(read_log=agent_pb2.ReadLog(request_id=c.request_id, **_attempt_fields(c.attempt), follow=c.follow,
                                            tail_lines=c.tail_lines, environment=c.environment))
    if isinstance(c, Probe):
        return M(probe=agent_pb2.Probe(probe_id=c.probe_id, listen_seconds=c.listen_seconds,
                                       targets=[_probe_target_to_proto(t) for t in c.targets]))
    return M(cancel_log=agent_pb2.CancelLog(request_id=c.request_id))


def command_from_proto(msg: agent_pb2.CoordinatorMessage, node: str) -> Command | None:
    """The command a message carries (None: a kind this agent does not know, from a newer coordinator)."""
    kind = msg.WhichOneof("kind")
    m = getattr(msg, kind) if kind else None
    if kind == "launch":
        return Launch(node, _attempt(m, "launch"), tuple(m.command), dict(m.env), m.workdir, m.port,
                      m.stop_grace_seconds, m.report_listening, m.uid, m.gid, _text(m.owner, "launch.owner", 256),
                      m.memory_bytes, _text(m.code_sha256, "launch.code_sha256", 80),
                      tuple(_text(s, "launch.code_sources", 300) for s in m.code_sources[:MAX_CODE_SOURCES]),
                      environment_from_proto(m.environment), _stop_signal(m.stop_signal))
    if kind == "stop":
        return Stop(node, _attempt(m, "stop"), m.grace_seconds)
    if kind == "finish_training":
        return FinishTraining(node, _attempt(m, "finish_training"), m.final_checkpoint)
    if kind == "ship":
        return ShipCheckpoints(node, _attempt(m, "ship"), tuple(m.targets), _target_nodes(m))
    if kind == "sync":
        return SyncCheckpoints(node, m.job_id, m.sync_id, tuple(m.targets), _target_nodes(m))
    if kind == "expect_files":
        return ExpectFiles(node, m.job_id, m.sender, m.uid, m.gid)
    if kind == "serve_code":
        if not NODE_NAME_RE.fullmatch(m.node):
            raise ValueError(f"serve_code.node: not a node name: {m.node[:80]!r}")
        return ServeCode(node, _text(m.job_id, "serve_code.job_id", 256), m.node)
    if kind == "revocations":
        return Revocations(node, tuple((r.node, r.issued_before) for r in m.nodes))
    if kind == "probe":
        if len(m.targets) > MAX_PROBE_TARGETS or not 0 <= m.listen_seconds <= MAX_PROBE_LISTEN_SECONDS:
            raise ValueError(f"probe: at most {MAX_PROBE_TARGETS} targets and {MAX_PROBE_LISTEN_SECONDS:g} s of "
                             f"listening, got {len(m.targets)} and {m.listen_seconds!r}")
        return Probe(node, m.probe_id, m.listen_seconds, tuple(_probe_target_from_proto(t) for t in m.targets))
    if kind == "pace":
        if not 0 < m.heartbeat_interval_seconds <= MAX_HEARTBEAT_INTERVAL_SECONDS:
            raise ValueError(f"pace.heartbeat_interval_seconds: expected above 0 and at most "
                             f"{MAX_HEARTBEAT_INTERVAL_SECONDS:g}, got {m.heartbeat_interval_seconds!r}")
        return SetPace(node, m.heartbeat_interval_seconds)
    if kind == "read_log":
        return ReadLog(node, m.request_id, _attempt(m, "read_log"), m.follow, m.tail_lines, m.environment)
    if kind == "cancel_log":
        return CancelLog(node, m.request_id)
    return None


def _stop_signal(name: str) -> str:
    """A launch's stop signal: one a spec may name (from an older coordinator, none: SIGTERM)."""
    if name and name not in STOP_SIGNALS:
        raise ValueError(f"launch.stop_signal: expected one of: {', '.join(STOP_SIGNALS)}, got {name[:20]!r}")
    return name or DEFAULT_STOP_SIGNAL


def _target_nodes(m) -> tuple[str, ...]:
    """The node at each target, when the coordinator names them all (one before 0.3 names none)."""
    if m.target_nodes and len(m.target_nodes) != len(m.targets):
        raise ValueError(f"target_nodes: expected one per target ({len(m.targets)}), got {len(m.target_nodes)}")
    return tuple(m.target_nodes)


# ---- job specs ----------------------------------------------------------------------------------

def spec_to_proto(spec: JobSpec) -> pb.JobSpec:
    msg = pb.JobSpec(name=spec.name, strategy=spec.strategy, command=spec.command, workdir=spec.workdir,
                     checkpoint_dir=spec.checkpoint_dir, model_dir=spec.model_dir, env=spec.env, gpus=spec.gpus,
                     stop_grace_seconds=spec.stop_grace_seconds,
                     evaluator_deadline_seconds=spec.evaluator_deadline_seconds, priority=spec.priority,
                     memory_bytes=spec.memory, code_sha256=spec.code_sha256, shared_workdir=spec.shared_workdir,
                     environment=environment_to_proto(spec.environment), stop_signal=spec.stop_signal,
                     resize_interval_seconds=spec.resize_interval_seconds)
    for role_type, role in spec.roles.items():
        msg.roles[role_type].CopyFrom(pb.RoleSpec(count=role.count, gpus=role.gpus, command=role.command,
                                                  env=role.env, nodes=role.nodes, labels=role.labels,
                                                  entrypoint=role.entrypoint,
                                                  summary_dir=role.summary_dir, memory_bytes=role.memory,
                                                  min_count=role.min_count, max_count=role.max_count))
    r = spec.restart
    msg.restart.CopyFrom(pb.RestartPolicy(max_restarts=r.max_restarts, backoff_seconds=r.backoff_seconds,
                                          permanent_exit_codes=r.permanent_exit_codes, hang_seconds=r.hang_seconds))
    return msg


def spec_from_proto(msg: pb.JobSpec) -> JobSpec:
    """A spec from the wire, validated by the same rules as a file (SpecError names the field). Its paths
    must be absolute: the client resolved them where the spec was written."""
    roles = {t: RoleSpec(count=r.count, gpus=r.gpus if r.HasField("gpus") else None, command=tuple(r.command),
                         env=dict(r.env), nodes=tuple(r.nodes), labels=tuple(r.labels), entrypoint=r.entrypoint,
                         summary_dir=r.summary_dir,
                         memory=r.memory_bytes if r.HasField("memory_bytes") else None,
                         min_count=r.min_count, max_count=r.max_count)
             for t, r in msg.roles.items()}
    if CHIEF not in roles and WORKER not in roles:
        roles[WORKER] = RoleSpec(count=1)  # as in a file: the plain case is one training task
    restart = RestartPolicy()
    if msg.HasField("restart"):
        r = msg.restart
        restart = RestartPolicy(r.max_restarts, r.backoff_seconds, tuple(r.permanent_exit_codes), r.hang_seconds)
    optional = {k: getattr(msg, k) for k in ("stop_grace_seconds", "evaluator_deadline_seconds", "resize_interval_seconds")
                if msg.HasField(k)}
    spec = JobSpec(name=msg.name, strategy=msg.strategy, command=tuple(msg.command), workdir=msg.workdir,
                   checkpoint_dir=msg.checkpoint_dir, model_dir=msg.model_dir, env=dict(msg.env), gpus=msg.gpus,
                   roles=roles, restart=restart, priority=msg.priority, memory=msg.memory_bytes,
                   code_sha256=msg.code_sha256, shared_workdir=msg.shared_workdir,
                   environment=EnvironmentSpec(msg.environment.requirements, msg.environment.isolated,
                                               msg.environment.project),
                   stop_signal=msg.stop_signal or DEFAULT_STOP_SIGNAL, **optional)
    return validate(spec, "spec", absolute_paths=True)


# ---- sweeps ---------------------------------------------------------------------------------------

def sweep_spec_to_proto(sweep: SweepSpec) -> control_pb2.SweepSpec:
    return control_pb2.SweepSpec(
        method=sweep.method, metric=sweep.metric, goal=sweep.goal, max_concurrent=sweep.max_concurrent,
        trials=sweep.trials, seed=sweep.seed, early_stopping=sweep.early_stopping,
        min_evaluations=sweep.min_evaluations, grace_steps=sweep.grace_steps,
        reduction_factor=sweep.reduction_factor,
        parameters=[control_pb2.SweepParameter(name=n, values=v) for n, v in sweep.parameters.items()])


def sweep_spec_from_proto(msg: control_pb2.SweepSpec) -> SweepSpec:
    """A sweep from the wire, validated by the same rules as a file's [sweep] table (SpecError names the field)."""
    parameters = {p.name: tuple(p.values) for p in msg.parameters}
    if len(parameters) != len(msg.parameters):
        raise SpecError("spec", "sweep.parameters", "a parameter is named twice")
    return validate_sweep(SweepSpec(method=msg.method, metric=msg.metric, parameters=parameters, goal=msg.goal,
                                    max_concurrent=msg.max_concurrent, trials=msg.trials, seed=msg.seed,
                                    early_stopping=msg.early_stopping, min_evaluations=msg.min_evaluations,
                                    grace_steps=msg.grace_steps,
                                    reduction_factor=msg.reduction_factor or DEFAULT_REDUCTION_FACTOR), "spec")


def sweep_status(sweep, trials: list[dict[str, Any]] = ()) -> control_pb2.SweepStatus:
    """A coordinator's sweep as its status; trials: each trial's SweepTrial fields (none in a list of sweeps)."""
    return control_pb2.SweepStatus(id=sweep.id, name=sweep.spec.name, owner=sweep.owner, state=sweep.state.value,
                                   sweep=sweep_spec_to_proto(sweep.sweep), created=sweep.created,
                                   finished=sweep.finished, message=sweep.message,
                                   trials=[control_pb2.SweepTrial(**t) for t in trials])


# ---- status: the coordinator's records as messages ----------------------------------------------
# (Job, Task and Node are the coordinator's records, read by attribute: the agent, which imports this
# module too, imports nothing of the coordinator.)

def _seconds(value: float) -> float:
    """A duration an agent measured: never negative, infinite or NaN."""
    return max(0.0, value) if math.isfinite(value) else 0.0


def node_status(node, running_tasks: int, now: float, memory_allocated: int = 0,
                drain_state: str = "") -> control_pb2.NodeStatus:
    """drain_state: DRAINING or DRAINED while the node is drained (Nodes.drain_state)."""
    i = node.info
    status = control_pb2.NodeStatus(
        name=i.name, address=i.address, state=node.state.value, gpus=[gpu_to_proto(g) for g in i.gpus],
        hostname=i.hostname, cpu_count=i.cpu_count, memory_bytes=i.memory_bytes, agent_version=i.agent_version,
        last_seen_seconds_ago=max(0.0, now - node.seen.last_seen), port_range_start=i.port_range[0],
        port_range_end=i.port_range[1], running_tasks=running_tasks, condition=node.condition,
        memory_allocated_bytes=memory_allocated, conditions=conditions_to_proto(node.seen.conditions),
        labels=i.labels, gpu_driver=i.gpu_driver, cuda_version=i.cuda_version)
    if node.drain is not None:
        d = node.drain
        status.drain.CopyFrom(control_pb2.NodeDrain(reason=d.reason, by=d.by, since=d.since, state=drain_state))
    return status


def _exit_fields(target, exit: TaskExit | None) -> None:
    if exit is not None and exit.exit_code is not None:
        target.exit_code = exit.exit_code
    if exit is not None and exit.signal is not None:
        target.signal = exit.signal


def job_status(job, usage=None, queue_position: int = 0) -> control_pb2.JobStatus:
    """A coordinator's job as its status; usage: what it used up to now (accounting.job_usage), else what its
    ended attempts used; queue_position: its place in the queue while PENDING (0: not known here)."""
    message = job.message
    f = job.last_failure
    if f is not None and f.describe() not in message:
        message = f"{message}; last failure: {f.describe()}" if message else f"last failure: {f.describe()}"
    status = control_pb2.JobStatus(id=job.id, name=job.spec.name, state=job.state.value, strategy=job.strategy,
                                   restarts=job.restarts, message=message, created=job.created,
                                   finished=job.finished, evaluator_restarts=job.evaluator_restarts,
                                   preemptions=job.preemptions, uid=job.uid, owner=job.owner,
                                   priority=job.priority, queue_position=queue_position, rank=job.rank,
                                   waiting_since=max(job.created, job.not_before) if job.state == JobState.PENDING
                                   else 0, preempted_by=job.preempted_by,
                                   preempted_by_owner=job.preempted_by_owner, preempted_at=job.preempted_at,
                                   sweep=job.sweep, sweep_parameters=job.sweep_parameters)
    role = job.spec.role(WORKER)
    if role.elastic:
        status.workers.CopyFrom(control_pb2.WorkerRange(min=role.min_count, max=role.max_count, current=role.count,
                                                        resizes=job.resizes))
    usage = usage or job.usage
    status.gpu_seconds, status.cpu_seconds = usage.gpu_seconds, usage.cpu_seconds
    status.peak_rss_bytes = usage.peak_rss_bytes
    for t in job.tasks:
        task = status.tasks.add(type=t.type, index=t.index, node=t.node, address=t.address,
                                gpus=[gpu_to_proto(g) for g in t.gpus], state=t.state.value, pid=t.pid,
                                attempt=t.attempt, message=t.message)
        _exit_fields(task, t.exit)
    for e in job.evaluations:
        status.evaluations.add(checkpoint=e.checkpoint, step=e.step, metrics=e.metrics, time=e.time)
    if job.evaluations:
        status.last_evaluation.CopyFrom(status.evaluations[-1])
    if f is not None:
        status.last_failure.CopyFrom(control_pb2.Failure(task=f.task, node=f.node, message=f.exit.message,
                                                         log_tail=f.exit.log_tail, time=f.time,
                                                         description=f.describe()))
        _exit_fields(status.last_failure, f.exit)
    return status


def plan_response(plan, commands: dict[tuple[str, int], tuple[str, ...]]) -> control_pb2.PlanJobResponse:
    response = control_pb2.PlanJobResponse(fits=plan.placement is not None, reason=plan.reason,
                                           strategy=plan.strategy)
    for p in plan.placement or []:
        response.tasks.add(task_type=p.type, task_index=p.index, node=p.node, address=p.address,
                           gpus=[gpu_to_proto(g) for g in p.gpus], tf_config=plan.tf_configs[(p.type, p.index)],
                           command=commands[(p.type, p.index)], env_names=sorted(plan.spec.env_for(p.type)))
    return response


def usage_response(users: dict[str, Any], groups: dict[str, Any], since: float, until: float,
                   horizon_seconds: float) -> control_pb2.GetUsageResponse:
    """accounting.Totals per user and per group as the reply of GetUsage, most GPU-seconds first."""
    response = control_pb2.GetUsageResponse(since=since, until=until, horizon_seconds=horizon_seconds)
    for target, totals in ((response.users, users), (response.groups, groups)):
        for name, t in sorted(totals.items(), key=lambda kv: (-kv[1].gpu_seconds, kv[0])):
            target.add(name=name, gpu_seconds=t.gpu_seconds, cpu_seconds=t.cpu_seconds,
                       peak_rss_bytes=t.peak_rss_bytes, jobs=t.jobs)
    return response


# ---- the queue and the policy ------------------------------------------------------------------

WAITING_TO_BE_TRIED = "waiting to be placed"


def queued_job(job, position: int, now: float) -> control_pb2.QueuedJob:
    """One PENDING job of the coordinator's queue, as GetQueue lists it."""
    # Only the scheduler's own words: every reader sees the queue, and a job's other messages (how its last
    # attempt ended) are for those who may read the job.
    reason = job.message if job.message.startswith("waiting") else WAITING_TO_BE_TRIED
    if job.not_before > now:
        reason = f"restarting: not placed again for {job.not_before - now:.0f} s (backoff)"
    return control_pb2.QueuedJob(position=position, id=job.id, name=job.spec.name, owner=job.owner,
                                 priority=job.priority, rank=job.rank, tasks=len(job.tasks),
                                 gpus=sum(job.spec.gpus_for(t.type) for t in job.tasks), reason=reason,
                                 waiting_since=max(job.created, job.not_before), not_before=job.not_before)


def policy_response(policy) -> control_pb2.GetPolicyResponse:
    return control_pb2.GetPolicyResponse(text=policy.text, source=policy.source, loaded_at=policy.loaded_at)


def diagnose_response(checks) -> control_pb2.DiagnoseResponse:
    """`tfcluster doctor`'s checks (core/diagnosis.py's Check: name, subject, level, message, fix)."""
    return control_pb2.DiagnoseResponse(checks=[control_pb2.Check(name=c.name, subject=c.subject, level=c.level,
                                                                  message=c.message, fix=c.fix) for c in checks])
