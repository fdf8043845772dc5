"""How the daemons write their log: one line per event, as text for people or JSON for log collectors.

Events about a job, a task, a node or an attempt carry them as fields, given with logging's `extra=`
(`log.info("... ended", extra=fields(attempt, node))`): text shows them after the message as
`job=... task=... attempt=... node=...`, JSON as keys of its own, so both can be filtered on.

Under journald (stderr is the stream named by $JOURNAL_STREAM), text lines have no timestamp (the journal
keeps its own) and start with a `<N>` syslog priority, which journald strips and records as the entry's
priority (`journalctl -p warning`). A newline inside a message or a traceback is written as `\\n`, so an
event is never split into lines that read as events of their own.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
from typing import TextIO

from tfcluster.model import Attempt

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
FIELDS = ("job", "task", "attempt", "node")  # the `extra=` keys a line shows, in this order
# syslog priorities (sd-daemon(3)) from the lowest logging level that has them: crit, err, warning, info, debug.
PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


def fields(attempt: Attempt | None = None, node: str = "", job: str = "", task: str = "") -> dict:
    """The `extra=` of an event line about an attempt of a task, a job, a task (`worker:1`) or a node."""
    found = {"job": attempt.job_id, "task": attempt.task_key, "attempt": attempt.number} if attempt else {}
    found.update((name, value) for name, value in (("job", job), ("task", task), ("node", node)) if value)
    return found


class LineFormatter(logging.Formatter):
    """One event a line: `TIME LEVEL LOGGER: MESSAGE job=... task=... TRACEBACK` or one JSON object with the
    keys time, level, logger, message, the fields, and exception (a traceback) when there is one."""

    def __init__(self, json_lines: bool = False, journald: bool = False):
        super().__init__()
        self.json_lines, self.journald = json_lines, journald

    def format(self, record: logging.LogRecord) -> str:
        found = {name: getattr(record, name) for name in FIELDS if getattr(record, name, None) not in (None, "")}
        if record.exc_info:
            found["exception"] = self.formatException(record.exc_info)
        line = self._json(record, found) if self.json_lines else self._text(record, found)
        return f"<{_priority(record.levelno)}>{line}" if self.journald else line

    def _text(self, record: logging.LogRecord, found: dict) -> str:
        exception = found.pop("exception", "")
        text = f"{record.levelname} {record.name}: {_one_line(record.getMessage())}"
        text += "".join(f" {name}={_value(value)}" for name, value in found.items())
        text += f" {_one_line(exception)}" if exception else ""
        return text if self.journald else f"{self.formatTime(record)} {text}"

    @staticmethod
    def _json(record: logging.LogRecord, found: dict) -> str:
        moment = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        return json.dumps({"time": moment.isoformat(timespec="milliseconds"), "level": record.levelname,
                           "logger": record.name, "message": record.getMessage(), **found})


def setup(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Sends every log record at `level` or above to stream (stderr) in `fmt`; raises ValueError naming the
    flag when either is not one of the choices."""
    if level.lower() not in LEVELS:
        raise ValueError(f"--log-level: expected one of {', '.join(LEVELS)}, got {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"--log-format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    stream = stream or sys.stderr
    # A line names no source file, function, thread or process (FIELDS are what it shows), yet logging looks each
    # of them up for every record, walking the caller's frames, unless told not to (the logging HOWTO's
    # "Optimization" section): 13-14 µs a line without the lookups against 16-20 with them, measured in a thread.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(stream)
    handler.setFormatter(LineFormatter(json_lines=fmt == "json", journald=writes_to_journal(stream)))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def writes_to_journal(stream: TextIO) -> bool:
    """True when stream is the journald stream systemd connected ($JOURNAL_STREAM is its device:inode);
    a stream redirected elsewhere by the service's command is not."""
    device, _, inode = os.environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        stat = os.fstat(stream.fileno())
        return (stat.st_dev, stat.st_ino) == (int(device), int(inode))
    except (ValueError, OSError, AttributeError):
        return False


def _priority(levelno: int) -> int:
    return next((priority for level, priority in PRIORITIES if levelno >= level), 7)


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _value(value) -> str:
    """A field's value; quoted (JSON string rules) when it would not read as one word."""
    text = str(value)
    return json.dumps(text) if not text or any(c in text for c in ' ="\\\n\r\t') else text
