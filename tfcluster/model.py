"""What both daemons speak of: a node and its GPUs, one attempt of a task, how it runs and how it ended (the
commands the coordinator gives agents are in commands.py).

Plain frozen values without I/O. wire/ turns them into protobuf messages and back, so the agent and
the coordinator share these and import nothing from each other.
"""

from __future__ import annotations

import re
import signal as signals
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from tfcluster.states import Phase

PREEMPTION_EXIT_CODE = 42  # PreemptionCheckpointHandler saved a checkpoint and exited: restart for free
# The program found it cannot work as it is set up (sysexits.h's EX_CONFIG; tfcluster.task's Keras 3 guard exits
# with it): no restart would change that, so the job fails at once, its restart budget untouched.
CONFIG_EXIT_CODE = 78
# The signals a stop may send first ([preemption] signal): those whose default action ends a process, so that a
# program that handles none of them still ends, and none that a shell or Python gives another meaning to.
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")
DEFAULT_STOP_SIGNAL = "SIGTERM"  # what PreemptionCheckpointHandler watches unless told otherwise
# The line tfcluster.task's preemption handler prints as it exits 42, which tells the coordinator the step saved.
PREEMPTION_SAVED_LINE = "tfcluster: preemption checkpoint saved at step {step}"
_PREEMPTION_SAVED_RE = re.compile(r"tfcluster: preemption checkpoint saved at step (\d{1,19})")
CHIEF, WORKER, PS, EVALUATOR = "chief", "worker", "ps", "evaluator"  # a task's type, as TF_CONFIG names it
# The tf.data service's roles (tfcluster/roles/data_service.py): one dispatcher and the data workers it hands input
# pipelines to. TensorFlow knows no such job names (MWMS and PSS refuse a cluster that lists them, "Disallowed task
# type"), so they get no TF_CONFIG; training tasks find the dispatcher through TFCLUSTER_DATA_SERVICE.
DISPATCHER, DATA_WORKER = "dispatcher", "data_worker"
DATA_SERVICE_TYPES = (DISPATCHER, DATA_WORKER)
ROLE_TYPES = (CHIEF, WORKER, PS, EVALUATOR, DISPATCHER, DATA_WORKER)
TRAINING_TYPES = (CHIEF, WORKER, PS)  # the training tasks' cluster in TF_CONFIG; the evaluator is never in it
# A node name is a host name or something like it: it appears in logs, tables and `nodes = [...]` lists.
NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
MAX_DRAIN_REASON = 200  # characters: a drain's reason is shown in status tables and as a metrics label
MAX_GPUS_PER_NODE = 256
MAX_CODE_SOURCES = 16  # peers a launch names that hold the job's code
# Control characters have no business in a name or a path (a newline forges log lines and table rows, a NUL
# cannot reach the kernel). Commands and environment values may hold tabs and line breaks: `python -c`
# scripts, PEM blocks.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_BUT_WHITESPACE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def drain_reason_problem(reason: str) -> str:
    """Why a drain's reason (stripped) is refused, by the CLI and the coordinator alike; "" when it will do."""
    if not reason or len(reason) > MAX_DRAIN_REASON or not reason.isprintable():
        return f"say why, in one printable line of at most {MAX_DRAIN_REASON} characters"
    return ""


def printable(value: str) -> str:
    """Free text from elsewhere (an agent's message) made safe for one log line: control characters become '?'."""
    return _CONTROL.sub("?", value)


def control_character(value: str, multiline: bool = False) -> str | None:
    """The first control character in value (as `\\x..`), if any; multiline lets tab, LF and CR through."""
    found = (_CONTROL_BUT_WHITESPACE if multiline else _CONTROL).search(value)
    return None if found is None else repr(found.group())[1:-1]


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str = ""
    name: str = ""
    memory_mib: int = 0


@dataclass(frozen=True)
class NodeInfo:
    """What an agent says about its node when it registers."""
    name: str
    address: str                      # the IP other nodes reach this node's tasks on
    port_range: tuple[int, int]       # task ports, inclusive
    gpus: tuple[Gpu, ...] = ()
    hostname: str = ""
    cpu_count: int = 0
    memory_bytes: int = 0
    agent_version: str = ""
    state_dir: str = ""               # where the agent keeps job files (host-local checkpoints)
    peer_port: int = 0                # where other agents send it checkpoints; 0: none
    labels: tuple[str, ...] = ()      # the kinds of machine it is (--label), which roles may ask for (labels.py)
    gpu_driver: str = ""              # the NVIDIA driver's version; "": NVML does not answer here
    cuda_version: str = ""            # the newest CUDA that driver supports ("13.0")

    @property
    def peer_address(self) -> str:
        return f"{self.address}:{self.peer_port}" if self.peer_port else ""

    def _version_at_least(self, wanted: tuple[int, int]) -> bool:
        try:
            return tuple(int(p) for p in self.agent_version.split(".")[:2]) >= wanted
        except ValueError:
            return False

    @property
    def keeps_sync_answers(self) -> bool:
        """Agents from 0.2 on keep the answer of each checkpoint copy and give it again when asked again; an
        older one would copy the whole dir again, so it is not asked twice."""
        return self._version_at_least((0, 2))

    @property
    def fetches_code(self) -> bool:
        """Agents from 0.6 on fetch a job's packed code and build its environment; an older one would run the
        task in a workdir that does not exist on its node."""
        return self._version_at_least((0, 6))

    @property
    def root_tasks_condition(self) -> str:
        """Why this node gets no new tasks: an agent before 0.3 ignores the job's UID and runs every task as
        root. "": it runs them as the UID given."""
        if self._version_at_least((0, 3)):
            return ""
        return f"agent {self.agent_version or '(no version)'} runs tasks as root: upgrade it"


@dataclass(frozen=True)
class Attempt:
    """One attempt of one task of one job: what launches, stops and reports name."""
    job_id: str
    type: str
    index: int
    number: int

    @property
    def task_key(self) -> str:
        return f"{self.type}:{self.index}"

    def __str__(self) -> str:
        return f"{self.job_id} {self.task_key} attempt {self.number}"


@dataclass(frozen=True)
class TaskExit:
    """How an attempt ended. exit_code and signal both None: it never started (message says why).

    The same value all the way: the shim records it in the attempt's status file (taskfiles.ShimStatus), its
    agent sends it in a TaskReport (wire/nodes.py), the coordinator keeps it as the task's exit and in the job's last
    failure, and the status views show it (wire.job_status, views.job_doc)."""
    exit_code: int | None = None
    signal: int | None = None
    message: str = ""
    log_tail: tuple[str, ...] = ()
    busy_port: int = 0          # it could not start because this port was taken on the node
    final_checkpoint: str = ""  # with exit code 0: the newest committed checkpoint in its dir (relative name)
    cpu_seconds: float = 0.0    # what the attempt's process tree used, as its agent measured it
    peak_rss_bytes: int = 0
    # It never started, and no restart would change that (its program or a dir it needs is out of its user's
    # reach): the job fails at once rather than spending its restarts on it.
    permanent: bool = False

    @classmethod
    def of_returncode(cls, returncode: int, log_tail: tuple[str, ...] = ()) -> TaskExit:
        """How a process ended, from its return code as subprocess gives it (negative: the signal that killed it)."""
        if returncode < 0:
            return cls(signal=-returncode, log_tail=log_tail)
        return cls(exit_code=returncode, log_tail=log_tail)

    def to_doc(self) -> dict[str, Any]:
        """The exit as plain data, each field under its name: the shim's status file holds it so (at its top level,
        as 0.3 wrote it), and the store's documents (records.py writes every record alike)."""
        return {f.name: list(self.log_tail) if f.name == "log_tail" else getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> TaskExit:
        """An exit read back from the status file, the store or a document of an earlier release: a field it
        lacks takes its default, and what else the document holds (a task's pid, a failure's time) is not the
        exit's."""
        values = {f.name: doc[f.name] for f in fields(cls) if f.name in doc}
        if values.get("log_tail") is not None:
            values["log_tail"] = tuple(values["log_tail"])
        return cls(**values)

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0

    @property
    def preempted(self) -> bool:
        return self.exit_code == PREEMPTION_EXIT_CODE

    @property
    def unrecoverable(self) -> bool:
        """No restart would change this exit: it never started for such a reason (permanent), or the program
        said so with CONFIG_EXIT_CODE."""
        return self.permanent or self.exit_code == CONFIG_EXIT_CODE

    @property
    def saved_step(self) -> int | None:
        """The step a preemption save was made at, as the program's last lines say it (PREEMPTION_SAVED_LINE);
        None: not a preemption save, or the program did not say."""
        if not self.preempted:
            return None
        for line in reversed(self.log_tail):
            found = _PREEMPTION_SAVED_RE.search(line)
            if found:
                return int(found.group(1))
        return None

    def describe(self) -> str:
        """`exited with code 3`, `killed by SIGKILL`, or the reason it never ran, with the message after."""
        if self.signal:
            how = f"killed by {exit_words(None, self.signal)}"
        elif self.exit_code is not None:
            how = f"exited with code {self.exit_code}"
        else:
            return self.message or "failed"
        return f"{how} ({self.message})" if self.message else how


@dataclass(frozen=True)
class TaskReport:
    """An attempt's condition, from its agent: RUNNING (perhaps listening), or ended with `exit`."""
    attempt: Attempt
    phase: Phase
    pid: int = 0
    listening: bool = False
    exit: TaskExit | None = None


@dataclass(frozen=True)
class TaskProgress:
    """A running attempt's progress, sent with every heartbeat: also the agent's list of what it runs."""
    attempt: Attempt
    output_bytes: int = 0
    checkpoint: str = ""  # newest committed checkpoint in its checkpoint dir
    cpu_seconds: float = 0.0  # its process tree's CPU time so far, as its shim measures it
    rss_bytes: int = 0        # its process tree's resident memory now
    peak_rss_bytes: int = 0   # ... and the most it has held
    phase_detail: str = ""    # what a starting task waits for ("building environment (12 s)")
    gpu_utilization: float | None = None  # its GPUs' mean utilisation now, 0..1 (NVML); None: not read


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of one checkpoint."""
    checkpoint: str
    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    time: float = 0.0


def is_training(task_type: str) -> bool:
    """True for a training task (chief, worker, ps): the evaluator and the tf.data service run beside training,
    never in it, and the job's outcome is training's alone."""
    return task_type != EVALUATOR and task_type not in DATA_SERVICE_TYPES


def has_tf_config(task_type: str) -> bool:
    """The task gets a TF_CONFIG: every type TensorFlow knows (the tf.data service's roles are not among them)."""
    return task_type not in DATA_SERVICE_TYPES


def size_text(size: int) -> str:
    """Bytes as people read them, in powers of 1024: `16 GiB`, `16.4 GiB`, `200 MiB`, `512 B`."""
    value, unit = float(size), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f}".removesuffix(".0") + f" {unit}"


def exit_words(exit_code: int | None, signal: int | None) -> str:
    """A task's exit as a table says it, in the words its failure does: `3` (its code), `SIGKILL` (the signal that
    killed it), "" (none: it runs, or never ran)."""
    if signal:
        return signal_name(signal)
    return "" if exit_code is None else str(exit_code)


def signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class SyncResult:
    """How a copy of a job's checkpoint dir to other agents went (SyncCheckpoints' answer)."""
    job_id: str
    sync_id: int
    ok: bool
    message: str = ""
    bytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class EnvironmentSpec:
    """A spec's [environment]: the Python packages its tasks need beyond the agent's, in a virtualenv per node.
    Paths are relative to the workdir."""
    requirements: str = ""  # a requirements file; "": none
    isolated: bool = False  # True: the environment does not see the agent's site-packages
    project: str = ""       # a dir with pyproject.toml (and uv.lock); "": none

    def __bool__(self) -> bool:
        return bool(self.requirements or self.project)
