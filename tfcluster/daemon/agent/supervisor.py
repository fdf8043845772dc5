"""Starts, stops and watches a node's tasks, each through its own shim (taskrunner.py), forked by the
launcher (launcher.py).

Exits are seen at once: a thread waits on each shim's pidfd (or on the shim itself, when the agent had to start
it as its own child), also for shims adopted after an agent restart. Every change becomes a report for the
coordinator through on_report. Task files live in one directory per attempt (layout.attempt_dir).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tfcluster import layout
from tfcluster.daemon.agent.cgroups import TaskCgroups
from tfcluster.codechunks import CodeError
from tfcluster.daemon.agent.environments import Environments, EnvironmentProblem, task_environment
from tfcluster.daemon.agent.launcher import ForkedShim, Launcher
from tfcluster.daemon.agent.taskcode import TaskCode
from tfcluster.daemon.agent.tasklog import DEFAULT_LIMIT_BYTES, total_bytes
from tfcluster.daemon.agent.taskfiles import (LaunchFile, ShimStatus, TaskFileError, UsageFile, write_json_atomic,
                                              write_stop)
from tfcluster.daemon.agent.taskrecord import TaskKey, TaskRecord, exit_of, is_shim, newest_checkpoint
from tfcluster.daemon.agent.taskrunner import group_alive, kill_group
from tfcluster.daemon.agent.taskuser import (JOB_READABLE_FILE_MODE, PRIVATE_FILE_MODE, JobPaths, TaskUser,
                                             TaskUserError, TaskUsers, create_file, prepare_attempt, prepare_job,
                                             private_tmp_problem)
from tfcluster.daemon.logformat import fields
from tfcluster.model import Attempt, Launch, TaskExit, TaskProgress
from tfcluster.states import Phase
log = logging.getLogger("tfcluster.agent")

FINISHED_KEPT_SECONDS = 3600.0
LISTEN_POLL_SECONDS = 0.1
ADOPTED_POLL_SECONDS = 0.5


def port_in_use(port: int) -> bool:
    """True when something listens on the port. SO_REUSEADDR, as servers (gRPC, TensorFlow) set it: the
    TIME_WAIT connections a finished task leaves behind do not make its port busy."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


class Supervisor:
    def __init__(self, state_dir: Path, on_report: Callable[[TaskRecord], None],
                 launch_refusal: Callable[[], str] = lambda: "", log_limit_bytes: int = DEFAULT_LIMIT_BYTES,
                 task_users: TaskUsers | None = None, environments: Environments | None = None):
        self.state_dir = state_dir
        self.task_users = task_users or TaskUsers()  # who each task runs as (taskuser.py)
        self.on_report = on_report
        self.launch_refusal = launch_refusal  # why no task may start on this node now ("": they may)
        self.log_limit_bytes = log_limit_bytes  # output kept per attempt (tasklog.py)
        self.lock = threading.Lock()
        self.tasks: dict[TaskKey, TaskRecord] = {}
        self.launcher = Launcher()  # forks the shims (launcher.py)
        self.cgroups: TaskCgroups | None = None  # keeps tasks' memory limits where the kernel can (cgroups.py)
        self.code: TaskCode | None = None  # fetches jobs' code and makes tasks' working dirs over it (taskcode.py)
        self.environments = environments or Environments(state_dir)  # jobs' virtualenvs (environments.py)

    # ---- launching -------------------------------------------------------------------------------

    def launch(self, order: Launch) -> None:
        """Starts an attempt, unless it is known: then its current state is reported again (a resent launch)."""
        a = order.attempt
        key = (a.job_id, a.type, a.index)
        with self.lock:
            current = self.tasks.get(key)
            if current is not None and current.attempt.number >= a.number:
                if current.attempt.number == a.number and current.phase != Phase.STARTING:
                    self.on_report(current)
                return
            if current is not None and current.phase in (Phase.STARTING, Phase.RUNNING):
                log.warning("%s still runs while attempt %d is launched: killing it", current.name, a.number,
                            extra=fields(current.attempt))
                self._kill_now(current)
                if current.detail and not current.shim_pid:  # waiting for its environment: it must not start
                    current.exited.set()
            record = TaskRecord(a, layout.attempt_dir(self.state_dir, a.job_id, a.type, a.index, a.number),
                                port=order.port, gpus=order.env.get(layout.CUDA_VISIBLE_DEVICES, ""),
                                summary_dir=order.env.get(layout.SUMMARY_DIR, ""),
                                # Known before the task starts: a shipping order may come while its code is fetched.
                                checkpoint_dir=order.env.get(layout.CHECKPOINT_DIR, ""))
            self.tasks[key] = record
        if order.code_sha256 or order.environment:  # a fetch or a build may take a while: the loop goes on
            if order.environment:
                record.detail, record.detail_since = "building environment", time.monotonic()
            threading.Thread(target=self._begin, args=(record, order), name=f"start-{record.name}",
                             daemon=True).start()
        else:
            self._begin(record, order)

    def _begin(self, record: TaskRecord, order: Launch) -> None:
        try:
            shim = self._start(record, order)
        except Exception as e:  # whatever it is, the coordinator hears of it: a task never stays launching
            known = isinstance(e, (_StartError, OSError, CodeError, EnvironmentProblem))
            message = str(e) if known else f"{type(e).__name__}: {e}"
            self._finish(record, Phase.FAILED_TO_START, TaskExit(message=message, busy_port=getattr(e, "busy_port", 0),
                                                                 log_tail=getattr(e, "log_tail", ())))
            return
        record.shim_pid, record.detail = shim.pid, ""
        if record.exited.is_set():  # stopped while its environment was built: the shim stops it at once
            self._stop_shim(record)
        threading.Thread(target=self._watch_child, args=(record, shim), name=f"watch-{record.name}",
                         daemon=True).start()
        if order.report_listening and order.port:
            threading.Thread(target=self._watch_listening, args=(record,), name=f"listen-{record.name}",
                             daemon=True).start()

    def _start(self, record: TaskRecord, order: Launch) -> subprocess.Popen:
        if any("\0" in text for text in (*order.command, order.workdir, *order.env, *order.env.values())):
            raise _StartError("the command, the environment or the workdir holds a NUL character")
        refusal = self.launch_refusal()
        if refusal:
            raise _StartError(refusal)
        try:
            user = self.task_users.for_launch(order.uid, order.gid, order.owner, order.node)
            paths = prepare_job(self.state_dir, record.attempt.job_id, user)
            prepare_attempt(record.dir, user)
        except TaskUserError as e:
            raise _StartError(str(e)) from None
        env = self._environment(record, order, user, paths)
        if order.code_sha256 and self.code is None:
            raise _StartError("the job ships its code and this agent cannot fetch it")
        workdir = order.workdir if not order.code_sha256 else self.code.working_dir(  # the fetch, if one is needed
            record.attempt, record.dir, order, user.uid, user.gid, env, stopped=record.exited.is_set)
        if order.environment:  # built from what the job's code asks for: after the code is here
            env = task_environment(self.environments.prepare(record.attempt.job_id, order.environment, workdir), env)
        if record.exited.is_set():
            raise _StartError("stopped before it started")
        if order.port and port_in_use(order.port):
            raise _StartError(f"port {order.port} is already in use on this node", busy_port=order.port)
        record.group = user.owner(private=False)[1]  # the job's group, whoever the task runs as
        # Dirs the spec names are made by the task's user (in the shim), never by root here.
        task_dirs = [env[name] for name in (layout.CHECKPOINT_DIR, layout.MODEL_DIR)
                     if env.get(name) and Path(env[name]) != paths.checkpoints]
        create_file(record.events_path, PRIVATE_FILE_MODE, *user.owner(private=True))
        write_json_atomic(record.control_path, {}, mode=JOB_READABLE_FILE_MODE, group=record.group, durable=False)
        private_tmp = self.task_users.agent_is_root and self.task_users.private_tmp
        LaunchFile(record.attempt, order.command, env, workdir, order.port, order.stop_grace_seconds,
                   self.log_limit_bytes, uid=user.uid if user.switches else None,
                   gid=user.gid if user.switches else None, groups=user.groups,
                   job_gid=user.job_gid, task_dirs=tuple(task_dirs),
                   private_tmp=str(paths.tmp) if private_tmp else "",
                   private_tmp_unavailable=private_tmp_problem(self.state_dir) if private_tmp else "",
                   memory_bytes=order.memory_bytes, cgroup=self._cgroup(record, order.memory_bytes)).write(record.dir)
        return self._start_shim(record)

    def _cgroup(self, record: TaskRecord, limit: int) -> str:
        """The task's own cgroup with its memory limit; "": its shim keeps the limit by watching (or none)."""
        if not limit or self.cgroups is None or self.cgroups.delegated is None:
            return ""
        a = record.attempt
        try:
            return self.cgroups.make(f"{a.job_id}.{a.type}-{a.index}.{a.number}", limit)
        except OSError as e:
            log.warning("%s: cannot make its cgroup (%s); its shim keeps its memory limit by watching", record.name,
                        e, extra=fields(a))
            return ""

    def _start_shim(self, record: TaskRecord) -> ForkedShim | subprocess.Popen:
        """Forked by the launcher (a millisecond), or, when it cannot serve, a fresh interpreter (100 ms of CPU)."""
        shim_log = os.open(record.dir / layout.SHIM_LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                           0o600)
        try:
            try:
                return self.launcher.spawn(record.dir, shim_log)
            except OSError as e:  # where none can ever serve, the launcher said so once, when the agent started
                log.log(logging.DEBUG if self.launcher.unavailable else logging.WARNING,
                        "%s: the task launcher cannot start its shim (%s); starting it directly", record.name, e,
                        extra=fields(record.attempt))
            return subprocess.Popen([sys.executable, "-m", "tfcluster.daemon.agent.taskrunner", str(record.dir)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=shim_log,
                                    start_new_session=True, close_fds=True)
        finally:
            os.close(shim_log)

    @staticmethod
    def _environment(record: TaskRecord, order: Launch, user: TaskUser, paths: JobPaths) -> dict[str, str]:
        """The agent's environment, less its own settings (a join token, a token file): TFCLUSTER_* in a task's
        environment is what tfcluster sets for that task. HOME and TMPDIR are the job's own on this node (a
        spec may set others); a task run as its owner's account has that account's home, where it exists."""
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(layout.RESERVED_ENV_PREFIX)}
        home = user.home if user.home and os.path.isdir(user.home) else str(paths.home)
        own = {"HOME": home, "TMPDIR": str(paths.tmp)}
        if user.switches:
            own.update(USER=user.name, LOGNAME=user.name)
        return {**inherited, **own, **order.env, layout.EVENTS_FILE: str(record.events_path),
                layout.CONTROL_FILE: str(record.control_path)}

    def _watch_listening(self, record: TaskRecord) -> None:
        """Reports the task again once it accepts connections on its port."""
        while not record.exited.is_set():
            if record.phase == Phase.RUNNING:
                with socket.socket() as s:
                    s.settimeout(1.0)
                    if s.connect_ex(("127.0.0.1", record.port)) == 0:
                        record.listening = True
                        log.info("%s listens on port %d", record.name, record.port, extra=fields(record.attempt))
                        self.on_report(record)
                        return
            record.exited.wait(LISTEN_POLL_SECONDS)

    def _watch_child(self, record: TaskRecord, shim: ForkedShim | subprocess.Popen) -> None:
        line = shim.stdout.readline()
        try:
            started = json.loads(line) if line else {}
        except ValueError:
            started = {}
        if started.get("phase") == Phase.RUNNING:
            with self.lock:
                record.phase, record.pid = Phase.RUNNING, started["pid"]
            log.info("%s running as pid %d", record.name, record.pid, extra=fields(record.attempt))
            self.on_report(record)
        shim.stdout.close()
        shim.wait()
        self._collect(record)

    def _collect(self, record: TaskRecord) -> None:
        """The shim is gone: read how the task ended from its status file."""
        status = _read_status(record)
        if status is not None and status.ended:
            self._finish(record, status.phase, exit_of(status, record.checkpoint_dir))
        else:
            # The shim died without recording an exit (killed with -9): make sure the task is gone too.
            pgid = (status.pgid if status is not None else 0) or record.pid
            if pgid:
                kill_group(pgid, signal.SIGKILL)
            died = "the task's supervisor process died; the task was killed"
            self._finish(record, Phase.EXITED, TaskExit(signal=signal.SIGKILL, message=died))

    def progress(self) -> list[TaskProgress]:
        """Every running task, with the bytes of output so far (dropped ones included), its newest checkpoint, and
        what its process tree uses as its shim last measured it."""
        found = []
        now = time.monotonic()
        for record in self.snapshot():
            if record.detail and record.phase == Phase.STARTING and not record.exited.is_set():
                # Listed while it waits, or the coordinator would take it for lost and launch it again.
                detail = f"{record.detail} ({now - record.detail_since:.0f} s)"
                found.append(TaskProgress(record.attempt, phase_detail=detail))
            if record.phase != Phase.RUNNING or record.exited.is_set():
                continue
            try:
                usage = UsageFile.read(record.dir) or UsageFile()
            except TaskFileError:  # left out: the attempt's exit carries its final figures all the same
                usage = UsageFile()
            found.append(TaskProgress(record.attempt, total_bytes(record.dir), newest_checkpoint(record.checkpoint_dir),
                                      usage.cpu_seconds, usage.rss_bytes, usage.peak_rss_bytes))
        return found

    def finish_training(self, attempt: Attempt, final_checkpoint: str) -> None:
        """Tells a running task (the evaluator) that training is over, through its control file."""
        record = self.current(attempt)
        if record is not None:
            write_json_atomic(record.control_path, {"training_finished": True, "final_checkpoint": final_checkpoint},
                              mode=JOB_READABLE_FILE_MODE, group=record.group, durable=False)  # for the running task

    def _finish(self, record: TaskRecord, phase: str, exit: TaskExit) -> None:
        with self.lock:
            if record.exited.is_set():
                return
            record.phase, record.exit, record.finished_at = phase, exit, time.time()
            record.exited.set()
        if self.code is not None:
            self.code.release(record.dir)
        log.info("%s ended: %s", record.name, exit.describe(), extra=fields(record.attempt))
        self.on_report(record)

    # ---- stopping --------------------------------------------------------------------------------

    def stop(self, attempt: Attempt, grace_seconds: float) -> None:
        """SIGTERM, then SIGKILL after the grace period (the shim keeps the time). Asked again with a shorter
        grace, the shim shortens it; with none, the task's process group is killed here and now."""
        record = self.current(attempt)
        if record is None or record.exited.is_set():
            return
        try:
            write_stop(record.dir, grace_seconds)
        except OSError:
            pass
        if grace_seconds <= 0 and record.pid:
            kill_group(record.pid, signal.SIGKILL)
        if not record.shim_pid and record.phase == Phase.STARTING:
            # Its code is being fetched or its environment built: it never starts (the thread sees it ended).
            self._finish(record, Phase.EXITED, TaskExit(signal=signal.SIGTERM, message="stopped before it started"))
        elif not record.shim_pid or not _signal(record.shim_pid, signal.SIGTERM):
            self._kill_now(record)

    def _stop_shim(self, record: TaskRecord) -> None:
        try:
            write_stop(record.dir, 0.0)
        except OSError:
            pass
        _signal(record.shim_pid, signal.SIGTERM)

    def _kill_now(self, record: TaskRecord) -> None:
        if record.pid:
            kill_group(record.pid, signal.SIGKILL)
        if record.shim_pid:
            _signal(record.shim_pid, signal.SIGKILL)

    def stop_all(self, grace_seconds: float, wait: bool = True) -> None:
        """Stops every task this agent supervises (used by the embedded demo and --stop-tasks-on-exit)."""
        with self.lock:
            live = [r for r in self.tasks.values() if not r.exited.is_set()]
        for record in live:
            self.stop(record.attempt, grace_seconds)
        if wait:
            for record in live:
                record.exited.wait(grace_seconds + 10)

    # ---- reattaching after an agent restart ------------------------------------------------------

    def adopt_running(self) -> int:
        """Finds tasks that a previous agent process started and that still run (or ended meanwhile)."""
        found = 0
        for directory in sorted(self.state_dir.glob(layout.ATTEMPT_DIR_GLOB)):
            try:
                status, launch = ShimStatus.read(directory), LaunchFile.read(directory)
            except TaskFileError as e:
                log.warning("not reattaching to %s: %s", directory, e)
                continue
            if status is None or launch is None:
                continue
            record = TaskRecord.from_files(directory, launch, status)
            known = self.tasks.get(record.key)
            if known is not None and known.attempt.number >= launch.attempt.number:
                continue
            if status.phase == Phase.RUNNING:
                if not is_shim(record.shim_pid, record.dir, record.shim_started):
                    if record.pid and group_alive(record.pid):
                        kill_group(record.pid, signal.SIGKILL)
                    continue
                record.phase = Phase.RUNNING
                self.tasks[record.key] = record
                threading.Thread(target=self._watch_adopted, args=(record,), name=f"watch-{record.name}",
                                 daemon=True).start()
                found += 1
                log.info("reattached to %s (pid %d)", record.name, record.pid, extra=fields(record.attempt))
            elif status.ended and time.time() - status.finished < FINISHED_KEPT_SECONDS:
                # It ended while no agent watched: the coordinator still needs to hear how.
                record.phase, record.exit = status.phase, exit_of(status, record.checkpoint_dir)
                record.finished_at = status.finished
                record.exited.set()
                self.tasks[record.key] = record
        return found

    def _watch_adopted(self, record: TaskRecord) -> None:
        """Waits for an adopted shim (not our child, so no wait()) to exit, then collects its status."""
        try:
            fd = os.pidfd_open(record.shim_pid)
        except ProcessLookupError:
            self._collect(record)
            return
        except OSError:  # no pidfd (Linux < 5.3): fall back to polling the pid
            while is_shim(record.shim_pid, record.dir, record.shim_started):
                time.sleep(ADOPTED_POLL_SECONDS)
            self._collect(record)
            return
        try:
            select.select([fd], [], [])
        finally:
            os.close(fd)
        self._collect(record)

    # ---- views -----------------------------------------------------------------------------------

    def snapshot(self) -> list[TaskRecord]:
        now = time.time()
        with self.lock:
            for key in [k for k, r in self.tasks.items()
                        if r.exited.is_set() and now - r.finished_at > FINISHED_KEPT_SECONDS]:
                del self.tasks[key]
            return list(self.tasks.values())

    def running_jobs(self) -> set[str]:
        """The jobs with a task on this node that has not ended."""
        return {r.attempt.job_id for r in self.snapshot() if not r.exited.is_set()}

    def current(self, attempt: Attempt) -> TaskRecord | None:
        """The record of exactly this attempt, if it is the task's newest one here."""
        with self.lock:
            record = self.tasks.get((attempt.job_id, attempt.type, attempt.index))
        return record if record is not None and record.attempt == attempt else None

    def find(self, attempt: Attempt) -> TaskRecord | None:
        """This attempt's record, or for an older attempt whose files are still here, a record of its files."""
        record = self.current(attempt)
        if record is not None:
            return record
        path = layout.attempt_dir(self.state_dir, attempt.job_id, attempt.type, attempt.index, attempt.number)
        if path.exists():
            old = TaskRecord(attempt, path, phase=Phase.EXITED)
            old.exited.set()
            return old
        return None


class _StartError(Exception):
    def __init__(self, message: str, busy_port: int = 0):
        super().__init__(message)
        self.busy_port = busy_port


def _read_status(record: TaskRecord) -> ShimStatus | None:
    try:
        return ShimStatus.read(record.dir)
    except TaskFileError as e:
        log.warning("%s: %s", record.name, e, extra=fields(record.attempt))
        return None


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
