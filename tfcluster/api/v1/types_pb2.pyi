# Generated from protos/ by scripts/genproto.py. Do not edit.
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_PHASE_UNSPECIFIED: _ClassVar[TaskPhase]
    TASK_PHASE_RUNNING: _ClassVar[TaskPhase]
    TASK_PHASE_EXITED: _ClassVar[TaskPhase]
    TASK_PHASE_FAILED_TO_START: _ClassVar[TaskPhase]
TASK_PHASE_UNSPECIFIED: TaskPhase
TASK_PHASE_RUNNING: TaskPhase
TASK_PHASE_EXITED: TaskPhase
TASK_PHASE_FAILED_TO_START: TaskPhase

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "name", "memory_mib")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    memory_mib: int
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., memory_mib: _Optional[int] = ...) -> None: ...

class NodeCondition(_message.Message):
    __slots__ = ("gpu", "kind", "message", "since")
    GPU_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    gpu: int
    kind: str
    message: str
    since: float
    def __init__(self, gpu: _Optional[int] = ..., kind: _Optional[str] = ..., message: _Optional[str] = ..., since: _Optional[float] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("name", "hostname", "address", "port_range_start", "port_range_end", "cpu_count", "memory_bytes", "gpus", "agent_version", "state_dir", "peer_port", "labels", "gpu_driver", "cuda_version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PORT_RANGE_START_FIELD_NUMBER: _ClassVar[int]
    PORT_RANGE_END_FIELD_NUMBER: _ClassVar[int]
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_DIR_FIELD_NUMBER: _ClassVar[int]
    PEER_PORT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    GPU_DRIVER_FIELD_NUMBER: _ClassVar[int]
    CUDA_VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    hostname: str
    address: str
    port_range_start: int
    port_range_end: int
    cpu_count: int
    memory_bytes: int
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    agent_version: str
    state_dir: str
    peer_port: int
    labels: _containers.RepeatedScalarFieldContainer[str]
    gpu_driver: str
    cuda_version: str
    def __init__(self, name: _Optional[str] = ..., hostname: _Optional[str] = ..., address: _Optional[str] = ..., port_range_start: _Optional[int] = ..., port_range_end: _Optional[int] = ..., cpu_count: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., agent_version: _Optional[str] = ..., state_dir: _Optional[str] = ..., peer_port: _Optional[int] = ..., labels: _Optional[_Iterable[str]] = ..., gpu_driver: _Optional[str] = ..., cuda_version: _Optional[str] = ...) -> None: ...

class RoleSpec(_message.Message):
    __slots__ = ("count", "gpus", "command", "env", "nodes", "entrypoint", "summary_dir", "memory_bytes", "min_count", "max_count", "labels")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    COUNT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_DIR_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MIN_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_COUNT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    count: int
    gpus: int
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    entrypoint: str
    summary_dir: str
    memory_bytes: int
    min_count: int
    max_count: int
    labels: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, count: _Optional[int] = ..., gpus: _Optional[int] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., nodes: _Optional[_Iterable[str]] = ..., entrypoint: _Optional[str] = ..., summary_dir: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., min_count: _Optional[int] = ..., max_count: _Optional[int] = ..., labels: _Optional[_Iterable[str]] = ...) -> None: ...

class RestartPolicy(_message.Message):
    __slots__ = ("max_restarts", "backoff_seconds", "permanent_exit_codes", "hang_seconds")
    MAX_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PERMANENT_EXIT_CODES_FIELD_NUMBER: _ClassVar[int]
    HANG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    max_restarts: int
    backoff_seconds: float
    permanent_exit_codes: _containers.RepeatedScalarFieldContainer[int]
    hang_seconds: float
    def __init__(self, max_restarts: _Optional[int] = ..., backoff_seconds: _Optional[float] = ..., permanent_exit_codes: _Optional[_Iterable[int]] = ..., hang_seconds: _Optional[float] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "strategy", "command", "workdir", "checkpoint_dir", "model_dir", "env", "gpus", "roles", "restart", "stop_grace_seconds", "evaluator_deadline_seconds", "priority", "memory_bytes", "code_sha256", "shared_workdir", "environment", "stop_signal", "resize_interval_seconds")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class RolesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: RoleSpec
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[RoleSpec, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    MODEL_DIR_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    RESTART_FIELD_NUMBER: _ClassVar[int]
    STOP_GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EVALUATOR_DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CODE_SHA256_FIELD_NUMBER: _ClassVar[int]
    SHARED_WORKDIR_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    STOP_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    RESIZE_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    strategy: str
    command: _containers.RepeatedScalarFieldContainer[str]
    workdir: str
    checkpoint_dir: str
    model_dir: str
    env: _containers.ScalarMap[str, str]
    gpus: int
    roles: _containers.MessageMap[str, RoleSpec]
    restart: RestartPolicy
    stop_grace_seconds: float
    evaluator_deadline_seconds: float
    priority: str
    memory_bytes: int
    code_sha256: str
    shared_workdir: bool
    environment: EnvironmentSpec
    stop_signal: str
    resize_interval_seconds: float
    def __init__(self, name: _Optional[str] = ..., strategy: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., workdir: _Optional[str] = ..., checkpoint_dir: _Optional[str] = ..., model_dir: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., gpus: _Optional[int] = ..., roles: _Optional[_Mapping[str, RoleSpec]] = ..., restart: _Optional[_Union[RestartPolicy, _Mapping]] = ..., stop_grace_seconds: _Optional[float] = ..., evaluator_deadline_seconds: _Optional[float] = ..., priority: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., code_sha256: _Optional[str] = ..., shared_workdir: _Optional[bool] = ..., environment: _Optional[_Union[EnvironmentSpec, _Mapping]] = ..., stop_signal: _Optional[str] = ..., resize_interval_seconds: _Optional[float] = ...) -> None: ...

class EnvironmentSpec(_message.Message):
    __slots__ = ("requirements", "isolated", "project")
    REQUIREMENTS_FIELD_NUMBER: _ClassVar[int]
    ISOLATED_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    requirements: str
    isolated: bool
    project: str
    def __init__(self, requirements: _Optional[str] = ..., isolated: _Optional[bool] = ..., project: _Optional[str] = ...) -> None: ...

class CodeChunk(_message.Message):
    __slots__ = ("sha256", "size", "offset", "data")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    size: int
    offset: int
    data: bytes
    def __init__(self, sha256: _Optional[str] = ..., size: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class TaskLaunch(_message.Message):
    __slots__ = ("job_id", "task_type", "task_index", "attempt", "command", "env", "workdir", "port", "stop_grace_seconds", "report_listening", "uid", "gid", "owner", "memory_bytes", "code_sha256", "code_sources", "environment", "stop_signal")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    STOP_GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REPORT_LISTENING_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CODE_SHA256_FIELD_NUMBER: _ClassVar[int]
    CODE_SOURCES_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    STOP_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    task_type: str
    task_index: int
    attempt: int
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    workdir: str
    port: int
    stop_grace_seconds: float
    report_listening: bool
    uid: int
    gid: int
    owner: str
    memory_bytes: int
    code_sha256: str
    code_sources: _containers.RepeatedScalarFieldContainer[str]
    environment: EnvironmentSpec
    stop_signal: str
    def __init__(self, job_id: _Optional[str] = ..., task_type: _Optional[str] = ..., task_index: _Optional[int] = ..., attempt: _Optional[int] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., workdir: _Optional[str] = ..., port: _Optional[int] = ..., stop_grace_seconds: _Optional[float] = ..., report_listening: _Optional[bool] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., owner: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., code_sha256: _Optional[str] = ..., code_sources: _Optional[_Iterable[str]] = ..., environment: _Optional[_Union[EnvironmentSpec, _Mapping]] = ..., stop_signal: _Optional[str] = ...) -> None: ...

class TaskReport(_message.Message):
    __slots__ = ("job_id", "task_type", "task_index", "attempt", "phase", "pid", "exit_code", "signal", "message", "log_tail", "log_path", "busy_port", "final_checkpoint", "listening", "cpu_seconds", "peak_rss_bytes", "permanent")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LOG_TAIL_FIELD_NUMBER: _ClassVar[int]
    LOG_PATH_FIELD_NUMBER: _ClassVar[int]
    BUSY_PORT_FIELD_NUMBER: _ClassVar[int]
    FINAL_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    LISTENING_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PEAK_RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    PERMANENT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    task_type: str
    task_index: int
    attempt: int
    phase: TaskPhase
    pid: int
    exit_code: int
    signal: int
    message: str
    log_tail: _containers.RepeatedScalarFieldContainer[str]
    log_path: str
    busy_port: int
    final_checkpoint: str
    listening: bool
    cpu_seconds: float
    peak_rss_bytes: int
    permanent: bool
    def __init__(self, job_id: _Optional[str] = ..., task_type: _Optional[str] = ..., task_index: _Optional[int] = ..., attempt: _Optional[int] = ..., phase: _Optional[_Union[TaskPhase, str]] = ..., pid: _Optional[int] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., message: _Optional[str] = ..., log_tail: _Optional[_Iterable[str]] = ..., log_path: _Optional[str] = ..., busy_port: _Optional[int] = ..., final_checkpoint: _Optional[str] = ..., listening: _Optional[bool] = ..., cpu_seconds: _Optional[float] = ..., peak_rss_bytes: _Optional[int] = ..., permanent: _Optional[bool] = ...) -> None: ...

class Evaluation(_message.Message):
    __slots__ = ("job_id", "task_type", "task_index", "attempt", "checkpoint", "step", "metrics", "time")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    task_type: str
    task_index: int
    attempt: int
    checkpoint: str
    step: int
    metrics: _containers.ScalarMap[str, float]
    time: float
    def __init__(self, job_id: _Optional[str] = ..., task_type: _Optional[str] = ..., task_index: _Optional[int] = ..., attempt: _Optional[int] = ..., checkpoint: _Optional[str] = ..., step: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., time: _Optional[float] = ...) -> None: ...

class SummaryData(_message.Message):
    __slots__ = ("job_id", "task_type", "task_index", "path", "offset", "data")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    task_type: str
    task_index: int
    path: str
    offset: int
    data: bytes
    def __init__(self, job_id: _Optional[str] = ..., task_type: _Optional[str] = ..., task_index: _Optional[int] = ..., path: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...
