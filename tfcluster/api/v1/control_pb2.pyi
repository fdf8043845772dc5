# Generated from protos/ by scripts/genproto.py. Do not edit.
from tfcluster.api.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateJoinTokenRequest(_message.Message):
    __slots__ = ("ttl_seconds", "node", "reusable", "replace")
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REUSABLE_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    ttl_seconds: float
    node: str
    reusable: bool
    replace: bool
    def __init__(self, ttl_seconds: _Optional[float] = ..., node: _Optional[str] = ..., reusable: _Optional[bool] = ..., replace: _Optional[bool] = ...) -> None: ...

class CreateJoinTokenResponse(_message.Message):
    __slots__ = ("token", "expires")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_FIELD_NUMBER: _ClassVar[int]
    token: str
    expires: float
    def __init__(self, token: _Optional[str] = ..., expires: _Optional[float] = ...) -> None: ...

class RemoveNodeRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RemoveNodeResponse(_message.Message):
    __slots__ = ("tasks_lost",)
    TASKS_LOST_FIELD_NUMBER: _ClassVar[int]
    tasks_lost: int
    def __init__(self, tasks_lost: _Optional[int] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("name", "reason", "requeue")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    reason: str
    requeue: bool
    def __init__(self, name: _Optional[str] = ..., reason: _Optional[str] = ..., requeue: _Optional[bool] = ...) -> None: ...

class DrainNodeResponse(_message.Message):
    __slots__ = ("jobs_requeued", "jobs_running")
    JOBS_REQUEUED_FIELD_NUMBER: _ClassVar[int]
    JOBS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    jobs_requeued: int
    jobs_running: int
    def __init__(self, jobs_requeued: _Optional[int] = ..., jobs_running: _Optional[int] = ...) -> None: ...

class ResumeNodeRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ResumeNodeResponse(_message.Message):
    __slots__ = ("was_drained",)
    WAS_DRAINED_FIELD_NUMBER: _ClassVar[int]
    was_drained: bool
    def __init__(self, was_drained: _Optional[bool] = ...) -> None: ...

class DiagnoseRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Check(_message.Message):
    __slots__ = ("name", "subject", "level", "message", "fix")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIX_FIELD_NUMBER: _ClassVar[int]
    name: str
    subject: str
    level: str
    message: str
    fix: str
    def __init__(self, name: _Optional[str] = ..., subject: _Optional[str] = ..., level: _Optional[str] = ..., message: _Optional[str] = ..., fix: _Optional[str] = ...) -> None: ...

class DiagnoseResponse(_message.Message):
    __slots__ = ("checks",)
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    checks: _containers.RepeatedCompositeFieldContainer[Check]
    def __init__(self, checks: _Optional[_Iterable[_Union[Check, _Mapping]]] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec", "client_request_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: _types_pb2.JobSpec
    client_request_id: str
    def __init__(self, spec: _Optional[_Union[_types_pb2.JobSpec, _Mapping]] = ..., client_request_id: _Optional[str] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job_id", "state")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: str
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class PlanJobRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _types_pb2.JobSpec
    def __init__(self, spec: _Optional[_Union[_types_pb2.JobSpec, _Mapping]] = ...) -> None: ...

class PlannedTask(_message.Message):
    __slots__ = ("task_type", "task_index", "node", "address", "gpus", "tf_config", "command", "env_names")
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    TF_CONFIG_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_NAMES_FIELD_NUMBER: _ClassVar[int]
    task_type: str
    task_index: int
    node: str
    address: str
    gpus: _containers.RepeatedCompositeFieldContainer[_types_pb2.Gpu]
    tf_config: str
    command: _containers.RepeatedScalarFieldContainer[str]
    env_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task_type: _Optional[str] = ..., task_index: _Optional[int] = ..., node: _Optional[str] = ..., address: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[_types_pb2.Gpu, _Mapping]]] = ..., tf_config: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., env_names: _Optional[_Iterable[str]] = ...) -> None: ...

class PlanJobResponse(_message.Message):
    __slots__ = ("fits", "reason", "strategy", "tasks")
    FITS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    fits: bool
    reason: str
    strategy: str
    tasks: _containers.RepeatedCompositeFieldContainer[PlannedTask]
    def __init__(self, fits: _Optional[bool] = ..., reason: _Optional[str] = ..., strategy: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[PlannedTask, _Mapping]]] = ...) -> None: ...

class StopJobRequest(_message.Message):
    __slots__ = ("job_id", "graceful")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GRACEFUL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    graceful: bool
    def __init__(self, job_id: _Optional[str] = ..., graceful: _Optional[bool] = ...) -> None: ...

class StopJobResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: str
    def __init__(self, state: _Optional[str] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("name", "address", "state", "gpus", "hostname", "cpu_count", "memory_bytes", "agent_version", "last_seen_seconds_ago", "port_range_start", "port_range_end", "running_tasks", "condition", "memory_allocated_bytes", "drain", "conditions", "labels", "gpu_driver", "cuda_version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_SECONDS_AGO_FIELD_NUMBER: _ClassVar[int]
    PORT_RANGE_START_FIELD_NUMBER: _ClassVar[int]
    PORT_RANGE_END_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TASKS_FIELD_NUMBER: _ClassVar[int]
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ALLOCATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    GPU_DRIVER_FIELD_NUMBER: _ClassVar[int]
    CUDA_VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    state: str
    gpus: _containers.RepeatedCompositeFieldContainer[_types_pb2.Gpu]
    hostname: str
    cpu_count: int
    memory_bytes: int
    agent_version: str
    last_seen_seconds_ago: float
    port_range_start: int
    port_range_end: int
    running_tasks: int
    condition: str
    memory_allocated_bytes: int
    drain: NodeDrain
    conditions: _containers.RepeatedCompositeFieldContainer[_types_pb2.NodeCondition]
    labels: _containers.RepeatedScalarFieldContainer[str]
    gpu_driver: str
    cuda_version: str
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[_types_pb2.Gpu, _Mapping]]] = ..., hostname: _Optional[str] = ..., cpu_count: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., agent_version: _Optional[str] = ..., last_seen_seconds_ago: _Optional[float] = ..., port_range_start: _Optional[int] = ..., port_range_end: _Optional[int] = ..., running_tasks: _Optional[int] = ..., condition: _Optional[str] = ..., memory_allocated_bytes: _Optional[int] = ..., drain: _Optional[_Union[NodeDrain, _Mapping]] = ..., conditions: _Optional[_Iterable[_Union[_types_pb2.NodeCondition, _Mapping]]] = ..., labels: _Optional[_Iterable[str]] = ..., gpu_driver: _Optional[str] = ..., cuda_version: _Optional[str] = ...) -> None: ...

class NodeDrain(_message.Message):
    __slots__ = ("reason", "by", "since", "state")
    REASON_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    reason: str
    by: str
    since: float
    state: str
    def __init__(self, reason: _Optional[str] = ..., by: _Optional[str] = ..., since: _Optional[float] = ..., state: _Optional[str] = ...) -> None: ...

class TaskStatus(_message.Message):
    __slots__ = ("type", "index", "node", "address", "gpus", "state", "pid", "exit_code", "signal", "attempt", "message", "tf_config")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TF_CONFIG_FIELD_NUMBER: _ClassVar[int]
    type: str
    index: int
    node: str
    address: str
    gpus: _containers.RepeatedCompositeFieldContainer[_types_pb2.Gpu]
    state: str
    pid: int
    exit_code: int
    signal: int
    attempt: int
    message: str
    tf_config: str
    def __init__(self, type: _Optional[str] = ..., index: _Optional[int] = ..., node: _Optional[str] = ..., address: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[_types_pb2.Gpu, _Mapping]]] = ..., state: _Optional[str] = ..., pid: _Optional[int] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., attempt: _Optional[int] = ..., message: _Optional[str] = ..., tf_config: _Optional[str] = ...) -> None: ...

class EvaluationResult(_message.Message):
    __slots__ = ("checkpoint", "step", "metrics", "time")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    checkpoint: str
    step: int
    metrics: _containers.ScalarMap[str, float]
    time: float
    def __init__(self, checkpoint: _Optional[str] = ..., step: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., time: _Optional[float] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("task", "node", "exit_code", "signal", "message", "log_tail", "time", "description")
    TASK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LOG_TAIL_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    task: str
    node: str
    exit_code: int
    signal: int
    message: str
    log_tail: _containers.RepeatedScalarFieldContainer[str]
    time: float
    description: str
    def __init__(self, task: _Optional[str] = ..., node: _Optional[str] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., message: _Optional[str] = ..., log_tail: _Optional[_Iterable[str]] = ..., time: _Optional[float] = ..., description: _Optional[str] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("id", "name", "state", "strategy", "restarts", "tasks", "message", "created", "finished", "last_evaluation", "evaluations", "last_failure", "evaluator_restarts", "preemptions", "uid", "owner", "priority", "gpu_seconds", "cpu_seconds", "peak_rss_bytes", "queue_position", "waiting_since", "rank", "preempted_by", "preempted_by_owner", "preempted_at", "sweep", "sweep_parameters", "workers")
    class SweepParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    LAST_EVALUATION_FIELD_NUMBER: _ClassVar[int]
    EVALUATIONS_FIELD_NUMBER: _ClassVar[int]
    LAST_FAILURE_FIELD_NUMBER: _ClassVar[int]
    EVALUATOR_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PEAK_RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    WAITING_SINCE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_BY_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_BY_OWNER_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_AT_FIELD_NUMBER: _ClassVar[int]
    SWEEP_FIELD_NUMBER: _ClassVar[int]
    SWEEP_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    state: str
    strategy: str
    restarts: int
    tasks: _containers.RepeatedCompositeFieldContainer[TaskStatus]
    message: str
    created: float
    finished: float
    last_evaluation: EvaluationResult
    evaluations: _containers.RepeatedCompositeFieldContainer[EvaluationResult]
    last_failure: Failure
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
    rank: int
    preempted_by: str
    preempted_by_owner: str
    preempted_at: float
    sweep: str
    sweep_parameters: _containers.ScalarMap[str, str]
    workers: WorkerRange
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., strategy: _Optional[str] = ..., restarts: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[TaskStatus, _Mapping]]] = ..., message: _Optional[str] = ..., created: _Optional[float] = ..., finished: _Optional[float] = ..., last_evaluation: _Optional[_Union[EvaluationResult, _Mapping]] = ..., evaluations: _Optional[_Iterable[_Union[EvaluationResult, _Mapping]]] = ..., last_failure: _Optional[_Union[Failure, _Mapping]] = ..., evaluator_restarts: _Optional[int] = ..., preemptions: _Optional[int] = ..., uid: _Optional[int] = ..., owner: _Optional[str] = ..., priority: _Optional[str] = ..., gpu_seconds: _Optional[float] = ..., cpu_seconds: _Optional[float] = ..., peak_rss_bytes: _Optional[int] = ..., queue_position: _Optional[int] = ..., waiting_since: _Optional[float] = ..., rank: _Optional[int] = ..., preempted_by: _Optional[str] = ..., preempted_by_owner: _Optional[str] = ..., preempted_at: _Optional[float] = ..., sweep: _Optional[str] = ..., sweep_parameters: _Optional[_Mapping[str, str]] = ..., workers: _Optional[_Union[WorkerRange, _Mapping]] = ...) -> None: ...

class WorkerRange(_message.Message):
    __slots__ = ("min", "max", "current", "resizes")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    RESIZES_FIELD_NUMBER: _ClassVar[int]
    min: int
    max: int
    current: int
    resizes: int
    def __init__(self, min: _Optional[int] = ..., max: _Optional[int] = ..., current: _Optional[int] = ..., resizes: _Optional[int] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("nodes", "jobs", "summary")
    NODES_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    summary: ClusterSummary
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ..., summary: _Optional[_Union[ClusterSummary, _Mapping]] = ...) -> None: ...

class ClusterSummary(_message.Message):
    __slots__ = ("nodes_by_state", "gpus_total", "gpus_allocated", "jobs_by_state", "nodes_shown", "jobs_shown", "insecure", "dashboard_port", "leader")
    class NodesByStateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class JobsByStateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODES_BY_STATE_FIELD_NUMBER: _ClassVar[int]
    GPUS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GPUS_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    JOBS_BY_STATE_FIELD_NUMBER: _ClassVar[int]
    NODES_SHOWN_FIELD_NUMBER: _ClassVar[int]
    JOBS_SHOWN_FIELD_NUMBER: _ClassVar[int]
    INSECURE_FIELD_NUMBER: _ClassVar[int]
    DASHBOARD_PORT_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    nodes_by_state: _containers.ScalarMap[str, int]
    gpus_total: int
    gpus_allocated: int
    jobs_by_state: _containers.ScalarMap[str, int]
    nodes_shown: int
    jobs_shown: int
    insecure: bool
    dashboard_port: int
    leader: str
    def __init__(self, nodes_by_state: _Optional[_Mapping[str, int]] = ..., gpus_total: _Optional[int] = ..., gpus_allocated: _Optional[int] = ..., jobs_by_state: _Optional[_Mapping[str, int]] = ..., nodes_shown: _Optional[int] = ..., jobs_shown: _Optional[int] = ..., insecure: _Optional[bool] = ..., dashboard_port: _Optional[int] = ..., leader: _Optional[str] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "state", "name_prefix")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NAME_PREFIX_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    state: str
    name_prefix: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., state: _Optional[str] = ..., name_prefix: _Optional[str] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes", "next_page_token")
    NODES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    next_page_token: str
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "states", "name", "node")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    states: _containers.RepeatedScalarFieldContainer[str]
    name: str
    node: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., states: _Optional[_Iterable[str]] = ..., name: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class StreamLogsRequest(_message.Message):
    __slots__ = ("job_id", "task_type", "task_index", "follow", "tail_lines", "attempt", "environment", "node")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    task_type: str
    task_index: int
    follow: bool
    tail_lines: int
    attempt: int
    environment: bool
    node: str
    def __init__(self, job_id: _Optional[str] = ..., task_type: _Optional[str] = ..., task_index: _Optional[int] = ..., follow: _Optional[bool] = ..., tail_lines: _Optional[int] = ..., attempt: _Optional[int] = ..., environment: _Optional[bool] = ..., node: _Optional[str] = ...) -> None: ...

class ReadSummariesRequest(_message.Message):
    __slots__ = ("job_id", "have")
    class HaveEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    HAVE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    have: _containers.ScalarMap[str, int]
    def __init__(self, job_id: _Optional[str] = ..., have: _Optional[_Mapping[str, int]] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class WatchJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: JobStatus
    def __init__(self, job: _Optional[_Union[JobStatus, _Mapping]] = ...) -> None: ...

class CreateDashboardLoginRequest(_message.Message):
    __slots__ = ("job_id", "tensorboard_jobs")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TENSORBOARD_JOBS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    tensorboard_jobs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., tensorboard_jobs: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateDashboardLoginResponse(_message.Message):
    __slots__ = ("port", "path", "expires")
    PORT_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_FIELD_NUMBER: _ClassVar[int]
    port: int
    path: str
    expires: float
    def __init__(self, port: _Optional[int] = ..., path: _Optional[str] = ..., expires: _Optional[float] = ...) -> None: ...

class GetUsageRequest(_message.Message):
    __slots__ = ("window_seconds",)
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    window_seconds: float
    def __init__(self, window_seconds: _Optional[float] = ...) -> None: ...

class UsageTotals(_message.Message):
    __slots__ = ("name", "gpu_seconds", "cpu_seconds", "peak_rss_bytes", "jobs")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PEAK_RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    name: str
    gpu_seconds: float
    cpu_seconds: float
    peak_rss_bytes: int
    jobs: int
    def __init__(self, name: _Optional[str] = ..., gpu_seconds: _Optional[float] = ..., cpu_seconds: _Optional[float] = ..., peak_rss_bytes: _Optional[int] = ..., jobs: _Optional[int] = ...) -> None: ...

class GetUsageResponse(_message.Message):
    __slots__ = ("users", "groups", "since", "until", "horizon_seconds")
    USERS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    HORIZON_SECONDS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[UsageTotals]
    groups: _containers.RepeatedCompositeFieldContainer[UsageTotals]
    since: float
    until: float
    horizon_seconds: float
    def __init__(self, users: _Optional[_Iterable[_Union[UsageTotals, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[UsageTotals, _Mapping]]] = ..., since: _Optional[float] = ..., until: _Optional[float] = ..., horizon_seconds: _Optional[float] = ...) -> None: ...

class GetQueueRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class QueuedJob(_message.Message):
    __slots__ = ("position", "id", "name", "owner", "priority", "rank", "tasks", "gpus", "reason", "waiting_since", "not_before")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WAITING_SINCE_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    position: int
    id: str
    name: str
    owner: str
    priority: str
    rank: int
    tasks: int
    gpus: int
    reason: str
    waiting_since: float
    not_before: float
    def __init__(self, position: _Optional[int] = ..., id: _Optional[str] = ..., name: _Optional[str] = ..., owner: _Optional[str] = ..., priority: _Optional[str] = ..., rank: _Optional[int] = ..., tasks: _Optional[int] = ..., gpus: _Optional[int] = ..., reason: _Optional[str] = ..., waiting_since: _Optional[float] = ..., not_before: _Optional[float] = ...) -> None: ...

class GetQueueResponse(_message.Message):
    __slots__ = ("jobs", "total")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[QueuedJob]
    total: int
    def __init__(self, jobs: _Optional[_Iterable[_Union[QueuedJob, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...

class GetPolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPolicyResponse(_message.Message):
    __slots__ = ("text", "source", "loaded_at")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_FIELD_NUMBER: _ClassVar[int]
    text: str
    source: str
    loaded_at: float
    def __init__(self, text: _Optional[str] = ..., source: _Optional[str] = ..., loaded_at: _Optional[float] = ...) -> None: ...

class CodeStatusRequest(_message.Message):
    __slots__ = ("sha256", "size")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    size: int
    def __init__(self, sha256: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class CodeStatusResponse(_message.Message):
    __slots__ = ("complete", "received", "max_bytes")
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    complete: bool
    received: int
    max_bytes: int
    def __init__(self, complete: _Optional[bool] = ..., received: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class UploadCodeResponse(_message.Message):
    __slots__ = ("complete", "received")
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    complete: bool
    received: int
    def __init__(self, complete: _Optional[bool] = ..., received: _Optional[int] = ...) -> None: ...

class SweepParameter(_message.Message):
    __slots__ = ("name", "values")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    name: str
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., values: _Optional[_Iterable[str]] = ...) -> None: ...

class SweepSpec(_message.Message):
    __slots__ = ("method", "parameters", "metric", "goal", "max_concurrent", "trials", "seed", "early_stopping", "min_evaluations", "grace_steps", "reduction_factor")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    EARLY_STOPPING_FIELD_NUMBER: _ClassVar[int]
    MIN_EVALUATIONS_FIELD_NUMBER: _ClassVar[int]
    GRACE_STEPS_FIELD_NUMBER: _ClassVar[int]
    REDUCTION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    method: str
    parameters: _containers.RepeatedCompositeFieldContainer[SweepParameter]
    metric: str
    goal: str
    max_concurrent: int
    trials: int
    seed: int
    early_stopping: str
    min_evaluations: int
    grace_steps: int
    reduction_factor: int
    def __init__(self, method: _Optional[str] = ..., parameters: _Optional[_Iterable[_Union[SweepParameter, _Mapping]]] = ..., metric: _Optional[str] = ..., goal: _Optional[str] = ..., max_concurrent: _Optional[int] = ..., trials: _Optional[int] = ..., seed: _Optional[int] = ..., early_stopping: _Optional[str] = ..., min_evaluations: _Optional[int] = ..., grace_steps: _Optional[int] = ..., reduction_factor: _Optional[int] = ...) -> None: ...

class StartSweepRequest(_message.Message):
    __slots__ = ("spec", "sweep", "client_request_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SWEEP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: _types_pb2.JobSpec
    sweep: SweepSpec
    client_request_id: str
    def __init__(self, spec: _Optional[_Union[_types_pb2.JobSpec, _Mapping]] = ..., sweep: _Optional[_Union[SweepSpec, _Mapping]] = ..., client_request_id: _Optional[str] = ...) -> None: ...

class StartSweepResponse(_message.Message):
    __slots__ = ("sweep_id", "state")
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    state: str
    def __init__(self, sweep_id: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class SweepTrial(_message.Message):
    __slots__ = ("index", "job_id", "parameters", "state", "best", "best_step", "stopped_early", "message")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BEST_FIELD_NUMBER: _ClassVar[int]
    BEST_STEP_FIELD_NUMBER: _ClassVar[int]
    STOPPED_EARLY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    index: int
    job_id: str
    parameters: _containers.ScalarMap[str, str]
    state: str
    best: float
    best_step: int
    stopped_early: bool
    message: str
    def __init__(self, index: _Optional[int] = ..., job_id: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ..., state: _Optional[str] = ..., best: _Optional[float] = ..., best_step: _Optional[int] = ..., stopped_early: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class SweepStatus(_message.Message):
    __slots__ = ("id", "name", "owner", "state", "sweep", "trials", "created", "finished", "message")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SWEEP_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    owner: str
    state: str
    sweep: SweepSpec
    trials: _containers.RepeatedCompositeFieldContainer[SweepTrial]
    created: float
    finished: float
    message: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., owner: _Optional[str] = ..., state: _Optional[str] = ..., sweep: _Optional[_Union[SweepSpec, _Mapping]] = ..., trials: _Optional[_Iterable[_Union[SweepTrial, _Mapping]]] = ..., created: _Optional[float] = ..., finished: _Optional[float] = ..., message: _Optional[str] = ...) -> None: ...

class GetSweepRequest(_message.Message):
    __slots__ = ("sweep_id",)
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    def __init__(self, sweep_id: _Optional[str] = ...) -> None: ...

class GetSweepResponse(_message.Message):
    __slots__ = ("sweep",)
    SWEEP_FIELD_NUMBER: _ClassVar[int]
    sweep: SweepStatus
    def __init__(self, sweep: _Optional[_Union[SweepStatus, _Mapping]] = ...) -> None: ...

class ListSweepsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSweepsResponse(_message.Message):
    __slots__ = ("sweeps",)
    SWEEPS_FIELD_NUMBER: _ClassVar[int]
    sweeps: _containers.RepeatedCompositeFieldContainer[SweepStatus]
    def __init__(self, sweeps: _Optional[_Iterable[_Union[SweepStatus, _Mapping]]] = ...) -> None: ...

class StopSweepRequest(_message.Message):
    __slots__ = ("sweep_id",)
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    def __init__(self, sweep_id: _Optional[str] = ...) -> None: ...

class StopSweepResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: str
    def __init__(self, state: _Optional[str] = ...) -> None: ...
