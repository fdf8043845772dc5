"""The daemons' log lines: one per event, with the job/task/attempt/node fields an operator filters on, the
syslog priority journald records, and JSON a log collector parses."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys

import pytest

from tfcluster.daemon import logformat
from tfcluster.daemon.logformat import fields
from tfcluster.model import Attempt

ATTEMPT = Attempt("train-7k2", "worker", 1, 3)


@pytest.fixture(autouse=True)
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def events(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_text_is_one_line_per_event_with_a_timestamp_and_the_fields():
    stream = io.StringIO()
    logformat.setup("info", "text", stream)
    log = logging.getLogger("tfcluster.agent")
    log.info("%s ended: exit code 1\nlast line: boom\r", ATTEMPT, extra=fields(ATTEMPT, node="gpu-01"))
    log.debug("not at info level")
    log.warning("node %s lost", "gpu 02", extra=fields(node="gpu 02"))
    first, second = events(stream)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO tfcluster\.agent: "
                        r"train-7k2 worker:1 attempt 3 ended: exit code 1\\nlast line: boom\\r "
                        r"job=train-7k2 task=worker:1 attempt=3 node=gpu-01", first), first
    assert second.endswith('WARNING tfcluster.agent: node gpu 02 lost node="gpu 02"'), second


def test_a_traceback_stays_on_the_line_of_its_event():
    stream = io.StringIO()
    logformat.setup("info", "text", stream)
    try:
        raise RuntimeError("the store is gone")
    except RuntimeError:
        logging.getLogger("tfcluster.coordinator").exception("tick of %s failed", "j-1", extra=fields(job="j-1"))
    [line] = events(stream)
    assert "ERROR tfcluster.coordinator: tick of j-1 failed job=j-1 Traceback (most recent call last):\\n" in line
    assert line.endswith("RuntimeError: the store is gone")


def test_under_journald_lines_carry_the_priority_and_no_timestamp(tmp_path, monkeypatch):
    path = tmp_path / "journal-stream"
    with open(path, "w") as stream:
        stat = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{stat.st_dev}:{stat.st_ino}")
        logformat.setup("debug", "text", stream)
        log = logging.getLogger("tfcluster.coordinator")
        log.debug("d")
        log.info("registered", extra=fields(node="a"))
        log.warning("w")
        log.error("e")
        log.critical("c")
    assert path.read_text().splitlines() == [
        "<7>DEBUG tfcluster.coordinator: d", "<6>INFO tfcluster.coordinator: registered node=a",
        "<4>WARNING tfcluster.coordinator: w", "<3>ERROR tfcluster.coordinator: e",
        "<2>CRITICAL tfcluster.coordinator: c"]


def test_a_journal_stream_that_is_not_stderr_is_not_the_journal(tmp_path, monkeypatch):
    """JOURNAL_STREAM is inherited: a daemon whose stderr goes to a file (or a pipe) writes timestamps."""
    other = tmp_path / "elsewhere"
    other.write_text("")
    stat = os.stat(other)
    monkeypatch.setenv("JOURNAL_STREAM", f"{stat.st_dev}:{stat.st_ino}")
    with open(tmp_path / "log", "w") as stream:
        logformat.setup("info", "text", stream)
        logging.getLogger("tfcluster.agent").info("x")
    assert re.fullmatch(r"\d{4}-.* INFO tfcluster\.agent: x\n", (tmp_path / "log").read_text())


def test_json_is_one_object_per_line_with_the_fields_as_keys():
    stream = io.StringIO()
    logformat.setup("info", "json", stream)
    log = logging.getLogger("tfcluster.agent")
    log.info("%s running as pid %d\nsecond line", ATTEMPT, 4242, extra=fields(ATTEMPT, node="gpu-01"))
    try:
        raise ValueError("bad")
    except ValueError:
        log.exception("command launch failed")
    first, second = (json.loads(line) for line in events(stream))
    assert set(first) == {"time", "level", "logger", "message", "job", "task", "attempt", "node"}
    assert first["message"] == "train-7k2 worker:1 attempt 3 running as pid 4242\nsecond line"
    assert (first["level"], first["logger"], first["job"], first["task"], first["attempt"], first["node"]) == \
        ("INFO", "tfcluster.agent", "train-7k2", "worker:1", 3, "gpu-01")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", first["time"])
    assert second["level"] == "ERROR" and second["exception"].endswith("ValueError: bad")


def test_bad_choices_are_refused_by_flag_name():
    with pytest.raises(ValueError, match="--log-format: expected one of text, json, got 'xml'"):
        logformat.setup("info", "xml", io.StringIO())
    with pytest.raises(ValueError, match="--log-level"):
        logformat.setup("loud", "text", io.StringIO())


@pytest.mark.parametrize("daemon", [["coordinator", "--insecure"], ["agent", "--coordinator", "127.0.0.1:1"]])
def test_the_daemons_refuse_an_unknown_log_format_with_one_line(daemon):
    result = subprocess.run([sys.executable, "-m", "tfcluster.cli", *daemon, "--log-format", "xml"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == "error: --log-format: expected one of text, json, got 'xml'\n"
