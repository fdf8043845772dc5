"""What the coordinator answers, as typed values for the Python API (cluster.py): each class is the twin of one
status message of the wire (tfcluster.api.v1.control), with the same field names; a field the message may leave
unset (an exit code, a drain, a last failure) is None when it is.

The conversion is read-only and generic (read from the dataclasses' own field types), kept here rather than in
wire/, whose checks and spec conversions `tfcluster status` must start without. The top-level values keep
the message they were read from (`wire`, out of repr and comparisons): the CLI renders it with render.py and
views.py, as the dashboard renders its own, so that every view of a status is drawn from one message.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any, Optional

from tfcluster.model import Gpu  # the GPU a node reports: index, uuid, name, memory_mib

WIRE = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class TaskStatus:
    type: str
    index: int
    node: str
    address: str
    gpus: list[Gpu]
    state: str
    pid: int
    exit_code: Optional[int]
    signal: Optional[int]
    attempt: int
    message: str

    @property
    def name(self) -> str:
        """`chief:0`, `worker:1`: how `logs` names the task."""
        return f"{self.type}:{self.index}"


@dataclass(frozen=True)
class EvaluationResult:
    checkpoint: str
    step: int
    metrics: dict[str, float]
    time: float


@dataclass(frozen=True)
class Failure:
    task: str
    node: str
    exit_code: Optional[int]
    signal: Optional[int]
    message: str
    log_tail: list[str]
    time: float
    description: str


@dataclass(frozen=True)
class WorkerRange:
    min: int
    max: int
    current: int
    resizes: int


@dataclass(frozen=True)
class JobStatus:
    id: str
    name: str
    state: str  # a states.JobState value
    strategy: str
    restarts: int
    tasks: list[TaskStatus]
    message: str
    created: float
    finished: float
    evaluations: list[EvaluationResult]
    last_failure: Optional[Failure]
    evaluator_restarts: int
    preemptions: int
    uid: int
    owner: str
    priority: str
    gpu_seconds: float
    cpu_seconds: float
    peak_rss_bytes: int
    queue_position: int
    waiting_since: float
    preempted_by: str
    preempted_by_owner: str
    preempted_at: float
    sweep: str                     # the sweep it is a trial of; "": none
    sweep_parameters: dict[str, str]
    workers: Optional[WorkerRange]  # an elastic job's sizes; None: a fixed worker count
    wire: Any = WIRE

    @property
    def last_evaluation(self) -> Optional[EvaluationResult]:
        return self.evaluations[-1] if self.evaluations else None


@dataclass(frozen=True)
class NodeDrain:
    reason: str
    by: str
    since: float
    state: str


@dataclass(frozen=True)
class NodeCondition:
    gpu: Optional[int]  # None: the node as a whole
    kind: str  # tfcluster/conditions.py
    message: str
    since: float


@dataclass(frozen=True)
class NodeStatus:
    name: str
    address: str
    state: str  # a states.NodeState value
    gpus: list[Gpu]
    hostname: str
    cpu_count: int
    memory_bytes: int
    memory_allocated_bytes: int
    agent_version: str
    last_seen_seconds_ago: float
    running_tasks: int
    condition: str
    drain: Optional[NodeDrain]
    conditions: list[NodeCondition]
    labels: list[str]  # the kinds of machine it is (`tfcluster agent --label`)
    gpu_driver: str  # the NVIDIA driver's version; "": none read
    cuda_version: str  # the newest CUDA that driver supports
    wire: Any = WIRE


@dataclass(frozen=True)
class ClusterSummary:
    nodes_by_state: dict[str, int]
    gpus_total: int
    gpus_allocated: int
    jobs_by_state: dict[str, int]
    insecure: bool
    dashboard_port: int
    leader: str
    wire: Any = WIRE


@dataclass(frozen=True)
class ClusterStatus:
    """The nodes and jobs one status call shows; summary is None for one job's status."""
    nodes: list[NodeStatus]
    jobs: list[JobStatus]
    summary: Optional[ClusterSummary]


@dataclass(frozen=True)
class PlannedTask:
    task_type: str
    task_index: int
    node: str
    address: str
    gpus: list[Gpu]
    tf_config: str
    command: list[str]
    env_names: list[str]


@dataclass(frozen=True)
class Plan:
    fits: bool
    reason: str
    strategy: str
    tasks: list[PlannedTask]
    wire: Any = WIRE


@dataclass(frozen=True)
class QueuedJob:
    position: int
    id: str
    name: str
    owner: str
    priority: str
    tasks: int
    gpus: int
    reason: str
    waiting_since: float


@dataclass(frozen=True)
class Queue:
    jobs: list[QueuedJob]
    total: int
    wire: Any = WIRE


@dataclass(frozen=True)
class UsageTotals:
    name: str
    gpu_seconds: float
    cpu_seconds: float
    peak_rss_bytes: int
    jobs: int


@dataclass(frozen=True)
class Usage:
    users: list[UsageTotals]
    groups: list[UsageTotals]
    since: float
    until: float
    horizon_seconds: float
    wire: Any = WIRE


@dataclass(frozen=True)
class Policy:
    text: str
    source: str
    loaded_at: float
    wire: Any = WIRE


@dataclass(frozen=True)
class Check:
    name: str
    subject: str
    level: str  # ok, warn or fail
    message: str
    fix: str


@dataclass(frozen=True)
class SweepParameter:
    name: str
    values: list[str]


@dataclass(frozen=True)
class SweepSettings:
    """A sweep's [sweep] table, as the coordinator keeps it."""
    method: str
    parameters: list[SweepParameter]
    metric: str
    goal: str
    max_concurrent: int
    trials: int
    seed: int
    early_stopping: str
    min_evaluations: int


@dataclass(frozen=True)
class SweepTrial:
    index: int
    job_id: str                    # "": not submitted yet
    parameters: dict[str, str]
    state: str                     # its job's; "": not submitted yet
    best: Optional[float]          # its best value of the metric; None: none reported
    best_step: int
    stopped_early: bool
    message: str


@dataclass(frozen=True)
class SweepStatus:
    id: str
    name: str
    owner: str
    state: str                     # a states.SweepState value
    sweep: SweepSettings
    trials: list[SweepTrial]       # in trial order; none in a list of sweeps
    created: float
    finished: float
    message: str
    wire: Any = WIRE

    def ranked(self) -> list[SweepTrial]:
        """The trials best first by the metric (the goal says which way); those with no value yet last, in trial
        order."""
        sign = -1.0 if self.sweep.goal == "max" else 1.0
        return sorted(self.trials, key=lambda t: (t.best is None, sign * t.best if t.best is not None else 0.0,
                                                  t.index))


@cache
def _types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _value(kind: Any, msg: Any, name: str) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Union:  # Optional[X]: None where the message leaves the field unset
        return _value(args[0], msg, name) if msg.HasField(name) else None
    value = getattr(msg, name)
    if origin is list:
        return [read(args[0], item) if hasattr(args[0], "__dataclass_fields__") else item for item in value]
    if origin is dict:
        return dict(value)
    return read(kind, value) if hasattr(kind, "__dataclass_fields__") else value


def read(cls: type, msg: Any) -> Any:
    """The typed twin (cls) of a status message."""
    kinds = _types(cls)
    values = {f.name: _value(kinds[f.name], msg, f.name) for f in fields(cls) if f.name != "wire"}
    if "wire" in kinds:
        values["wire"] = msg
    return cls(**values)
