"""Serving a task's log to the coordinator (for `tfcluster logs`): the bytes exactly as written, from the
start or the last N lines, once or following the output until the task ends. Where the attempt's limit
dropped the middle of a long output, one marker line says how many bytes (tasklog.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tfcluster.commands import LogData, ReadLog
from tfcluster.daemon.agent.shim.tasklog import OutputReader, tail_position
from tfcluster.daemon.agent.tasks.supervisor import Supervisor

LOG_CHUNK_BYTES = 64 * 1024
FOLLOW_POLL_SECONDS = 0.1


class LogServer:
    def __init__(self, supervisor: Supervisor, send: Callable[[LogData], None]):
        self.supervisor = supervisor
        self.send = send
        self.cancels: dict[int, threading.Event] = {}
        self.stopped = threading.Event()

    def read(self, request: ReadLog) -> None:
        cancel = self.cancels[request.request_id] = threading.Event()
        threading.Thread(target=self._serve, args=(request, cancel), name="log", daemon=True).start()

    def cancel(self, request_id: int) -> None:
        event = self.cancels.pop(request_id, None)
        if event is not None:
            event.set()

    def _serve(self, request: ReadLog, cancel: threading.Event) -> None:
        def send(**fields) -> None:
            self.send(LogData(request_id=request.request_id, **fields))

        try:
            if request.environment:
                self._serve_environment(request, cancel, send)
                return
            record = self.supervisor.find(request.attempt)
            if record is None:
                a = request.attempt
                send(eof=True, error=f"no log for {a.task_key} attempt {a.number} on {request.node}")
                return
            # Before the task has written anything the reader finds nothing yet, and in follow mode waits.
            start = tail_position(record.dir, request.tail_lines) if request.tail_lines else 0
            reader = OutputReader(record.dir, start)
            try:
                self._copy(reader, request.follow, record.exited.is_set, cancel, send)
            finally:
                reader.close()
            send(eof=True)
        finally:
            self.cancels.pop(request.request_id, None)

    def _serve_environment(self, request: ReadLog, cancel: threading.Event, send) -> None:
        """The build log of the job's environment here, followed while the build goes on."""
        environments = self.supervisor.environments
        path = environments.log_path(request.attempt.job_id)
        try:
            file = open(path, "rb") if path is not None else None
        except FileNotFoundError:
            file = None
        if file is None:
            send(eof=True, error=f"no environment log for job {request.attempt.job_id} on {request.node}")
            return
        with file:
            if request.tail_lines:
                file.seek(_tail_offset(file, request.tail_lines))
            self._copy(file, request.follow, lambda: not environments.building(path), cancel, send)
        send(eof=True)

    def _copy(self, reader, follow: bool, ended: Callable[[], bool], cancel: threading.Event, send) -> None:
        while not cancel.is_set() and not self.stopped.is_set():
            data = reader.read(LOG_CHUNK_BYTES)
            if data:
                send(data=data)
                continue
            if not follow or ended():
                # The writer closes the log before it records the end: reading on drains it.
                while data := reader.read(LOG_CHUNK_BYTES):
                    send(data=data)
                break
            time.sleep(FOLLOW_POLL_SECONDS)


def _tail_offset(file, lines: int) -> int:
    """Where the last `lines` lines of a small file (a build log) start."""
    content = file.read()
    file.seek(0)
    cut = len(content)
    for _ in range(lines + (1 if content.endswith(b"\n") else 0)):
        cut = content.rfind(b"\n", 0, cut)
        if cut < 0:
            return 0
    return cut + 1

