"""Serving a task's log to the coordinator (for `tfcluster logs`): the bytes exactly as written, from the
start or the last N lines, once or following the output until the task ends. Where the attempt's limit
dropped the middle of a long output, one marker line says how many bytes (tasklog.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tfcluster.daemon.agent.supervisor import Supervisor
from tfcluster.daemon.agent.tasklog import OutputReader, tail_position
from tfcluster.model import LogData, ReadLog

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
            record = self.supervisor.find(request.attempt)
            if record is None:
                a = request.attempt
                send(eof=True, error=f"no log for {a.task_key} attempt {a.number} on {request.node}")
                return
            # Before the task has written anything the reader finds nothing yet, and in follow mode waits.
            start = tail_position(record.dir, request.tail_lines) if request.tail_lines else 0
            reader = OutputReader(record.dir, start)
            try:
                while not cancel.is_set() and not self.stopped.is_set():
                    data = reader.read(LOG_CHUNK_BYTES)
                    if data:
                        send(data=data)
                        continue
                    if not request.follow or record.exited.is_set():
                        # The shim closes the log before it records the exit: reading on drains it.
                        while data := reader.read(LOG_CHUNK_BYTES):
                            send(data=data)
                        break
                    time.sleep(FOLLOW_POLL_SECONDS)
            finally:
                reader.close()
            send(eof=True)
        finally:
            self.cancels.pop(request.request_id, None)

