"""The shim's watch of a task's tree starts only once the task has run for a while: a task that ends sooner costs
no thread, and its output and exit are recorded all the same."""

from __future__ import annotations

import os
import signal

import pytest

from tfcluster import layout
from tfcluster.daemon.agent.shim import runner as taskrunner
from tfcluster.daemon.agent.shim.taskfiles import LaunchFile, ShimStatus
from tfcluster.daemon.agent.shim.treewatch import TreeWatch
from tfcluster.model import Attempt


@pytest.fixture
def watches_started(monkeypatch) -> list[int]:
    started: list[int] = []
    start = TreeWatch.start

    def counted(watch: TreeWatch) -> None:
        started.append(watch.pid)
        start(watch)
    monkeypatch.setattr(TreeWatch, "start", counted)
    return started


@pytest.fixture(autouse=True)
def signals_kept():
    """The shim runs here in the test's own process, and a shim ignores SIGINT and handles SIGTERM: the handlers
    go back as they were, or every process the later tests start would inherit SIGINT ignored."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in kept.items():
        signal.signal(sig, handler)


def run_shim(tmp_path, command: tuple[str, ...]) -> ShimStatus:
    LaunchFile(Attempt("job", "worker", 0, 1), command, {"PATH": os.environ["PATH"]}, str(tmp_path)).write(tmp_path)
    assert taskrunner.Runner(tmp_path).run() == 0
    status = ShimStatus.read(tmp_path)
    assert status is not None and status.ended
    return status


def test_a_task_that_ends_at_once_is_recorded_without_a_watch(tmp_path, watches_started):
    status = run_shim(tmp_path, ("sh", "-c", "echo quick; exit 3"))
    assert status.exit.exit_code == 3 and status.exit.log_tail == ("quick",)
    assert (tmp_path / layout.OUTPUT_FILE).read_bytes() == b"quick\n"
    assert watches_started == []


def test_a_task_that_runs_on_is_watched_and_keeps_all_its_output(tmp_path, watches_started):
    assert taskrunner.WATCH_AFTER_SECONDS < 0.4
    status = run_shim(tmp_path, ("sh", "-c", "echo before; sleep 0.4; echo after"))
    assert status.exit.exit_code == 0 and status.exit.log_tail == ("before", "after")
    assert (tmp_path / layout.OUTPUT_FILE).read_bytes() == b"before\nafter\n"
    assert watches_started == [status.pid]
