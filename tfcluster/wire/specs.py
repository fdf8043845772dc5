"""Job specs and sweeps, both ways (what a client submits is checked by the same rules as a spec file)."""

from __future__ import annotations

from typing import Any

from tfcluster.api.v1 import control_pb2
from tfcluster.api.v1 import types_pb2 as pb
from tfcluster.model import CHIEF, DEFAULT_STOP_SIGNAL, WORKER, EnvironmentSpec
from tfcluster.spec import JobSpec, RestartPolicy, RoleSpec, SpecError, validate
from tfcluster.sweepspec import DEFAULT_REDUCTION_FACTOR, SweepSpec, validate_sweep
from tfcluster.wire.nodes import environment_to_proto

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
