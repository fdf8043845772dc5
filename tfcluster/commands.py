"""The commands the coordinator gives agents, and what agents send back for some of them (a log's bytes, a
probe's answer): plain frozen values without I/O, as the rest of the model (model.py). wire/ turns them into
protobuf messages and back."""

from __future__ import annotations

from dataclasses import dataclass, field

from tfcluster.model import DEFAULT_STOP_SIGNAL, Attempt, EnvironmentSpec


@dataclass(frozen=True)
class Launch:
    node: str
    attempt: Attempt
    command: tuple[str, ...]
    env: dict[str, str] = field(repr=False)  # secrets: never in a log line
    workdir: str
    port: int
    stop_grace_seconds: float
    report_listening: bool = False  # report again once the task accepts connections on its port
    uid: int = 0  # the job's task user and group on every node; 0: none given (a coordinator before 0.3)
    gid: int = 0
    owner: str = ""        # the job's owner: with `--task-user owner` the agent runs the task as their account
    memory_bytes: int = 0  # the most memory the task's process tree may use; 0: not limited
    code_sha256: str = ""  # the job's code archive, fetched and unpacked under the task's cwd; "": shared workdir
    code_sources: tuple[str, ...] = ()  # peers (host:peer_port) that hold the archive; the coordinator after them
    environment: EnvironmentSpec = field(default_factory=EnvironmentSpec)
    stop_signal: str = DEFAULT_STOP_SIGNAL  # sent first on a stop; SIGKILL after stop_grace_seconds

    def __str__(self) -> str:
        return f"launch {self.attempt} on {self.node}"


@dataclass(frozen=True)
class Stop:
    node: str
    attempt: Attempt
    grace_seconds: float  # the launch's stop signal, then SIGKILL after this long; 0: SIGKILL at once

    def __str__(self) -> str:
        return f"stop {self.attempt} on {self.node} (SIGKILL after {self.grace_seconds:g} s)"


@dataclass(frozen=True)
class FinishTraining:
    """Training is over: the evaluator evaluates final_checkpoint (a name in its checkpoint dir) and exits."""
    node: str
    attempt: Attempt
    final_checkpoint: str

    def __str__(self) -> str:
        return f"{self.attempt.job_id}: training finished; the evaluator on {self.node} is told the final " \
               f"checkpoint is {self.final_checkpoint!r}"


@dataclass(frozen=True)
class ShipCheckpoints:
    """Follow the task's checkpoint dir and ship each new checkpoint to the targets (peer addresses) until the
    task ends; a later order for the same attempt replaces the targets."""
    node: str
    attempt: Attempt
    targets: tuple[str, ...]
    target_nodes: tuple[str, ...] = ()  # the node at each target: only its certificate is accepted there

    def __str__(self) -> str:
        return f"{self.attempt.job_id}: {self.node} ships {self.attempt.task_key}'s checkpoints to " \
               f"{', '.join(self.targets)}"


@dataclass(frozen=True)
class SyncCheckpoints:
    """Copy this node's whole host-local checkpoint dir of the job to the targets now, then answer."""
    node: str
    job_id: str
    sync_id: int
    targets: tuple[str, ...]
    target_nodes: tuple[str, ...] = ()  # the node at each target: only its certificate is accepted there

    def __str__(self) -> str:
        return f"{self.job_id}: copying checkpoints from {self.node} to {', '.join(self.targets)} (copy {self.sync_id})"


@dataclass(frozen=True)
class ExpectFiles:
    """Checkpoint files of this job are coming to the node's peer port from `sender` (the node that produces
    them): take them from that node alone, and hand them to the job's task user."""
    node: str
    job_id: str
    sender: str = ""  # "": any node of the cluster (a coordinator before 0.3 names none)
    uid: int = 0
    gid: int = 0

    def __str__(self) -> str:
        return f"{self.job_id}: {self.node} is to receive checkpoints"


@dataclass(frozen=True)
class ServeCode:
    """`fetcher` will ask this node's peer port for the job's code (its launch names this node as a source of
    it): serve that node's certificate the job's code."""
    node: str
    job_id: str
    fetcher: str

    def __str__(self) -> str:
        return f"{self.job_id}: {self.fetcher} may fetch its code from {self.node}"


@dataclass(frozen=True)
class Revocations:
    """The node certificates the coordinator no longer accepts (removed or replaced nodes), as the whole list:
    (node, time) refuses that node's certificates issued before the time."""
    node: str
    revoked: tuple[tuple[str, float], ...]

    def __str__(self) -> str:
        return f"{self.node} is told of {len(self.revoked)} revoked node certificates"


@dataclass(frozen=True)
class SetPace:
    """Heartbeat every this many seconds from now on: the cluster grew past the coordinator's bound."""
    node: str
    heartbeat_interval_seconds: float


@dataclass(frozen=True)
class ReadLog:
    """Send the bytes of an attempt's log (LogData with this request id), to the end or (follow) until it ends."""
    node: str
    request_id: int
    attempt: Attempt
    follow: bool = False
    tail_lines: int = 0  # 0: from the start
    environment: bool = False  # the log of the job's environment build on this node (attempt.job_id alone counts)


@dataclass(frozen=True)
class CancelLog:
    node: str
    request_id: int


@dataclass(frozen=True)
class LogData:
    """Bytes of a log, agent to coordinator; the last has eof (and error, when there was none to read)."""
    request_id: int
    data: bytes = b""
    eof: bool = False
    error: str = ""


PROBE_CONNECT_SECONDS = 2.0  # a probe's TCP connect gives up after this (`tfcluster doctor`)


@dataclass(frozen=True)
class ProbeTarget:
    """A port of another node a probe connects to: its peer port ("peer") or one opened in its task range ("tasks")."""
    node: str
    address: str
    port: int
    what: str


@dataclass(frozen=True)
class Probe:
    """`tfcluster doctor`'s questions to an agent: listen on a free port of the task range for listen_seconds (no
    targets), or connect to each target and say how each went. Either way it answers with a ProbeAnswer."""
    node: str
    probe_id: int
    listen_seconds: float = 0.0
    targets: tuple[ProbeTarget, ...] = ()


@dataclass(frozen=True)
class ProbeOutcome:
    target: ProbeTarget
    ok: bool
    error: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class ProbeAnswer:
    """An agent's answer to a Probe, with what else the doctor asks of every node: its wall clock when it answered
    (clock skew) and the network interface its advertise address is on (the one NCCL should use)."""
    probe_id: int
    port: int = 0  # the task port it listens on (a listen probe); 0: none
    error: str = ""  # why it could not listen
    outcomes: tuple[ProbeOutcome, ...] = ()
    agent_time: float = 0.0
    interface: str = ""


Command = (Launch | Stop | FinishTraining | ShipCheckpoints | SyncCheckpoints | ExpectFiles | ServeCode | Revocations |
           ReadLog | CancelLog | SetPace | Probe)
