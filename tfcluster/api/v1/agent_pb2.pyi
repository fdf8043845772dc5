# Generated from protos/ by scripts/genproto.py. Do not edit.
from tfcluster.api.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FetchCodeRequest(_message.Message):
    __slots__ = ("sha256", "offset", "job_id")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    offset: int
    job_id: str
    def __init__(self, sha256: _Optional[str] = ..., offset: _Optional[int] = ..., job_id: _Optional[str] = ...) -> None: ...

class FileChunk(_message.Message):
    __slots__ = ("job_id", "path", "data", "end_of_file", "sha256", "commit")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    END_OF_FILE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    path: str
    data: bytes
    end_of_file: bool
    sha256: str
    commit: bool
    def __init__(self, job_id: _Optional[str] = ..., path: _Optional[str] = ..., data: _Optional[bytes] = ..., end_of_file: _Optional[bool] = ..., sha256: _Optional[str] = ..., commit: _Optional[bool] = ...) -> None: ...

class PutFilesReply(_message.Message):
    __slots__ = ("bytes", "files")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    files: int
    def __init__(self, bytes: _Optional[int] = ..., files: _Optional[int] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("token", "node_name", "csr")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    CSR_FIELD_NUMBER: _ClassVar[int]
    token: str
    node_name: str
    csr: bytes
    def __init__(self, token: _Optional[str] = ..., node_name: _Optional[str] = ..., csr: _Optional[bytes] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("certificate", "ca_certificate")
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    CA_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    certificate: bytes
    ca_certificate: bytes
    def __init__(self, certificate: _Optional[bytes] = ..., ca_certificate: _Optional[bytes] = ...) -> None: ...

class RenewCertificateRequest(_message.Message):
    __slots__ = ("csr",)
    CSR_FIELD_NUMBER: _ClassVar[int]
    csr: bytes
    def __init__(self, csr: _Optional[bytes] = ...) -> None: ...

class RenewCertificateResponse(_message.Message):
    __slots__ = ("certificate",)
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    certificate: bytes
    def __init__(self, certificate: _Optional[bytes] = ...) -> None: ...

class EndedJobsRequest(_message.Message):
    __slots__ = ("job_ids",)
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class EndedJobsResponse(_message.Message):
    __slots__ = ("ended_job_ids",)
    ENDED_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    ended_job_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ended_job_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("node", "tasks", "health_failure", "conditions")
    NODE_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FAILURE_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    node: _types_pb2.NodeInfo
    tasks: _containers.RepeatedCompositeFieldContainer[_types_pb2.TaskReport]
    health_failure: str
    conditions: _containers.RepeatedCompositeFieldContainer[_types_pb2.NodeCondition]
    def __init__(self, node: _Optional[_Union[_types_pb2.NodeInfo, _Mapping]] = ..., tasks: _Optional[_Iterable[_Union[_types_pb2.TaskReport, _Mapping]]] = ..., health_failure: _Optional[str] = ..., conditions: _Optional[_Iterable[_Union[_types_pb2.NodeCondition, _Mapping]]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("session_id", "heartbeat_interval_seconds")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    heartbeat_interval_seconds: float
    def __init__(self, session_id: _Optional[str] = ..., heartbeat_interval_seconds: _Optional[float] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("session_id", "progress", "condition", "health_failure", "conditions")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FAILURE_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    progress: _containers.RepeatedCompositeFieldContainer[TaskProgress]
    condition: str
    health_failure: str
    conditions: _containers.RepeatedCompositeFieldContainer[_types_pb2.NodeCondition]
    def __init__(self, session_id: _Optional[str] = ..., progress: _Optional[_Iterable[_Union[TaskProgress, _Mapping]]] = ..., condition: _Optional[str] = ..., health_failure: _Optional[str] = ..., conditions: _Optional[_Iterable[_Union[_types_pb2.NodeCondition, _Mapping]]] = ...) -> None: ...

class TaskProgress(_message.Message):
    __slots__ = ("job_id", "task_type", "task_index", "attempt", "output_bytes", "checkpoint", "cpu_seconds", "rss_bytes", "peak_rss_bytes", "phase_detail", "gpu_utilization")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEAK_RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    PHASE_DETAIL_FIELD_NUMBER: _ClassVar[int]
    GPU_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    task_type: str
    task_index: int
    attempt: int
    output_bytes: int
    checkpoint: str
    cpu_seconds: float
    rss_bytes: int
    peak_rss_bytes: int
    phase_detail: str
    gpu_utilization: float
    def __init__(self, job_id: _Optional[str] = ..., task_type: _Optional[str] = ..., task_index: _Optional[int] = ..., attempt: _Optional[int] = ..., output_bytes: _Optional[int] = ..., checkpoint: _Optional[str] = ..., cpu_seconds: _Optional[float] = ..., rss_bytes: _Optional[int] = ..., peak_rss_bytes: _Optional[int] = ..., phase_detail: _Optional[str] = ..., gpu_utilization: _Optional[float] = ...) -> None: ...

class StreamOpen(_message.Message):
    __slots__ = ("node_name", "session_id")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    session_id: str
    def __init__(self, node_name: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class LogData(_message.Message):
    __slots__ = ("request_id", "data", "eof", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    data: bytes
    eof: bool
    error: str
    def __init__(self, request_id: _Optional[int] = ..., data: _Optional[bytes] = ..., eof: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("open", "heartbeat", "task", "log", "evaluation", "sync_done", "leaving", "probe_answer", "summary")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    SYNC_DONE_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    PROBE_ANSWER_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    open: StreamOpen
    heartbeat: Heartbeat
    task: _types_pb2.TaskReport
    log: LogData
    evaluation: _types_pb2.Evaluation
    sync_done: SyncDone
    leaving: Leaving
    probe_answer: ProbeAnswer
    summary: _types_pb2.SummaryData
    def __init__(self, open: _Optional[_Union[StreamOpen, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., task: _Optional[_Union[_types_pb2.TaskReport, _Mapping]] = ..., log: _Optional[_Union[LogData, _Mapping]] = ..., evaluation: _Optional[_Union[_types_pb2.Evaluation, _Mapping]] = ..., sync_done: _Optional[_Union[SyncDone, _Mapping]] = ..., leaving: _Optional[_Union[Leaving, _Mapping]] = ..., probe_answer: _Optional[_Union[ProbeAnswer, _Mapping]] = ..., summary: _Optional[_Union[_types_pb2.SummaryData, _Mapping]] = ...) -> None: ...

class ProbeTarget(_message.Message):
    __slots__ = ("node", "address", "port", "what")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    WHAT_FIELD_NUMBER: _ClassVar[int]
    node: str
    address: str
    port: int
    what: str
    def __init__(self, node: _Optional[str] = ..., address: _Optional[str] = ..., port: _Optional[int] = ..., what: _Optional[str] = ...) -> None: ...

class Probe(_message.Message):
    __slots__ = ("probe_id", "listen_seconds", "targets")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    LISTEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    probe_id: int
    listen_seconds: float
    targets: _containers.RepeatedCompositeFieldContainer[ProbeTarget]
    def __init__(self, probe_id: _Optional[int] = ..., listen_seconds: _Optional[float] = ..., targets: _Optional[_Iterable[_Union[ProbeTarget, _Mapping]]] = ...) -> None: ...

class ProbeOutcome(_message.Message):
    __slots__ = ("target", "ok", "error", "seconds")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    target: ProbeTarget
    ok: bool
    error: str
    seconds: float
    def __init__(self, target: _Optional[_Union[ProbeTarget, _Mapping]] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class ProbeAnswer(_message.Message):
    __slots__ = ("probe_id", "port", "error", "outcomes", "agent_time", "interface")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    AGENT_TIME_FIELD_NUMBER: _ClassVar[int]
    INTERFACE_FIELD_NUMBER: _ClassVar[int]
    probe_id: int
    port: int
    error: str
    outcomes: _containers.RepeatedCompositeFieldContainer[ProbeOutcome]
    agent_time: float
    interface: str
    def __init__(self, probe_id: _Optional[int] = ..., port: _Optional[int] = ..., error: _Optional[str] = ..., outcomes: _Optional[_Iterable[_Union[ProbeOutcome, _Mapping]]] = ..., agent_time: _Optional[float] = ..., interface: _Optional[str] = ...) -> None: ...

class Leaving(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StopTask(_message.Message):
    __slots__ = ("job_id", "task_type", "task_index", "attempt", "grace_seconds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    task_type: str
    task_index: int
    attempt: int
    grace_seconds: float
    def __init__(self, job_id: _Optional[str] = ..., task_type: _Optional[str] = ..., task_index: _Optional[int] = ..., attempt: _Optional[int] = ..., grace_seconds: _Optional[float] = ...) -> None: ...

class ReadLog(_message.Message):
    __slots__ = ("request_id", "job_id", "task_type", "task_index", "attempt", "follow", "tail_lines", "environment")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    job_id: str
    task_type: str
    task_index: int
    attempt: int
    follow: bool
    tail_lines: int
    environment: bool
    def __init__(self, request_id: _Optional[int] = ..., job_id: _Optional[str] = ..., task_type: _Optional[str] = ..., task_index: _Optional[int] = ..., attempt: _Optional[int] = ..., follow: _Optional[bool] = ..., tail_lines: _Optional[int] = ..., environment: _Optional[bool] = ...) -> None: ...

class FinishTraining(_message.Message):
    __slots__ = ("job_id", "task_type", "task_index", "attempt", "final_checkpoint")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FINAL_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    task_type: str
    task_index: int
    attempt: int
    final_checkpoint: str
    def __init__(self, job_id: _Optional[str] = ..., task_type: _Optional[str] = ..., task_index: _Optional[int] = ..., attempt: _Optional[int] = ..., final_checkpoint: _Optional[str] = ...) -> None: ...

class ShipCheckpoints(_message.Message):
    __slots__ = ("job_id", "task_type", "task_index", "attempt", "targets", "target_nodes")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    TARGET_NODES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    task_type: str
    task_index: int
    attempt: int
    targets: _containers.RepeatedScalarFieldContainer[str]
    target_nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., task_type: _Optional[str] = ..., task_index: _Optional[int] = ..., attempt: _Optional[int] = ..., targets: _Optional[_Iterable[str]] = ..., target_nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class SyncCheckpoints(_message.Message):
    __slots__ = ("job_id", "sync_id", "targets", "target_nodes")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SYNC_ID_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    TARGET_NODES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    sync_id: int
    targets: _containers.RepeatedScalarFieldContainer[str]
    target_nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., sync_id: _Optional[int] = ..., targets: _Optional[_Iterable[str]] = ..., target_nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class SyncDone(_message.Message):
    __slots__ = ("job_id", "sync_id", "ok", "message", "bytes", "seconds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SYNC_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    sync_id: int
    ok: bool
    message: str
    bytes: int
    seconds: float
    def __init__(self, job_id: _Optional[str] = ..., sync_id: _Optional[int] = ..., ok: _Optional[bool] = ..., message: _Optional[str] = ..., bytes: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class CancelLog(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    def __init__(self, request_id: _Optional[int] = ...) -> None: ...

class ExpectFiles(_message.Message):
    __slots__ = ("job_id", "sender", "uid", "gid")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    sender: str
    uid: int
    gid: int
    def __init__(self, job_id: _Optional[str] = ..., sender: _Optional[str] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ...) -> None: ...

class ServeCode(_message.Message):
    __slots__ = ("job_id", "node")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    node: str
    def __init__(self, job_id: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class Revocations(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[RevokedNode]
    def __init__(self, nodes: _Optional[_Iterable[_Union[RevokedNode, _Mapping]]] = ...) -> None: ...

class RevokedNode(_message.Message):
    __slots__ = ("node", "issued_before")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ISSUED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    node: str
    issued_before: float
    def __init__(self, node: _Optional[str] = ..., issued_before: _Optional[float] = ...) -> None: ...

class CoordinatorMessage(_message.Message):
    __slots__ = ("launch", "stop", "read_log", "cancel_log", "finish_training", "ship", "sync", "expect_files", "revocations", "pace", "serve_code", "probe")
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    READ_LOG_FIELD_NUMBER: _ClassVar[int]
    CANCEL_LOG_FIELD_NUMBER: _ClassVar[int]
    FINISH_TRAINING_FIELD_NUMBER: _ClassVar[int]
    SHIP_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    EXPECT_FILES_FIELD_NUMBER: _ClassVar[int]
    REVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    PACE_FIELD_NUMBER: _ClassVar[int]
    SERVE_CODE_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    launch: _types_pb2.TaskLaunch
    stop: StopTask
    read_log: ReadLog
    cancel_log: CancelLog
    finish_training: FinishTraining
    ship: ShipCheckpoints
    sync: SyncCheckpoints
    expect_files: ExpectFiles
    revocations: Revocations
    pace: Pace
    serve_code: ServeCode
    probe: Probe
    def __init__(self, launch: _Optional[_Union[_types_pb2.TaskLaunch, _Mapping]] = ..., stop: _Optional[_Union[StopTask, _Mapping]] = ..., read_log: _Optional[_Union[ReadLog, _Mapping]] = ..., cancel_log: _Optional[_Union[CancelLog, _Mapping]] = ..., finish_training: _Optional[_Union[FinishTraining, _Mapping]] = ..., ship: _Optional[_Union[ShipCheckpoints, _Mapping]] = ..., sync: _Optional[_Union[SyncCheckpoints, _Mapping]] = ..., expect_files: _Optional[_Union[ExpectFiles, _Mapping]] = ..., revocations: _Optional[_Union[Revocations, _Mapping]] = ..., pace: _Optional[_Union[Pace, _Mapping]] = ..., serve_code: _Optional[_Union[ServeCode, _Mapping]] = ..., probe: _Optional[_Union[Probe, _Mapping]] = ...) -> None: ...

class Pace(_message.Message):
    __slots__ = ("heartbeat_interval_seconds",)
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_seconds: float
    def __init__(self, heartbeat_interval_seconds: _Optional[float] = ...) -> None: ...
