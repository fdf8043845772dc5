"""Starts, stops and watches a node's tasks, each through its own shim (taskrunner.py).

Exits are seen at once: a thread waits on each shim (a child of this agent), or on a pidfd for shims
adopted after an agent restart. Every change becomes a report for the coordinator through on_report.
Task files live under <state-dir>/jobs/<job>/tasks/<type>-<index>/attempt-<n>/.
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
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tfcluster.daemon.agent.taskrunner import group_alive, kill_group, write_json_atomic
from tfcluster.task import latest_checkpoint

log = logging.getLogger("tfcluster.agent")

TaskKey = tuple[str, str, int]  # job id, task type, task index
FINISHED_KEPT_SECONDS = 3600.0
LISTEN_POLL_SECONDS = 0.1
ADOPTED_POLL_SECONDS = 0.5


@dataclass
class TaskRecord:
    """One attempt of one task on this node, as the agent knows it."""
    job_id: str
    task_type: str
    task_index: int
    attempt: int
    dir: Path
    phase: str = "STARTING"  # STARTING | RUNNING | EXITED | FAILED_TO_START
    pid: int = 0
    shim_pid: int = 0
    exit_code: int | None = None
    signal: int | None = None
    message: str = ""
    log_tail: list[str] = field(default_factory=list)
    finished_at: float = 0.0
    busy_port: int = 0
    port: int = 0
    checkpoint_dir: str = ""
    listening: bool = False
    final_checkpoint: str = ""
    exited: threading.Event = field(default_factory=threading.Event)

    @property
    def key(self) -> TaskKey:
        return (self.job_id, self.task_type, self.task_index)

    @property
    def log_path(self) -> Path:
        return self.dir / "output.log"

    @property
    def events_path(self) -> Path:
        """Where the task appends its events (evaluation results), one JSON object a line."""
        return self.dir / "events.jsonl"

    @property
    def control_path(self) -> Path:
        """What the coordinator tells the task while it runs (training finished, final checkpoint)."""
        return self.dir / "control.json"

    @property
    def name(self) -> str:
        return f"{self.job_id} {self.task_type}:{self.task_index} attempt {self.attempt}"


def attempt_dir(state_dir: Path, job_id: str, task_type: str, task_index: int, attempt: int) -> Path:
    return state_dir / "jobs" / job_id / "tasks" / f"{task_type}-{task_index}" / f"attempt-{attempt}"


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
    def __init__(self, state_dir: Path, on_report: Callable[[TaskRecord], None]):
        self.state_dir = state_dir
        self.on_report = on_report
        self.lock = threading.Lock()
        self.tasks: dict[TaskKey, TaskRecord] = {}

    # ---- launching -------------------------------------------------------------------------------

    def launch(self, job_id: str, task_type: str, task_index: int, attempt: int, command: list[str],
               env: dict[str, str], workdir: str, port: int, stop_grace_seconds: float,
               report_listening: bool = False) -> None:
        key = (job_id, task_type, task_index)
        with self.lock:
            current = self.tasks.get(key)
            if current is not None and current.attempt >= attempt:
                log.info("launch of %s:%d attempt %d ignored: attempt %d is known", task_type, task_index,
                         attempt, current.attempt)
                if current.attempt == attempt and current.phase != "STARTING":
                    self.on_report(current)
                return
            if current is not None and current.phase in ("STARTING", "RUNNING"):
                log.warning("%s still runs while attempt %d is launched: killing it", current.name, attempt)
                self._kill_now(current)
            record = TaskRecord(job_id, task_type, task_index, attempt,
                                attempt_dir(self.state_dir, job_id, task_type, task_index, attempt), port=port)
            self.tasks[key] = record
        try:
            record.dir.mkdir(parents=True, exist_ok=True)
            if port and port_in_use(port):
                record.busy_port = port
                raise _StartError(f"port {port} is already in use on this node")
            task_env = {**os.environ, **env, "TFCLUSTER_EVENTS_FILE": str(record.events_path),
                        "TFCLUSTER_CONTROL_FILE": str(record.control_path)}
            record.checkpoint_dir = task_env.get("TFCLUSTER_CHECKPOINT_DIR", "")
            for name in ("TFCLUSTER_CHECKPOINT_DIR", "TFCLUSTER_MODEL_DIR"):
                if task_env.get(name):
                    Path(task_env[name]).mkdir(parents=True, exist_ok=True)
            write_json_atomic(record.dir / "launch.json", {
                "job_id": job_id, "task_type": task_type, "task_index": task_index, "attempt": attempt,
                "command": command, "env": task_env, "workdir": workdir, "port": port,
                "stop_grace_seconds": stop_grace_seconds})
            shim = subprocess.Popen([sys.executable, "-m", "tfcluster.daemon.agent.taskrunner", str(record.dir)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=open(record.dir / "shim.log", "ab"), start_new_session=True,
                                    close_fds=True)
        except (_StartError, OSError) as e:
            self._finish(record, phase="FAILED_TO_START", message=str(e))
            return
        record.shim_pid = shim.pid
        threading.Thread(target=self._watch_child, args=(record, shim), name=f"watch-{record.name}",
                         daemon=True).start()
        if report_listening and port:
            threading.Thread(target=self._watch_listening, args=(record,), name=f"listen-{record.name}",
                             daemon=True).start()

    def _watch_listening(self, record: TaskRecord) -> None:
        """Reports the task again once it accepts connections on its port."""
        while not record.exited.is_set():
            if record.phase == "RUNNING":
                with socket.socket() as s:
                    s.settimeout(1.0)
                    if s.connect_ex(("127.0.0.1", record.port)) == 0:
                        record.listening = True
                        log.info("%s listens on port %d", record.name, record.port)
                        self.on_report(record)
                        return
            record.exited.wait(LISTEN_POLL_SECONDS)

    def _watch_child(self, record: TaskRecord, shim: subprocess.Popen) -> None:
        line = shim.stdout.readline()
        try:
            started = json.loads(line) if line else {}
        except ValueError:
            started = {}
        if started.get("phase") == "RUNNING":
            with self.lock:
                record.phase, record.pid = "RUNNING", started["pid"]
            log.info("%s running as pid %d", record.name, record.pid)
            self.on_report(record)
        shim.stdout.close()
        shim.wait()
        self._collect(record)

    def _collect(self, record: TaskRecord) -> None:
        """The shim is gone: read how the task ended from status.json."""
        try:
            status = json.loads((record.dir / "status.json").read_text())
        except (OSError, ValueError):
            status = {}
        phase = status.get("phase")
        if phase == "EXITED":
            if status.get("exit_code") == 0:
                record.final_checkpoint = self._newest_checkpoint(record)
            self._finish(record, phase="EXITED", exit_code=status.get("exit_code"), signal=status.get("signal"),
                         log_tail=status.get("log_tail", []))
        elif phase == "FAILED_TO_START":
            self._finish(record, phase="FAILED_TO_START", message=status.get("message", ""))
        else:
            # The shim died without recording an exit (killed with -9): make sure the task is gone too.
            pgid = status.get("pgid") or record.pid
            if pgid:
                kill_group(pgid, signal.SIGKILL)
            self._finish(record, phase="EXITED", signal=signal.SIGKILL,
                         message="the task's supervisor process died; the task was killed")

    @staticmethod
    def _newest_checkpoint(record: TaskRecord) -> str:
        """The newest committed checkpoint in the task's checkpoint dir, relative to it ("" if none)."""
        directory = record.checkpoint_dir
        newest = latest_checkpoint(directory) if directory else None
        return os.path.relpath(newest, directory) if newest else ""

    def progress(self) -> list[tuple[TaskRecord, int, str]]:
        """(task, bytes of output so far, newest checkpoint) for every running task."""
        found = []
        for record in self.snapshot():
            if record.phase != "RUNNING" or record.exited.is_set():
                continue
            try:
                size = record.log_path.stat().st_size
            except OSError:
                size = 0
            found.append((record, size, self._newest_checkpoint(record)))
        return found

    def finish_training(self, job_id: str, task_type: str, task_index: int, attempt: int,
                        final_checkpoint: str) -> None:
        """Tells a running task (the evaluator) that training is over, through its control file."""
        with self.lock:
            record = self.tasks.get((job_id, task_type, task_index))
        if record is None or record.attempt != attempt:
            return
        write_json_atomic(record.control_path, {"training_finished": True, "final_checkpoint": final_checkpoint})

    def _finish(self, record: TaskRecord, phase: str, exit_code: int | None = None, signal: int | None = None,
                message: str = "", log_tail: list[str] | None = None) -> None:
        with self.lock:
            if record.exited.is_set():
                return
            record.phase, record.exit_code, record.signal = phase, exit_code, signal
            record.message, record.log_tail, record.finished_at = message, log_tail or [], time.time()
            record.exited.set()
        how = f"signal {signal}" if signal else f"exit code {exit_code}" if exit_code is not None else message
        log.info("%s ended: %s", record.name, how)
        self.on_report(record)

    # ---- stopping --------------------------------------------------------------------------------

    def stop(self, job_id: str, task_type: str, task_index: int, attempt: int, grace_seconds: float) -> None:
        with self.lock:
            record = self.tasks.get((job_id, task_type, task_index))
        if record is None or record.attempt != attempt or record.exited.is_set():
            return
        try:
            write_json_atomic(record.dir / "stop.json", {"grace_seconds": grace_seconds})
        except OSError:
            pass
        if not record.shim_pid or not _signal(record.shim_pid, signal.SIGTERM):
            self._kill_now(record)

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
            self.stop(record.job_id, record.task_type, record.task_index, record.attempt, grace_seconds)
        if wait:
            for record in live:
                record.exited.wait(grace_seconds + 10)

    # ---- reattaching after an agent restart ------------------------------------------------------

    def adopt_running(self) -> int:
        """Finds tasks that a previous agent process started and that still run (or ended meanwhile)."""
        found = 0
        for status_path in sorted(self.state_dir.glob("jobs/*/tasks/*/attempt-*/status.json")):
            try:
                status = json.loads(status_path.read_text())
                launch = json.loads((status_path.parent / "launch.json").read_text())
            except (OSError, ValueError):
                continue
            key = (launch["job_id"], launch["task_type"], launch["task_index"])
            known = self.tasks.get(key)
            if known is not None and known.attempt >= launch["attempt"]:
                continue
            record = TaskRecord(*key, launch["attempt"], status_path.parent, pid=status.get("pid", 0),
                                shim_pid=status.get("shim_pid", 0), port=launch.get("port", 0),
                                checkpoint_dir=launch["env"].get("TFCLUSTER_CHECKPOINT_DIR", ""))
            if status.get("phase") == "RUNNING":
                if not _is_shim(record.shim_pid, record.dir):
                    if record.pid and group_alive(record.pid):
                        kill_group(record.pid, signal.SIGKILL)
                    continue
                record.phase = "RUNNING"
                self.tasks[key] = record
                threading.Thread(target=self._watch_adopted, args=(record,), name=f"watch-{record.name}",
                                 daemon=True).start()
                found += 1
                log.info("reattached to %s (pid %d)", record.name, record.pid)
            elif status.get("phase") in ("EXITED", "FAILED_TO_START") and \
                    time.time() - status.get("finished", 0) < FINISHED_KEPT_SECONDS:
                # It ended while no agent watched: the coordinator still needs to hear how.
                record.phase, record.exit_code, record.signal = status["phase"], status.get("exit_code"), \
                    status.get("signal")
                record.message, record.log_tail = status.get("message", ""), status.get("log_tail", [])
                record.finished_at = status.get("finished", 0)
                if record.exit_code == 0:
                    record.final_checkpoint = self._newest_checkpoint(record)
                record.exited.set()
                self.tasks[key] = record
        return found

    def _watch_adopted(self, record: TaskRecord) -> None:
        """Waits for an adopted shim (not our child, so no wait()) to exit, then collects its status."""
        try:
            fd = os.pidfd_open(record.shim_pid)
        except ProcessLookupError:
            self._collect(record)
            return
        except OSError:  # no pidfd (Linux < 5.3): fall back to polling the pid
            while _is_shim(record.shim_pid, record.dir):
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

    def find(self, job_id: str, task_type: str, task_index: int, attempt: int) -> TaskRecord | None:
        with self.lock:
            record = self.tasks.get((job_id, task_type, task_index))
        if record is not None and record.attempt == attempt:
            return record
        path = attempt_dir(self.state_dir, job_id, task_type, task_index, attempt)
        if path.exists():  # an older attempt: its log is still on disk
            old = TaskRecord(job_id, task_type, task_index, attempt, path, phase="EXITED")
            old.exited.set()
            return old
        return None


class _StartError(Exception):
    pass


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _is_shim(pid: int, attempt_dir: Path) -> bool:
    """True when pid is still the shim of this attempt (pids are reused)."""
    if not pid:
        return False
    try:
        cmdline = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return "tfcluster.daemon.agent.taskrunner" in cmdline and str(attempt_dir) in cmdline
