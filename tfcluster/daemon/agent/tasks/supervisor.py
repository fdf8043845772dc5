"""Starts, stops and watches a node's tasks, each through its own shim (shim/runner.py), forked by the
launcher (launcher.py). A launch is recorded at once and started on a thread of its own (tasks/start.py).

Exits are seen at once: the thread of each attempt reads its shim's stdout to the line that says the attempt
ended, or to its end (or waits for the shim itself, when the agent had to start it as its own child); one waits
on the pidfd of each shim adopted after an agent restart. Every change becomes a report for the
coordinator through on_report. Task files live in one directory per attempt (layout.attempt_dir).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tfcluster import layout
from tfcluster.codechunks import CodeError
from tfcluster.commands import Launch
from tfcluster.daemon.agent.code.environments import Environments, EnvironmentProblem
from tfcluster.daemon.agent.code.task_code import TaskCode
from tfcluster.daemon.agent.shim.tasklog import DEFAULT_LIMIT_BYTES, total_bytes
from tfcluster.daemon.agent.tasks import reattach
from tfcluster.daemon.agent.tasks.kept import KeptAttempts
from tfcluster.daemon.agent.tasks.launcher import ForkedShim, said_more
from tfcluster.daemon.agent.shim.taskfiles import (ShimStatus, TaskFileError, UsageFile, write_json_atomic,
                                              write_stop)
from tfcluster.daemon.agent.shim.runner import group_alive, kill_group
from tfcluster.daemon.agent.tasks.record import TaskKey, TaskRecord, exit_of, is_shim, newest_checkpoint
from tfcluster.daemon.agent.tasks.start import StartError, TaskStarter
from tfcluster.daemon.agent.tasks.threads import AttemptThreads
from tfcluster.daemon.agent.tasks.users import JOB_READABLE_FILE_MODE, TaskUsers
from tfcluster.daemon.logformat import fields
from tfcluster.model import Attempt, TaskExit, TaskProgress
from tfcluster.states import Phase, check_transition
log = logging.getLogger("tfcluster.agent")

FINISHED_KEPT_SECONDS = 3600.0
# Ended attempts kept at most, the oldest forgotten first: a node that runs many short tasks an hour (a sweep of
# small trials) keeps what each poll, heartbeat and registration goes through bounded.
FINISHED_KEPT = 5_000  # within what a registration may report (wire.MAX_TASKS_PER_NODE), with the running ones
LISTEN_POLL_SECONDS = 0.1
ADOPTED_POLL_SECONDS = 0.5
QUICK_END_SECONDS = 0.02  # a task that ends this soon after its start is reported once, by its exit


class Supervisor:
    def __init__(self, state_dir: Path, on_report: Callable[[TaskRecord], None],
                 launch_refusal: Callable[[], str] = lambda: "", log_limit_bytes: int = DEFAULT_LIMIT_BYTES,
                 task_users: TaskUsers | None = None, environments: Environments | None = None):
        self.state_dir = state_dir
        self.on_report = on_report
        # Told of the attempts the supervisor no longer keeps (ended FINISHED_KEPT_SECONDS ago, or beyond the newest
        # FINISHED_KEPT ended): what others keep for them goes too, or an agent that runs for months would keep
        # something of every task it ever ran.
        self.on_forget: Callable[[list[TaskRecord]], None] = lambda forgotten: None
        self.lock = threading.Lock()
        self.kept = KeptAttempts()  # under self.lock
        self.tasks: dict[TaskKey, TaskRecord] = self.kept.tasks  # the newest attempt of each task kept
        self.threads = AttemptThreads()  # each attempt's, from its start to its report (threads.py)
        # Dirs, files, code, environment and shim of each attempt (tasks/start.py), on the attempt's own thread.
        self.starter = TaskStarter(state_dir, launch_refusal, log_limit_bytes, task_users or TaskUsers(),
                                   environments or Environments(state_dir))
        self.launcher = self.starter.launcher
        self.task_users = self.starter.task_users
        self.environments = self.starter.environments

    @property
    def code(self) -> TaskCode | None:
        """Jobs' code on this node (code/task_code.py): what an attempt pinned is let go when it ends."""
        return self.starter.code

    @code.setter
    def code(self, code: TaskCode | None) -> None:
        self.starter.code = code

    # ---- launching -------------------------------------------------------------------------------

    def launch(self, order: Launch) -> None:
        """Records the attempt and starts it on a thread of its own, every launch alike: the caller (the agent's
        message loop) goes on at once, and a stop or a newer attempt that comes meanwhile finds the record. A
        launch of an attempt already known has its current state reported again (a resent launch)."""
        a = order.attempt
        key = (a.job_id, a.type, a.index)
        with self.lock:
            current = self.tasks.get(key)
            if current is not None and current.attempt.number >= a.number:
                if current.attempt.number == a.number and current.phase != Phase.STARTING:
                    self.on_report(current)
                return
            if current is not None and not current.exited.is_set():
                log.warning("%s still runs while attempt %d is launched: killing it", current.name, a.number,
                            extra=fields(current.attempt))
                self._kill_now(current)
                if not current.shim_pid:  # still starting: its thread sees it ended and stops its shim at once
                    current.exited.set()
            record = TaskRecord(a, layout.attempt_dir(self.state_dir, a.job_id, a.type, a.index, a.number),
                                port=order.port, gpus=order.env.get(layout.CUDA_VISIBLE_DEVICES, ""),
                                # The evaluator's is its role's; every other task's is its own on this node.
                                summary_dir=order.env.get(layout.SUMMARY_DIR) or
                                layout.task_summary_dir(self.state_dir, a.job_id, a.type, a.index),
                                # Known before the task starts: a shipping order may come while its code is fetched.
                                checkpoint_dir=order.env.get(layout.CHECKPOINT_DIR, ""))
            if order.environment:
                record.detail, record.detail_since = "building environment", time.monotonic()
            self.kept.keep(record)
        self.threads.run(lambda: self._run(record, order), name=f"task-{record.name}")

    def _run(self, record: TaskRecord, order: Launch) -> None:
        """One attempt, top to bottom, on a thread of its own (the agent's message loop goes on at once): prepared
        and started (start.py's steps, then its shim), watched until its shim exits, finished (how it ended,
        reported once). This thread watches the shim it started: one thread less per task."""
        shim = self._start(record, order)
        if shim is None:
            return  # it never started, and said why
        if order.report_listening and order.port:
            threading.Thread(target=self._watch_listening, args=(record,), name=f"listen-{record.name}",
                             daemon=True).start()
        self._watch(record, shim)
        self._collect(record)
        # Its end is recorded, under the lock every signal to its shim is sent under: a forked shim may now run
        # another attempt (launcher.py), and no stop of this one reaches it there.
        if isinstance(shim, ForkedShim):
            shim.release()
        else:
            shim.stdout.close()

    def _start(self, record: TaskRecord, order: Launch) -> ForkedShim | subprocess.Popen | None:
        """The attempt's shim, started; None when the attempt could not start (it has ended, saying why). A stop
        that came before its shim existed has ended the record already (stop): the shim, if one was started all
        the same, is stopped at once."""
        try:
            shim = self.starter.start(record, order)
        except Exception as e:  # whatever it is, the coordinator hears of it: a task never stays launching
            known = isinstance(e, (StartError, OSError, CodeError, EnvironmentProblem))
            if known:
                message = str(e)
            else:  # a fault of the agent's, not of the job: the user learns where to look, the operator gets the trace
                log.exception("%s: preparing the task failed", record.name, extra=fields(record.attempt))
                message = (f"the agent could not prepare the task: an internal error ({type(e).__name__}); the "
                           f"agent's log on this node has its traceback")
            ended = self._finish(record, Phase.FAILED_TO_START,
                                 TaskExit(message=message, busy_port=getattr(e, "busy_port", 0),
                                          log_tail=getattr(e, "log_tail", ())))
            if not ended:  # stopped while it started: what it pinned meanwhile goes too
                self._release_code(record)
            return None
        with self.lock:  # with stop's check of shim_pid, under the same lock: one of the two stops the shim
            record.shim_pid, record.detail = shim.pid, ""
            stopped = record.exited.is_set()
        if stopped:
            self._stop_shim(record)
        return shim

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

    def _watch(self, record: TaskRecord, shim: ForkedShim | subprocess.Popen) -> None:
        """The shim's first line says the task runs (reported at once); then its exit is waited for."""
        line = shim.stdout.readline()
        try:
            started = json.loads(line) if line else {}
        except ValueError:
            started = {}
        running = started.get("phase") == Phase.RUNNING
        if running:
            with self.lock:
                record.pid = started["pid"]
                running = not record.exited.is_set()  # stopped before its shim existed: it ended then, and stays
                if running:
                    check_transition(record.name, Phase(record.phase), Phase.RUNNING)
                    record.phase = Phase.RUNNING
        if running:
            log.info("%s running as pid %d", record.name, record.pid, extra=fields(record.attempt))
            if not said_more(shim.stdout, QUICK_END_SECONDS):
                self.on_report(record)
            # else the task has ended already (a task of milliseconds): its exit, which carries its pid, is the one
            # report, and the coordinator takes it as "ran, then ended" (core/cluster.py).
        shim.wait()

    def _collect(self, record: TaskRecord) -> None:
        """The shim is gone: read how the task ended from its status file."""
        status = _read_status(record)
        pgid = (status.pgid if status is not None else 0) or record.pid
        if status is not None and status.ended:
            ended = self._finish(record, status.phase, exit_of(status, record.checkpoint_dir, record.uid))
        elif not pgid:
            # The shim ended before it started the task: a stop that came first (its SIGTERM ends a shim that has
            # not yet set its handler), or the shim's own failure, which it wrote to its log.
            stopped = (record.dir / layout.STOP_FILE).exists()
            why = "stopped before it started" if stopped else \
                f"its shim ended before it started the task (see {record.dir / layout.SHIM_LOG_FILE})"
            ended = self._finish(record, Phase.FAILED_TO_START, TaskExit(message=why))
        else:
            # The shim died without recording an exit (killed with -9): make sure the task is gone too.
            kill_group(pgid, signal.SIGKILL)
            died = "the task's supervisor process died; the task was killed"
            ended = self._finish(record, Phase.EXITED, TaskExit(signal=signal.SIGKILL, message=died))
        if not ended:  # ended before its shim existed (stopped, or a newer attempt came): its code goes now
            self._release_code(record)

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
            checkpoint = newest_checkpoint(record.checkpoint_dir, record.uid)
            found.append(TaskProgress(record.attempt, total_bytes(record.dir), checkpoint, usage.cpu_seconds,
                                      usage.rss_bytes, usage.peak_rss_bytes))
        return found

    def finish_training(self, attempt: Attempt, final_checkpoint: str) -> None:
        """Tells a running task (the evaluator) that training is over, through its control file."""
        record = self.current(attempt)
        if record is not None:
            write_json_atomic(record.control_path, {"training_finished": True, "final_checkpoint": final_checkpoint},
                              mode=JOB_READABLE_FILE_MODE, group=record.group, durable=False)  # for the running task

    def _finish(self, record: TaskRecord, phase: str, exit: TaskExit, before_shim: bool = False) -> bool:
        """Ends the record and reports it, once; True when this call ended it. before_shim: only if its shim
        has not been started (checked under the lock _start sets shim_pid under)."""
        with self.lock:
            if record.exited.is_set() or (before_shim and record.shim_pid):
                return False
            phase = Phase(phase)  # as its shim's status file says it, or the agent's own
            check_transition(record.name, Phase(record.phase), phase)
            record.phase, record.exit, record.finished_at = phase, exit, time.time()
            record.exited.set()
            self.kept.ended_now(record)
        self._release_code(record)
        log.info("%s ended: %s", record.name, exit.describe(), extra=fields(record.attempt))
        self.on_report(record)
        return True

    def _release_code(self, record: TaskRecord) -> None:
        """The attempt's working dir over its job's code is unmounted, its cache entry unpinned (again: harmless)."""
        if self.code is not None:
            self.code.release(record.dir)

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
        # Still starting (its dirs made, its code fetched, its environment built): it never runs, its thread
        # sees it ended. Once its shim exists, the shim stops it.
        if self._finish(record, Phase.EXITED, TaskExit(message="stopped before it started"),
                        before_shim=True):
            return
        with self.lock:  # an attempt recorded as ended may have freed its shim for another: it is not signalled
            if not record.exited.is_set() and not _signal(record.shim_pid, signal.SIGTERM):
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
        for record, status in reattach.recorded_attempts(self.state_dir, time.time() - FINISHED_KEPT_SECONDS):
            known = self.tasks.get(record.key)
            if known is not None and known.attempt.number >= record.attempt.number:
                continue
            if status.phase == Phase.RUNNING:
                if not is_shim(record.shim_pid, record.dir, record.shim_started):
                    if record.pid and group_alive(record.pid):
                        kill_group(record.pid, signal.SIGKILL)
                    continue
                record.phase = Phase.RUNNING
                self.keep(record)
                threading.Thread(target=self._watch_adopted, args=(record,), name=f"watch-{record.name}",
                                 daemon=True).start()
                found += 1
                log.info("reattached to %s (pid %d)", record.name, record.pid, extra=fields(record.attempt))
            elif status.ended:
                # It ended while no agent watched: the coordinator still needs to hear how.
                record.phase, record.exit = status.phase, exit_of(status, record.checkpoint_dir, record.uid)
                record.finished_at = status.finished
                record.exited.set()
                self.keep(record)
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

    def keep(self, record: TaskRecord) -> None:
        """Keeps the record as its task's newest attempt: one adopted, or found ended, after a restart."""
        with self.lock:
            self.kept.keep(record)

    def snapshot(self) -> list[TaskRecord]:
        """Every attempt kept; first forgets the oldest ended ones past FINISHED_KEPT or FINISHED_KEPT_SECONDS."""
        with self.lock:
            forgotten = self.kept.forget(time.time(), FINISHED_KEPT, FINISHED_KEPT_SECONDS)
            records = list(self.tasks.values())
        if forgotten:
            self.on_forget(forgotten)
        return records

    def keeps_job(self, job_id: str) -> bool:
        """Whether an attempt of the job, running or ended, is kept here."""
        with self.lock:
            return job_id in self.kept.jobs

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
