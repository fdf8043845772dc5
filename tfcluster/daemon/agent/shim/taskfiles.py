"""The files of one attempt dir that the agent and the task's shim (shim/runner.py) hand each other, typed:
the launch file (what to run, written by the agent), the status file (how the task runs or ended, written by
the shim), the usage file (what the running task uses, written by the shim) and the stop file (the grace period
of the latest stop, written by the agent).

Every reader and writer of these files goes through this module. A shim outlives the agent that started it
(tasks survive an agent upgrade), so a file written by an older release must still read: each file carries
the format it was written in (`format`; 0.3 wrote none, which is format 0, the same fields), fields are only
ever added, and a field this release does not know is ignored. Bad content raises TaskFileError naming the
file and the field.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tfcluster import layout
from tfcluster.model import DEFAULT_STOP_SIGNAL, STOP_SIGNALS, Attempt, TaskExit
from tfcluster.states import ENDED_PHASES, Phase

READ_BYTES = 1 << 20  # a read's size: a task file is a few KB, an events file may have grown to MBs
FORMAT = 1  # what this release writes; 0: the files of 0.3, which had no `format` field
DEFAULT_STOP_GRACE_SECONDS = 30.0


class TaskFileError(ValueError):
    """A task file whose content is not what its writer would have written."""


def write_json_atomic(path: Path, data: dict, mode: int = 0o600, group: int = -1, durable: bool = True) -> None:
    """Replaces path with data, so a reader sees the old file or the new one, never half of one; by default
    readable by the agent's user only (the launch file holds the task's environment), or also by a group (a
    job reads its control file). Durable: on disk before it replaces the old file, so it survives a power
    loss too; what is only ever read back within the same boot needs no fsync (see _TaskFile.durable)."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    # On the descriptor itself: a file object would also ask whether it is a terminal and where it stands (four
    # system calls more, each of which hands the interpreter to the agent's other threads, for each task's files).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        if group != -1:
            os.fchown(fd, -1, group)
        os.fchmod(fd, mode)
        _write_all(fd, json.dumps(data).encode())  # in one piece: json.dump encodes in Python, chunk by chunk
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_bytes(path: Path, offset: int = 0) -> bytes:
    """The file's bytes from offset to its end, read on its descriptor (see write_json_atomic)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.pread(fd, READ_BYTES, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class _Fields:
    """One file's JSON object, read field by field: a missing optional field takes its default, a field of the
    wrong type raises TaskFileError naming the file and the field."""

    def __init__(self, path: Path, content: str | bytes):
        self.path = path
        try:
            self.doc = json.loads(content)
        except ValueError as e:
            raise TaskFileError(f"{path}: not JSON ({e})") from None
        if not isinstance(self.doc, dict):
            raise TaskFileError(f"{path}: expected a JSON object, got {type(self.doc).__name__}")

    def get(self, name: str, kinds: type | tuple[type, ...], default: Any = ...) -> Any:
        """The field's value; its default when it is missing (or null, where the default is None)."""
        if name not in self.doc or (self.doc[name] is None and default is None):
            if default is ...:
                raise TaskFileError(f"{self.path}: field {name!r} is missing")
            return default
        value = self.doc[name]
        # JSON's true is no number here, though Python's bool is an int.
        if isinstance(value, kinds) and not (isinstance(value, bool) and bool not in _tuple(kinds)):
            return value
        wanted = " or ".join(k.__name__ for k in _tuple(kinds))
        raise TaskFileError(f"{self.path}: field {name!r}: expected {wanted}, got {value!r:.80}")

    def strings(self, name: str, default: Any = ...) -> tuple[str, ...]:
        value = self.get(name, list, default)
        if not all(isinstance(item, str) for item in value):
            raise TaskFileError(f"{self.path}: field {name!r}: expected a list of strings")
        return tuple(value)


def _tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _read(path: Path) -> _Fields | None:
    try:
        content = read_bytes(path)  # json.loads takes bytes: bytes that are not UTF-8 are "not JSON" (_Fields)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TaskFileError(f"{path}: unreadable ({e.strerror or e})") from None
    return _Fields(path, content)


class _TaskFile:
    """A file named NAME in the attempt dir, written whole (to_json) and read field by field (from_json)."""
    NAME: ClassVar[str]

    @property
    def durable(self) -> bool:
        """Whether the file must survive a power loss. A task's exit must: a rebooted node's agent still reports
        it. What is read back within the same boot (by the shim, by a restarted agent, from the page cache)
        need not: after a power loss nothing of before runs, and a launch file or RUNNING status that never
        reached the disk leaves the agent as much to reattach to as one that did: nothing. Skipping its fsync
        takes milliseconds off each task's start."""
        return True

    def write(self, attempt_dir: Path) -> None:
        write_json_atomic(attempt_dir / self.NAME, self.to_json(), durable=self.durable)

    @classmethod
    def read(cls, attempt_dir: Path):
        """The attempt's file; None when it has none (yet)."""
        f = _read(attempt_dir / cls.NAME)
        return None if f is None else cls.from_json(f)


# ---- the launch file -----------------------------------------------------------------------------

@dataclass(frozen=True)
class LaunchFile(_TaskFile):
    """What the shim runs, and how."""
    NAME: ClassVar[str] = layout.LAUNCH_FILE
    attempt: Attempt
    command: tuple[str, ...]
    env: dict[str, str] = field(repr=False)  # secrets: never in a log line
    workdir: str = ""
    port: int = 0
    stop_grace_seconds: float = DEFAULT_STOP_GRACE_SECONDS
    log_limit_bytes: int = 0  # output kept for the attempt (tasklog.py); 0: the default
    uid: int | None = None    # the task's user and group; None: the shim's own (no user switch)
    gid: int | None = None
    groups: tuple[int, ...] = ()  # its supplementary groups (an owner's account's); none for a job's own UID
    job_gid: int | None = None  # the group of the job's files, where it is not gid (an owner's account)
    task_dirs: tuple[str, ...] = ()  # dirs the spec names, made by the task's user
    private_tmp: str = ""     # the job's dir that becomes the task's /tmp; "": none
    private_tmp_unavailable: str = ""  # why the task gets no private /tmp although asked ("": it does)
    memory_bytes: int = 0     # the most memory the task's process tree may use; 0: not limited
    cgroup: str = ""          # the cgroup (v2) made for the task, which enforces memory_bytes; "": the shim does
    stop_signal: str = DEFAULT_STOP_SIGNAL  # a stop sends it to the task's group first, SIGKILL after the grace
    durable = False  # read by the shim it starts (see _TaskFile.durable)

    @property
    def file_group(self) -> int | None:
        """The group of the job's files (the task's output): the job's, whoever the task runs as."""
        return self.gid if self.job_gid is None else self.job_gid

    def to_json(self) -> dict[str, Any]:
        a = self.attempt
        return {"format": FORMAT, "job_id": a.job_id, "task_type": a.type, "task_index": a.index,
                "attempt": a.number, "command": list(self.command), "env": dict(self.env), "workdir": self.workdir,
                "port": self.port, "stop_grace_seconds": self.stop_grace_seconds,
                "log_limit_bytes": self.log_limit_bytes,
                "user": None if self.uid is None else {"uid": self.uid, "gid": self.gid, "groups": list(self.groups),
                                                       "job_gid": self.job_gid},
                "task_dirs": list(self.task_dirs), "private_tmp": self.private_tmp,
                "private_tmp_unavailable": self.private_tmp_unavailable, "memory_bytes": self.memory_bytes,
                "cgroup": self.cgroup, "stop_signal": self.stop_signal}

    @classmethod
    def from_json(cls, f: _Fields) -> LaunchFile:
        env = f.get("env", dict)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise TaskFileError(f"{f.path}: field 'env': expected strings for names and values")
        user = f.get("user", dict, None)
        uid = gid = job_gid = None
        groups: tuple[int, ...] = ()
        if user is not None:
            ids = _Fields(f.path, json.dumps(user))
            uid, gid, job_gid = ids.get("uid", int), ids.get("gid", int), ids.get("job_gid", int, None)
            groups = tuple(ids.get("groups", list, []))
            if not all(isinstance(g, int) and not isinstance(g, bool) for g in groups):
                raise TaskFileError(f"{f.path}: field 'user.groups': expected group ids")
        return cls(Attempt(f.get("job_id", str), f.get("task_type", str), f.get("task_index", int),
                           f.get("attempt", int)),
                   command=f.strings("command"), env=env, workdir=f.get("workdir", str, ""),
                   port=f.get("port", int, 0),
                   stop_grace_seconds=float(f.get("stop_grace_seconds", (int, float), DEFAULT_STOP_GRACE_SECONDS)),
                   log_limit_bytes=f.get("log_limit_bytes", int, 0), uid=uid, gid=gid, groups=groups,
                   job_gid=job_gid, task_dirs=f.strings("task_dirs", ()), private_tmp=f.get("private_tmp", str, ""),
                   private_tmp_unavailable=f.get("private_tmp_unavailable", str, ""),
                   memory_bytes=f.get("memory_bytes", int, 0), cgroup=f.get("cgroup", str, ""),
                   stop_signal=_stop_signal(f))


def _stop_signal(f: _Fields) -> str:
    name = f.get("stop_signal", str, DEFAULT_STOP_SIGNAL)
    if name not in STOP_SIGNALS:
        raise TaskFileError(f"{f.path}: field 'stop_signal': expected one of: {', '.join(STOP_SIGNALS)}, got {name!r}")
    return name



# What the agent, not the shim, knows of an exit: the port it found taken, the final checkpoint it found.
AGENT_ADDS = ("busy_port", "final_checkpoint")

# ---- the status file -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ShimStatus(_TaskFile):
    """How the attempt runs or ended, as its shim recorded it: the first of the exit's shapes (then the
    task report on the wire, the coordinator's task record, the status views)."""
    NAME: ClassVar[str] = layout.STATUS_FILE
    phase: str                # RUNNING, EXITED or FAILED_TO_START
    attempt: int = 0
    shim_pid: int = 0
    pid: int = 0              # the task's pid, also its process group
    pgid: int = 0
    started: float = 0.0      # time.time() when the task started
    finished: float = 0.0     # ... and when it ended
    stopped: bool = False     # it ended after a stop was asked for
    exit: TaskExit | None = None  # with EXITED or FAILED_TO_START
    # When the shim process started (clock ticks since boot, /proc/PID/stat): with shim_pid, it names the shim
    # for good, pids being reused; 0 in files of earlier releases, whose shims carry their attempt dir in their
    # command line instead.
    shim_started: int = 0

    @property
    def ended(self) -> bool:
        return self.phase in ENDED_PHASES

    @property
    def durable(self) -> bool:
        return self.ended  # the exit; a RUNNING status only tells a restarted agent what to reattach to

    def to_json(self) -> dict[str, Any]:
        # The exit's fields are at the top level, as 0.3 wrote them: an agent of 0.3 reads this file too.
        doc: dict[str, Any] = {"format": FORMAT, "shim_pid": self.shim_pid, "attempt": self.attempt,
                               "phase": self.phase}
        if self.shim_started:
            doc["shim_started"] = self.shim_started
        if self.pid:
            doc.update(pid=self.pid, pgid=self.pgid)
        if self.started:
            doc["started"] = self.started
        if self.ended:
            doc.update(finished=self.finished, stopped=self.stopped)
        if self.exit is not None:  # what the shim knows of it: the agent adds the rest (taskrecord.exit_of)
            doc.update({name: value for name, value in self.exit.to_doc().items()
                        if value is not None and name not in AGENT_ADDS and (name != "permanent" or value)})
        return doc

    @classmethod
    def from_json(cls, f: _Fields) -> ShimStatus:
        phase = f.get("phase", str)
        if phase not in (Phase.RUNNING, *ENDED_PHASES):
            raise TaskFileError(f"{f.path}: field 'phase': expected RUNNING, EXITED or FAILED_TO_START, "
                                f"got {phase!r:.80}")
        exit = None
        if phase in ENDED_PHASES:  # each field's type checked here, then read as any exit is (TaskExit.from_doc)
            exit = TaskExit.from_doc({
                "exit_code": f.get("exit_code", int, None), "signal": f.get("signal", int, None),
                "message": f.get("message", str, ""), "log_tail": f.strings("log_tail", ()),
                "cpu_seconds": float(f.get("cpu_seconds", (int, float), 0.0)),
                "peak_rss_bytes": f.get("peak_rss_bytes", int, 0), "permanent": f.get("permanent", bool, False)})
        return cls(phase, attempt=f.get("attempt", int, 0), shim_pid=f.get("shim_pid", int, 0),
                   shim_started=f.get("shim_started", int, 0), pid=f.get("pid", int, 0), pgid=f.get("pgid", int, 0),
                   started=float(f.get("started", (int, float), 0.0)),
                   finished=float(f.get("finished", (int, float), 0.0)), stopped=f.get("stopped", bool, False),
                   exit=exit)



# ---- the usage file ------------------------------------------------------------------------------

@dataclass(frozen=True)
class UsageFile(_TaskFile):
    """What the running task's process tree uses, as its shim last measured it (treewatch.py)."""
    NAME: ClassVar[str] = layout.USAGE_FILE
    cpu_seconds: float = 0.0
    rss_bytes: int = 0
    peak_rss_bytes: int = 0
    durable = False  # read by the agent while the task runs (see _TaskFile.durable)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "cpu_seconds": self.cpu_seconds, "rss_bytes": self.rss_bytes,
                "peak_rss_bytes": self.peak_rss_bytes}

    @classmethod
    def from_json(cls, f: _Fields) -> UsageFile:
        return cls(float(f.get("cpu_seconds", (int, float), 0.0)), f.get("rss_bytes", int, 0),
                   f.get("peak_rss_bytes", int, 0))


# ---- the stop file -------------------------------------------------------------------------------

def write_stop(attempt_dir: Path, grace_seconds: float) -> None:
    """Read by the running shim: no power loss between (see _TaskFile.durable)."""
    write_json_atomic(attempt_dir / layout.STOP_FILE, {"format": FORMAT, "grace_seconds": grace_seconds},
                      durable=False)


def read_stop_grace(attempt_dir: Path) -> float | None:
    """The grace period of the latest stop asked for; None when none was."""
    f = _read(attempt_dir / layout.STOP_FILE)
    return None if f is None else float(f.get("grace_seconds", (int, float)))
