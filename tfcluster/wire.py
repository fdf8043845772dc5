"""Conversions between the pure core's dataclasses and the wire messages (tfcluster.api.v1)."""

from __future__ import annotations

from typing import Any

from tfcluster.api.v1 import types_pb2 as pb
from tfcluster.daemon.coordinator.scheduler import Gpu
from tfcluster.spec import JobSpec, parse_spec

PHASE_NAMES = {pb.TASK_PHASE_RUNNING: "RUNNING", pb.TASK_PHASE_EXITED: "EXITED",
               pb.TASK_PHASE_FAILED_TO_START: "FAILED_TO_START"}


def spec_to_proto(spec: JobSpec) -> pb.JobSpec:
    msg = pb.JobSpec(name=spec.name, strategy=spec.strategy, command=list(spec.command), workdir=spec.workdir,
                     checkpoint_dir=spec.checkpoint_dir, model_dir=spec.model_dir, env=spec.env, gpus=spec.gpus,
                     stop_grace_seconds=spec.stop_grace_seconds,
                     evaluator_deadline_seconds=spec.evaluator_deadline_seconds)
    for role_type, role in spec.roles.items():
        r = msg.roles[role_type]
        r.count = role.count
        if role.gpus is not None:
            r.gpus = role.gpus
        r.command.extend(role.command)
        r.env.update(role.env)
        r.nodes.extend(role.nodes)
        r.entrypoint = role.entrypoint
    msg.restart.max_restarts = spec.restart.max_restarts
    msg.restart.backoff_seconds = spec.restart.backoff_seconds
    msg.restart.permanent_exit_codes.extend(spec.restart.permanent_exit_codes)
    msg.restart.hang_seconds = spec.restart.hang_seconds
    return msg


def spec_from_proto(msg: pb.JobSpec) -> JobSpec:
    """Validates a spec that came over the wire with the same rules as a file (SpecError names the field)."""
    data: dict[str, Any] = {"name": msg.name, "strategy": msg.strategy, "gpus": msg.gpus,
                            "workdir": msg.workdir, "checkpoint_dir": msg.checkpoint_dir, "model_dir": msg.model_dir,
                            "env": dict(msg.env)}
    if not msg.name:
        del data["name"]
    if not msg.strategy:
        del data["strategy"]
    if msg.command:
        data["command"] = list(msg.command)
    if msg.HasField("stop_grace_seconds"):
        data["stop_grace_seconds"] = msg.stop_grace_seconds
    if msg.HasField("evaluator_deadline_seconds"):
        data["evaluator_deadline_seconds"] = msg.evaluator_deadline_seconds
    roles = {}
    for role_type, r in msg.roles.items():
        role: dict[str, Any] = {"count": r.count, "env": dict(r.env)}
        if r.HasField("gpus"):
            role["gpus"] = r.gpus
        if r.command:
            role["command"] = list(r.command)
        if r.nodes:
            role["nodes"] = list(r.nodes)
        if r.entrypoint:
            role["entrypoint"] = r.entrypoint
        roles[role_type] = role
    data["roles"] = roles
    if msg.HasField("restart"):
        data["restart"] = {"max_restarts": msg.restart.max_restarts, "backoff_seconds": msg.restart.backoff_seconds,
                           "permanent_exit_codes": list(msg.restart.permanent_exit_codes),
                           "hang_seconds": msg.restart.hang_seconds}
    return parse_spec(data, source="spec")


def gpu_to_proto(gpu: Gpu) -> pb.Gpu:
    return pb.Gpu(index=gpu.index, uuid=gpu.uuid, name=gpu.name, memory_mib=gpu.memory_mib)


def gpu_from_proto(msg: pb.Gpu) -> Gpu:
    return Gpu(index=msg.index, uuid=msg.uuid, name=msg.name, memory_mib=msg.memory_mib)


def gpu_to_dict(gpu: Gpu) -> dict[str, Any]:
    return {"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "memory_mib": gpu.memory_mib}
