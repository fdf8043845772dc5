"""Evaluation results a task appends to its events file (TFCLUSTER_EVENTS_FILE, one JSON object a line),
sent to the coordinator as they come, the last ones before the task's exit. After each registration every
result is sent again: the coordinator keeps one per checkpoint, and a restarted one has none.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

from tfcluster import wire
from tfcluster.daemon.agent.hooks.api import Send, TaskHook, remember
from tfcluster.daemon.agent.shim.taskfiles import read_bytes
from tfcluster.daemon.logformat import fields
from tfcluster.model import Attempt, Evaluation

log = logging.getLogger("tfcluster.agent")


class EventsHook(TaskHook):
    def __init__(self, send: Send, reports_itself: Callable[[Attempt], None] = lambda attempt: None):
        self.send = send
        self.reports_itself = reports_itself  # told of each attempt that reports evaluations through its file
        self.offsets: dict[Attempt, int] = {}  # how far each attempt's events file has been sent
        # Ended attempts whose files were read to the end since the registration: they write no more, and a
        # node that ran thousands of short tasks in the last hour would otherwise read each file 5 times a second.
        self.finished: dict[Attempt, None] = {}
        self.lock = threading.Lock()

    def on_register(self) -> None:
        with self.lock:
            self.offsets.clear()
            self.finished.clear()

    def on_poll(self, record) -> None:
        if record.attempt in self.finished:
            return
        ended = record.exited.is_set()  # before the read: all the attempt wrote is in its file by then
        self._send_new(record)
        if ended:
            with self.lock:
                remember(self.finished, record.attempt)

    def on_exit(self, record) -> None:
        self.on_poll(record)

    def finished_with(self, record) -> bool:
        with self.lock:
            return record.attempt in self.finished

    def on_forget(self, record) -> None:
        with self.lock:
            self.offsets.pop(record.attempt, None)
            self.finished.pop(record.attempt, None)

    def _send_new(self, record) -> None:
        key = record.attempt
        with self.lock:
            try:
                data = read_bytes(record.events_path, self.offsets.get(key, 0))
            except OSError:
                return  # nothing reported (yet)
            complete = data[:data.rfind(b"\n") + 1]  # a line still being written waits for the next poll
            if complete:
                self.offsets[key] = self.offsets.get(key, 0) + len(complete)
            for line in complete.splitlines():
                self._send_line(record, line)

    def _send_line(self, record, line: bytes) -> None:
        try:
            event = json.loads(line)
            if event.get("kind") != "evaluation":
                return
            result = Evaluation(checkpoint=str(event["checkpoint"]), step=int(event["step"]), time=float(event["time"]),
                                metrics={str(k): float(v) for k, v in event["metrics"].items()})
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("%s: ignoring a malformed event line: %r", record.name, line[:200],
                        extra=fields(record.attempt))
            return
        self.reports_itself(record.attempt)
        self.send(wire.evaluation_to_proto(record.attempt, result))
