"""What the coordinator tells agents: each Command as a CoordinatorMessage, and back."""

from __future__ import annotations

from tfcluster.api.v1 import agent_pb2
from tfcluster.api.v1 import types_pb2 as pb
from tfcluster.commands import (CancelLog, Command, ExpectFiles, FinishTraining, Launch, Probe, ReadLog, Revocations,
                                ServeCode, SetPace, ShipCheckpoints, Stop, SyncCheckpoints)
from tfcluster.model import DEFAULT_STOP_SIGNAL, STOP_SIGNALS
from tfcluster.model import MAX_CODE_SOURCES, NODE_NAME_RE
from tfcluster.wire.fields import (MAX_HEARTBEAT_INTERVAL_SECONDS, MAX_PROBE_LISTEN_SECONDS, MAX_PROBE_TARGETS,
                                   attempt_fields, attempt_from, checked_text)
from tfcluster.wire.nodes import (environment_from_proto, environment_to_proto, probe_target_from_proto,
                                  probe_target_to_proto)

# ---- coordinator to agent -----------------------------------------------------------------------

def command_to_proto(c: Command) -> agent_pb2.CoordinatorMessage:
    M = agent_pb2.CoordinatorMessage
    if isinstance(c, Launch):
        return M(launch=pb.TaskLaunch(**attempt_fields(c.attempt), command=c.command, env=c.env, workdir=c.workdir,
                                      port=c.port, stop_grace_seconds=c.stop_grace_seconds,
                                      report_listening=c.report_listening, uid=c.uid, gid=c.gid, owner=c.owner,
                                      memory_bytes=c.memory_bytes, code_sha256=c.code_sha256,
                                      code_sources=c.code_sources, environment=environment_to_proto(c.environment),
                                      stop_signal=c.stop_signal))
    if isinstance(c, Stop):
        return M(stop=agent_pb2.StopTask(**attempt_fields(c.attempt), grace_seconds=c.grace_seconds))
    if isinstance(c, FinishTraining):
        return M(finish_training=agent_pb2.FinishTraining(**attempt_fields(c.attempt),
                                                          final_checkpoint=c.final_checkpoint))
    if isinstance(c, ShipCheckpoints):
        return M(ship=agent_pb2.ShipCheckpoints(**attempt_fields(c.attempt), targets=c.targets,
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
        return M(read_log=agent_pb2.ReadLog(request_id=c.request_id, **attempt_fields(c.attempt), follow=c.follow,
                                            tail_lines=c.tail_lines, environment=c.environment))
    if isinstance(c, Probe):
        return M(probe=agent_pb2.Probe(probe_id=c.probe_id, listen_seconds=c.listen_seconds,
                                       targets=[probe_target_to_proto(t) for t in c.targets]))
    return M(cancel_log=agent_pb2.CancelLog(request_id=c.request_id))


def command_from_proto(msg: agent_pb2.CoordinatorMessage, node: str) -> Command | None:
    """The command a message carries (None: a kind this agent does not know, from a newer coordinator)."""
    kind = msg.WhichOneof("kind")
    m = getattr(msg, kind) if kind else None
    if kind == "launch":
        return Launch(node, attempt_from(m, "launch"), tuple(m.command), dict(m.env), m.workdir, m.port,
                      m.stop_grace_seconds, m.report_listening, m.uid, m.gid, checked_text(m.owner, "launch.owner", 256),
                      m.memory_bytes, checked_text(m.code_sha256, "launch.code_sha256", 80),
                      tuple(checked_text(s, "launch.code_sources", 300) for s in m.code_sources[:MAX_CODE_SOURCES]),
                      environment_from_proto(m.environment), _stop_signal(m.stop_signal))
    if kind == "stop":
        return Stop(node, attempt_from(m, "stop"), m.grace_seconds)
    if kind == "finish_training":
        return FinishTraining(node, attempt_from(m, "finish_training"), m.final_checkpoint)
    if kind == "ship":
        return ShipCheckpoints(node, attempt_from(m, "ship"), tuple(m.targets), _target_nodes(m))
    if kind == "sync":
        return SyncCheckpoints(node, m.job_id, m.sync_id, tuple(m.targets), _target_nodes(m))
    if kind == "expect_files":
        return ExpectFiles(node, m.job_id, m.sender, m.uid, m.gid)
    if kind == "serve_code":
        if not NODE_NAME_RE.fullmatch(m.node):
            raise ValueError(f"serve_code.node: not a node name: {m.node[:80]!r}")
        return ServeCode(node, checked_text(m.job_id, "serve_code.job_id", 256), m.node)
    if kind == "revocations":
        return Revocations(node, tuple((r.node, r.issued_before) for r in m.nodes))
    if kind == "probe":
        if len(m.targets) > MAX_PROBE_TARGETS or not 0 <= m.listen_seconds <= MAX_PROBE_LISTEN_SECONDS:
            raise ValueError(f"probe: at most {MAX_PROBE_TARGETS} targets and {MAX_PROBE_LISTEN_SECONDS:g} s of "
                             f"listening, got {len(m.targets)} and {m.listen_seconds!r}")
        return Probe(node, m.probe_id, m.listen_seconds, tuple(probe_target_from_proto(t) for t in m.targets))
    if kind == "pace":
        if not 0 < m.heartbeat_interval_seconds <= MAX_HEARTBEAT_INTERVAL_SECONDS:
            raise ValueError(f"pace.heartbeat_interval_seconds: expected above 0 and at most "
                             f"{MAX_HEARTBEAT_INTERVAL_SECONDS:g}, got {m.heartbeat_interval_seconds!r}")
        return SetPace(node, m.heartbeat_interval_seconds)
    if kind == "read_log":
        return ReadLog(node, m.request_id, attempt_from(m, "read_log"), m.follow, m.tail_lines, m.environment)
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
