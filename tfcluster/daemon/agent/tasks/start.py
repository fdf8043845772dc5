"""The slow part of starting one attempt, run on a thread of its own (supervisor.py records the launch and hands it
here, so the agent's message loop never waits on a disk, a fetch, a build or the launcher): a named list of steps
(TaskStarter.steps: the order checked, the task's user and the job's and attempt's dirs, its environment
variables, the job's code, its virtualenv, the launch file), then the shim, forked by the launcher (launcher.py).

Each step that can take long checks whether the attempt was stopped meanwhile (record.exited), and gives up
with StartError; the supervisor decides what a stop during the start means once the shim exists.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tfcluster import grpc_settings, layout
from tfcluster.commands import Launch
from tfcluster.daemon.agent.code.environments import Environments, task_environment
from tfcluster.daemon.agent.code.task_code import TaskCode
from tfcluster.daemon.agent.shim.cgroups import TaskCgroups
from tfcluster.daemon.agent.shim.taskfiles import LaunchFile
from tfcluster.daemon.agent.tasks.launcher import ForkedShim, Launcher
from tfcluster.daemon.agent.tasks.record import TaskRecord
from tfcluster.daemon.agent.tasks.users import (PRIVATE_FILE_MODE, JobPaths, TaskUser,
                                             TaskUserError, TaskUsers, create_file, prepare_attempt, prepare_job,
                                             prepare_summary_dir, private_tmp_problem)
from tfcluster.daemon.logformat import fields

NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"
log = logging.getLogger("tfcluster.agent")


class StartError(Exception):
    """Why an attempt cannot start, as its FAILED_TO_START report says it."""

    def __init__(self, message: str, busy_port: int = 0):
        super().__init__(message)
        self.busy_port = busy_port


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


def inherited_environment() -> dict[str, str]:
    """The agent's environment, less its own settings (a join token, a token file, the gRPC settings it made for
    itself): TFCLUSTER_* in a task's environment is what tfcluster sets for that task."""
    return with_agent_python({k: v for k, v in grpc_settings.without_ours(os.environ).items()
                              if not k.startswith(layout.RESERVED_ENV_PREFIX)})


def with_agent_python(env: dict[str, str]) -> dict[str, str]:
    """env with the agent's virtualenv first on PATH, when the agent runs from one, as `activate` would put it:
    `python3` in a spec is then the Python that has tfcluster (and the `tf` extra installed beside it), not the
    system's, which has neither. A system-wide agent changes nothing: reordering PATH there could shadow what the
    operator put first."""
    if sys.prefix == sys.base_prefix:
        return env
    bin_dir = os.path.dirname(sys.executable)
    path = env.get("PATH") or os.defpath
    if path.split(os.pathsep)[0] == bin_dir:
        return env
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{path}"}


@dataclass
class Start:
    """One attempt's start, as its steps make it: who it runs as, its job's dirs, its environment, its workdir."""
    record: TaskRecord
    order: Launch
    user: TaskUser | None = None
    paths: JobPaths | None = None
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""


class TaskStarter:
    def __init__(self, state_dir: Path, launch_refusal: Callable[[], str], log_limit_bytes: int,
                 task_users: TaskUsers, environments: Environments):
        self.state_dir = state_dir
        self.launch_refusal = launch_refusal  # why no task may start on this node now ("": they may)
        self.log_limit_bytes = log_limit_bytes  # output kept per attempt (tasklog.py)
        self.task_users = task_users  # who each task runs as (tasks/users.py)
        self.environments = environments  # jobs' virtualenvs (environments.py)
        self.launcher = Launcher()  # forks the shims (launcher.py)
        self.cgroups: TaskCgroups | None = None  # keeps tasks' memory limits where the kernel can (cgroups.py)
        self.code: TaskCode | None = None  # fetches jobs' code and makes tasks' working dirs over it (code/task_code.py)
        self.nccl_interface = ""  # the interface of the node's advertise address: NCCL_SOCKET_IFNAME of GPU tasks
        # What every task inherits of the agent's environment, read once: a daemon's environment is its unit's and
        # does not change while it runs, and reading os.environ decodes each variable again (43 µs a task with 35
        # variables, measured).
        self.inherited_env = inherited_environment()
        # What an attempt's start does before its shim, in order, each a method below: the way the agent's per-task
        # hooks are listed (hooks/api.py), so the whole start reads here, top to bottom.
        self.steps: tuple[Callable[[Start], None], ...] = (
            self._check_order, self._take_user_and_dirs, self._set_environment, self._bring_code,
            self._build_environment, self._check_still_wanted, self._check_port, self._write_files)

    def start(self, record: TaskRecord, order: Launch) -> ForkedShim | subprocess.Popen:
        """Makes what the attempt needs, step by step, and starts its shim. Raises StartError (or the OSError,
        CodeError or EnvironmentProblem of the step that failed) with why it cannot start."""
        start = Start(record, order)
        for step in self.steps:
            step(start)
        return self._start_shim(record, no_new_privileges=start.user.switches)

    def _check_order(self, start: Start) -> None:
        order = start.order
        if any("\0" in text for text in (*order.command, order.workdir, *order.env, *order.env.values())):
            raise StartError("the command, the environment or the workdir holds a NUL character")
        refusal = self.launch_refusal()
        if refusal:
            raise StartError(refusal)

    def _take_user_and_dirs(self, start: Start) -> None:
        """Who the task runs as, and the job's and the attempt's dirs, theirs."""
        order, record = start.order, start.record
        try:
            start.user = self.task_users.for_launch(order.uid, order.gid, order.owner, order.node)
            start.paths = prepare_job(self.state_dir, record.attempt.job_id, start.user)
            prepare_attempt(record.dir, start.user)
            if not order.env.get(layout.SUMMARY_DIR):
                prepare_summary_dir(Path(record.summary_dir), start.user)
        except TaskUserError as e:
            raise StartError(str(e)) from None
        record.group = start.user.owner(private=False)[1]  # the job's group, whoever the task runs as
        record.uid = start.user.uid  # the agent reads only what this user made (handback.py)

    def _set_environment(self, start: Start) -> None:
        start.env = self._environment(start.record, start.order, start.user, start.paths)
        start.workdir = start.order.workdir
        # NCCL picks an interface of its own, often one the other nodes cannot reach (docker0, a second NIC): a GPU
        # task gets the one its peers reach this node by, unless the job or the operator chose one.
        if self.nccl_interface and start.env.get(layout.CUDA_VISIBLE_DEVICES, "-1") != "-1":
            start.env.setdefault(NCCL_SOCKET_IFNAME, self.nccl_interface)

    def _bring_code(self, start: Start) -> None:
        """The job's code on this node (fetched if it lacks it), and the task's own working dir over it."""
        order, record = start.order, start.record
        if not order.code_sha256:
            return
        if self.code is None:
            raise StartError("the job ships its code and this agent cannot fetch it")
        start.workdir = self.code.working_dir(record.attempt, record.dir, order, start.user.uid, start.user.gid,
                                              start.env, stopped=record.exited.is_set)

    def _build_environment(self, start: Start) -> None:
        """The job's virtualenv, from what its code asks for (so after the code is here), read as its user."""
        if start.order.environment:
            venv = self.environments.prepare(start.record.attempt.job_id, start.order.environment, start.workdir,
                                             start.user)
            start.env = task_environment(venv, start.env)

    @staticmethod
    def _check_still_wanted(start: Start) -> None:
        if start.record.exited.is_set():
            raise StartError("stopped before it started")

    @staticmethod
    def _check_port(start: Start) -> None:
        port = start.order.port
        if port and port_in_use(port):
            raise StartError(f"port {port} is already in use on this node", busy_port=port)

    def _write_files(self, start: Start) -> None:
        """The events file the task appends to (the attempt dir is root's: the task cannot make it), then the launch
        file. The control file the task reads is written when there is something to say (supervisor.py's
        finish_training): until then, reading it finds nothing, which says training runs (checkpoints.py)."""
        record, order, user, paths, env, workdir = (start.record, start.order, start.user, start.paths, start.env,
                                                    start.workdir)
        # Dirs the spec names are made by the task's user (in the shim), never by root here.
        checkpoints = str(paths.checkpoints)  # compared as text first: making Paths costs more than the rest here
        task_dirs = [env[name] for name in (layout.CHECKPOINT_DIR, layout.MODEL_DIR)
                     if env.get(name) and env[name] != checkpoints and Path(env[name]) != paths.checkpoints]
        create_file(record.events_path, PRIVATE_FILE_MODE, *user.owner(private=True))
        private_tmp = self.task_users.agent_is_root and self.task_users.private_tmp
        LaunchFile(record.attempt, order.command, env, workdir, order.port, order.stop_grace_seconds,
                   self.log_limit_bytes, uid=user.uid if user.switches else None,
                   gid=user.gid if user.switches else None, groups=user.groups,
                   job_gid=user.job_gid, task_dirs=tuple(task_dirs),
                   private_tmp=str(paths.tmp) if private_tmp else "",
                   private_tmp_unavailable=private_tmp_problem(self.state_dir) if private_tmp else "",
                   memory_bytes=order.memory_bytes, cgroup=self._cgroup(record, order.memory_bytes),
                   stop_signal=order.stop_signal).write(record.dir)

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

    def _start_shim(self, record: TaskRecord, no_new_privileges: bool) -> ForkedShim | subprocess.Popen:
        """Forked by the launcher (a millisecond), or one it forked before, free again (forked_shim.py); when it
        cannot serve, a fresh interpreter (100 ms of CPU). no_new_privileges: the task runs with none (the launch
        file names its user)."""
        shim_log = os.open(record.dir / layout.SHIM_LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                           0o600)
        try:
            try:
                return self.launcher.spawn(record.dir, shim_log, no_new_privileges)
            except OSError as e:  # where none can ever serve, the launcher said so once, when the agent started
                log.log(logging.DEBUG if self.launcher.unavailable else logging.WARNING,
                        "%s: the task launcher cannot start its shim (%s); starting it directly", record.name, e,
                        extra=fields(record.attempt))
            return subprocess.Popen([sys.executable, "-m", "tfcluster.daemon.agent.shim.runner", str(record.dir)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=shim_log,
                                    start_new_session=True, close_fds=True)
        finally:
            os.close(shim_log)

    def _environment(self, record: TaskRecord, order: Launch, user: TaskUser, paths: JobPaths) -> dict[str, str]:
        """The agent's environment as inherited_environment gives it; HOME and TMPDIR are the job's own on this
        node (a spec may set others); a task run as its owner's account has that account's home, where it exists."""
        home = user.home if user.home and os.path.isdir(user.home) else str(paths.home)
        own = {"HOME": home, "TMPDIR": str(paths.tmp)}
        if user.switches:
            own.update(USER=user.name, LOGNAME=user.name)
        return {**self.inherited_env, **own, **order.env, layout.EVENTS_FILE: str(record.events_path),
                layout.CONTROL_FILE: str(record.control_path), layout.SUMMARY_DIR: record.summary_dir}
