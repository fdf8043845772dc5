"""Serving a task's log to the coordinator (for `tfcluster logs`): the bytes exactly as written, from the
start or the last N lines, once or following the file until the task ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tfcluster.daemon.agent.supervisor import Supervisor
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
            path = record.log_path
            while not path.exists() and request.follow and not record.exited.is_set() and not cancel.is_set():
                time.sleep(FOLLOW_POLL_SECONDS)
            if not path.exists():
                send(eof=True)
                return
            with open(path, "rb") as f:
                if request.tail_lines:
                    f.seek(tail_offset(f, request.tail_lines))
                while not cancel.is_set() and not self.stopped.is_set():
                    data = f.read(LOG_CHUNK_BYTES)
                    if data:
                        send(data=data)
                        continue
                    if not request.follow or record.exited.is_set():
                        # The shim closes the log before it records the exit: one more read drains it.
                        rest = f.read()
                        if rest:
                            send(data=rest)
                        break
                    time.sleep(FOLLOW_POLL_SECONDS)
            send(eof=True)
        finally:
            self.cancels.pop(request.request_id, None)


def tail_offset(f, lines: int) -> int:
    """Offset where the last `lines` lines of a binary file start."""
    end = f.seek(0, 2)
    pos, found, block = end, 0, 8192
    if end == 0:
        return 0
    f.seek(end - 1)
    skip_last_newline = f.read(1) == b"\n"
    while pos > 0:
        step = min(block, pos)
        pos -= step
        f.seek(pos)
        chunk = f.read(step)
        if skip_last_newline and pos + step == end:
            chunk = chunk[:-1]
        for i in range(len(chunk) - 1, -1, -1):
            if chunk[i] == 0x0A:
                found += 1
                if found == lines:
                    return pos + i + 1
    return 0
