"""Every launch starts on a thread of its own: launch() returns while the attempt's dirs, files and shim are made,
and a stop or a newer attempt that comes meanwhile wins, whichever step the start is at: the task never runs
past it, and the coordinator hears of the attempt's end once (never RUNNING after it)."""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest

from tfcluster.commands import Launch
from tfcluster.daemon.agent.shim.taskfiles import ShimStatus
from tfcluster.daemon.agent.tasks.supervisor import Supervisor
from tfcluster.model import Attempt
from tfcluster.states import Phase
from tests.unit.taskreports import Reports

TASK_UID = 2_100_999_000


def order(job: str, number: int, *command: str) -> Launch:
    return Launch("n", Attempt(job, "worker", 0, number), command, {"PATH": os.environ["PATH"]}, "/", 0, 1.0,
                  uid=TASK_UID, gid=TASK_UID)


def shim_of(record, timeout: float = 30) -> int:
    """The record's shim pid, once its start thread has set it."""
    deadline = time.monotonic() + timeout
    while not record.shim_pid and time.monotonic() < deadline:
        time.sleep(0.01)
    return record.shim_pid


def let_go(record, timeout: float = 30) -> bool:
    """The record's shim is done with its attempt: the attempt's status says it ended, and its task is gone (the
    shim itself may run another attempt: forked_shim.py)."""
    shim = shim_of(record, timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = ShimStatus.read(record.dir)
        if status is not None and status.ended:
            return not status.pid or gone(status.pid, max(0.0, deadline - time.monotonic()))
        if status is None and not psutil.pid_exists(shim):
            return True  # stopped before it started the task
        time.sleep(0.02)
    return False


def gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def test_a_launch_returns_at_once_and_a_stop_before_the_start_ends_it_without_running(tmp_path):
    gate = threading.Event()
    reports = Reports()
    # The start waits at its first step (asking whether the node takes tasks) until the gate opens.
    supervisor = Supervisor(tmp_path, reports, launch_refusal=lambda: "" if gate.wait(30) else "gate never opened")
    try:
        launch = order("early-stop", 1, "sleep", "60")
        began = time.monotonic()
        supervisor.launch(launch)
        assert time.monotonic() - began < 1.0, "the caller does not wait for the start"
        record = supervisor.current(launch.attempt)
        assert record is not None and record.phase == Phase.STARTING and not record.shim_pid
        supervisor.stop(launch.attempt, 30.0)
        reports.wait_for(launch.attempt, Phase.EXITED)
        gate.set()
        time.sleep(0.5)  # the start thread goes on, sees the attempt ended, and starts nothing
        assert reports.of(launch.attempt) == [Phase.EXITED]
        assert record.exit.message == "stopped before it started" and not record.shim_pid
        assert ShimStatus.read(record.dir) is None, "no shim ever ran"
    finally:
        gate.set()
        supervisor.stop_all(0)
        supervisor.launcher.close()


@pytest.fixture
def reports() -> Reports:
    return Reports()


@pytest.fixture
def supervisor(tmp_path, reports):
    supervisor = Supervisor(tmp_path, reports)
    yield supervisor
    supervisor.stop_all(0)
    supervisor.launcher.close()


@pytest.fixture
def stall(supervisor):
    """stall(attempt) holds that attempt's start thread once its shim runs the task, before the supervisor
    learns of the shim: it returns (set once it is held, set to let it go on)."""
    releases = []
    start = supervisor.starter.start

    def stall_after_shim(attempt: Attempt) -> tuple[threading.Event, threading.Event]:
        held, release = threading.Event(), threading.Event()
        releases.append(release)

        def stalled(record, launch):
            shim = start(record, launch)
            if record.attempt == attempt:
                deadline = time.monotonic() + 30
                while not _running(record.dir) and time.monotonic() < deadline:
                    time.sleep(0.01)
                held.set()
                release.wait(30)
            return shim
        supervisor.starter.start = stalled
        return held, release
    yield stall_after_shim
    for release in releases:
        release.set()


def _running(attempt_dir) -> bool:
    status = ShimStatus.read(attempt_dir)
    return status is not None and status.phase == Phase.RUNNING


def test_a_stop_that_comes_as_the_shim_starts_stops_the_shim(supervisor, reports, stall):
    launch = order("shim-stop", 1, "sleep", "60")
    held, release = stall(launch.attempt)
    supervisor.launch(launch)
    assert held.wait(30)
    record = supervisor.current(launch.attempt)
    supervisor.stop(launch.attempt, 30.0)
    reports.wait_for(launch.attempt, Phase.EXITED)
    release.set()
    assert let_go(record), "the shim stopped its task at once"
    time.sleep(0.3)
    assert reports.of(launch.attempt) == [Phase.EXITED], "one end, never RUNNING after it"
    assert supervisor.current(launch.attempt).phase == Phase.EXITED


def test_a_newer_attempt_launched_while_the_older_starts_wins(supervisor, reports, stall):
    older, newer = order("newer", 1, "sleep", "60"), order("newer", 2, "sleep", "60")
    held, release = stall(older.attempt)
    supervisor.launch(older)
    assert held.wait(30)
    old_record = supervisor.current(older.attempt)
    supervisor.launch(newer)
    release.set()
    reports.wait_for(newer.attempt, Phase.RUNNING)
    assert let_go(old_record), "the older attempt's shim stopped its task at once"
    assert Phase.RUNNING not in reports.of(older.attempt)
    assert supervisor.current(older.attempt) is None and supervisor.current(newer.attempt).phase == Phase.RUNNING
    assert psutil.pid_exists(supervisor.current(newer.attempt).pid)


def test_many_launches_start_side_by_side_and_each_reports_its_exit(supervisor, reports):
    launches = [order(f"many-{i}", 1, "sh", "-c", f"exit {i % 3}") for i in range(12)]
    for launch in launches:
        supervisor.launch(launch)
    for i, launch in enumerate(launches):
        reports.wait_for(launch.attempt, Phase.EXITED)
        assert supervisor.current(launch.attempt).exit.exit_code == i % 3
        assert reports.ran(launch.attempt) == [Phase.RUNNING, Phase.EXITED]
