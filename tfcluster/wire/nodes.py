"""Nodes, their GPUs, and what agents send the coordinator: registrations, heartbeats, task reports, results,
logs, summaries, probe answers."""

from __future__ import annotations

import ipaddress
import math
import os
import posixpath
from collections.abc import Sequence

from tfcluster import summaries
from tfcluster.api.v1 import agent_pb2
from tfcluster.api.v1 import types_pb2 as pb
from tfcluster.commands import LogData, ProbeAnswer, ProbeOutcome, ProbeTarget
from tfcluster.conditions import MAX_CONDITION_MESSAGE, MAX_CONDITIONS, NodeCondition
from tfcluster.labels import label_problem
from tfcluster.model import (MAX_DRAIN_REASON, MAX_GPUS_PER_NODE, NODE_NAME_RE, Attempt, EnvironmentSpec, Evaluation,
                             Gpu, NodeInfo, SyncResult, TaskExit, TaskProgress, TaskReport, printable)
from tfcluster.states import Phase
from tfcluster.summaries import SummaryChunk
from tfcluster.wire.fields import (MAX_JOB_IDS, MAX_LOG_TAIL_LINES, MAX_PROBE_TARGETS, MAX_TASKS_PER_NODE, MAX_TEXT,
                                   PHASES, PHASE_NAMES, attempt_fields, attempt_from, checked_text, measured_seconds)

# ---- nodes and GPUs -----------------------------------------------------------------------------

def gpu_to_proto(gpu: Gpu) -> pb.Gpu:
    return pb.Gpu(index=gpu.index, uuid=gpu.uuid, name=gpu.name, memory_mib=gpu.memory_mib)


def gpu_from_proto(msg: pb.Gpu) -> Gpu:
    return Gpu(index=msg.index, uuid=checked_text(msg.uuid, "gpu.uuid", 256), name=checked_text(msg.name, "gpu.name", 256),
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
                    gpus=tuple(gpu_from_proto(g) for g in msg.gpus), hostname=checked_text(msg.hostname, "node.hostname", 253),
                    cpu_count=msg.cpu_count, memory_bytes=msg.memory_bytes,
                    agent_version=checked_text(msg.agent_version, "node.agent_version", 64),
                    state_dir=checked_text(msg.state_dir, "node.state_dir"), peer_port=msg.peer_port,
                    labels=tuple(msg.labels), gpu_driver=checked_text(msg.gpu_driver, "node.gpu_driver", 64),
                    cuda_version=checked_text(msg.cuda_version, "node.cuda_version", 16))


# ---- agent to coordinator -----------------------------------------------------------------------

def task_report_to_proto(r: TaskReport) -> pb.TaskReport:
    msg = pb.TaskReport(**attempt_fields(r.attempt), phase=PHASES[r.phase], pid=r.pid, listening=r.listening)
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
                        busy_port=msg.busy_port, final_checkpoint=checked_text(msg.final_checkpoint, "task.final_checkpoint"),
                        cpu_seconds=measured_seconds(msg.cpu_seconds),
                        peak_rss_bytes=msg.peak_rss_bytes, permanent=msg.permanent and phase == Phase.FAILED_TO_START)
    return TaskReport(attempt_from(msg, "task"), phase, pid=msg.pid, listening=msg.listening, exit=exit)


def heartbeat_to_proto(session_id: str, progress: list[TaskProgress], condition: str = "",
                       health_failure: str = "", conditions: Sequence[NodeCondition] = ()) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(
        session_id=session_id, condition=condition, health_failure=health_failure,
        conditions=conditions_to_proto(conditions), progress=[
        agent_pb2.TaskProgress(**attempt_fields(p.attempt), output_bytes=p.output_bytes, checkpoint=p.checkpoint,
                               cpu_seconds=p.cpu_seconds, rss_bytes=p.rss_bytes, peak_rss_bytes=p.peak_rss_bytes,
                               phase_detail=p.phase_detail, gpu_utilization=p.gpu_utilization)
        for p in progress]))


def environment_to_proto(e: EnvironmentSpec) -> pb.EnvironmentSpec:
    return pb.EnvironmentSpec(requirements=e.requirements, isolated=e.isolated, project=e.project)


def environment_from_proto(msg: pb.EnvironmentSpec) -> EnvironmentSpec:
    """Paths inside the workdir only: the agent reads these files as root."""
    for name in ("requirements", "project"):
        value = checked_text(getattr(msg, name), f"environment.{name}", 1024)
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
    return [TaskProgress(attempt_from(p, "progress"), p.output_bytes, p.checkpoint[:MAX_TEXT],
                         cpu_seconds=measured_seconds(p.cpu_seconds), rss_bytes=p.rss_bytes,
                         peak_rss_bytes=p.peak_rss_bytes, phase_detail=printable(p.phase_detail[:MAX_TEXT]),
                         gpu_utilization=_ratio(p.gpu_utilization) if p.HasField("gpu_utilization") else None)
            for p in msg.progress]


def _ratio(value: float) -> float | None:
    """A utilisation an agent read: 0 to 1, or None when it is not a number."""
    return min(1.0, max(0.0, value)) if math.isfinite(value) else None


def evaluation_to_proto(attempt: Attempt, e: Evaluation) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(evaluation=pb.Evaluation(**attempt_fields(attempt), checkpoint=e.checkpoint,
                                                           step=e.step, metrics=e.metrics, time=e.time))


def evaluation_from_proto(msg: pb.Evaluation) -> tuple[Attempt, Evaluation]:
    if len(msg.metrics) > 256:
        raise ValueError(f"evaluation.metrics: at most 256, got {len(msg.metrics)}")
    if not math.isfinite(msg.time):
        raise ValueError(f"evaluation.time: expected a Unix time, got {msg.time}")
    return attempt_from(msg, "evaluation"), Evaluation(checked_text(msg.checkpoint, "evaluation.checkpoint"), msg.step,
                                                   {k[:256]: v for k, v in msg.metrics.items()}, msg.time)


def sync_result_to_proto(r: SyncResult) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(sync_done=agent_pb2.SyncDone(job_id=r.job_id, sync_id=r.sync_id, ok=r.ok,
                                                               message=r.message, bytes=r.bytes, seconds=r.seconds))


def sync_result_from_proto(msg: agent_pb2.SyncDone) -> SyncResult:
    return SyncResult(checked_text(msg.job_id, "sync_done.job_id", 256), msg.sync_id, msg.ok,
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
    return SummaryChunk(checked_text(msg.job_id, "summary.job_id", 256), checked_text(msg.task_type, "summary.task_type", 32),
                        msg.task_index, msg.path, msg.offset, msg.data)


def log_data_from_proto(msg: agent_pb2.LogData) -> LogData:
    return LogData(msg.request_id, msg.data, msg.eof, msg.error[:MAX_TEXT])


def probe_target_to_proto(t: ProbeTarget) -> agent_pb2.ProbeTarget:
    return agent_pb2.ProbeTarget(node=t.node, address=t.address, port=t.port, what=t.what)


def probe_target_from_proto(m: agent_pb2.ProbeTarget) -> ProbeTarget:
    if not 0 < m.port <= 65535:
        raise ValueError(f"probe.target.port: expected 1-65535, got {m.port}")
    return ProbeTarget(checked_text(m.node, "probe.target.node", 253), checked_text(m.address, "probe.target.address", 256), m.port,
                       checked_text(m.what, "probe.target.what", 16))


def probe_answer_to_proto(a: ProbeAnswer) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(probe_answer=agent_pb2.ProbeAnswer(
        probe_id=a.probe_id, port=a.port, error=a.error, agent_time=a.agent_time, interface=a.interface,
        outcomes=[agent_pb2.ProbeOutcome(target=probe_target_to_proto(o.target), ok=o.ok, error=o.error,
                                         seconds=o.seconds) for o in a.outcomes]))


def probe_answer_from_proto(m: agent_pb2.ProbeAnswer) -> ProbeAnswer:
    """An agent's answer, bounded and made safe to show (a node's own words)."""
    if len(m.outcomes) > MAX_PROBE_TARGETS:
        raise ValueError(f"probe_answer.outcomes: at most {MAX_PROBE_TARGETS}, got {len(m.outcomes)}")
    outcomes = tuple(ProbeOutcome(probe_target_from_proto(o.target), o.ok, printable(o.error[:MAX_TEXT]), o.seconds)
                     for o in m.outcomes)
    return ProbeAnswer(m.probe_id, m.port if m.port <= 65535 else 0, printable(m.error[:MAX_TEXT]), outcomes,
                       m.agent_time, printable(m.interface[:64]))


def ended_jobs_request(job_ids: list[str]) -> agent_pb2.EndedJobsRequest:
    return agent_pb2.EndedJobsRequest(job_ids=job_ids)


def ended_jobs_request_from_proto(msg: agent_pb2.EndedJobsRequest) -> list[str]:
    if len(msg.job_ids) > MAX_JOB_IDS:
        raise ValueError(f"job_ids: at most {MAX_JOB_IDS}, got {len(msg.job_ids)}")
    return [checked_text(job_id, "job_ids", 256) for job_id in msg.job_ids]


def ended_jobs_response(job_ids: list[str]) -> agent_pb2.EndedJobsResponse:
    return agent_pb2.EndedJobsResponse(ended_job_ids=job_ids)


def ended_jobs_from_proto(msg: agent_pb2.EndedJobsResponse, asked: list[str]) -> set[str]:
    """The jobs the coordinator says are over, of those asked about (nothing else is ever removed for it)."""
    return set(msg.ended_job_ids) & set(asked)
