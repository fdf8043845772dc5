"""A shim the launcher forked runs the next attempt once its own ended cleanly (forked_shim.py): each attempt must
then be exactly what it would be in a fresh shim. Above all, nothing of one job's task reaches the next job's:
not its private /tmp, not its "no new privileges" (which a task without a user of its own must not inherit);
and a shim that ever ran a thread, or whose launcher is gone, serves no other attempt."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tfcluster import layout
from tfcluster.commands import Launch
from tfcluster.daemon.agent.shim.taskfiles import LaunchFile, ShimStatus
from tfcluster.daemon.agent.tasks import launcher_process
from tfcluster.daemon.agent.tasks.launcher import Launcher
from tfcluster.daemon.agent.tasks.supervisor import Supervisor
from tfcluster.model import Attempt, Phase
from tests.unit.taskreports import Reports

TASK_UID = 2_100_998_000  # a job's own user, as the coordinator gives it
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="tasks under a user of their own, and private /tmp, take root")


@pytest.fixture
def launcher():
    handle = Launcher()
    yield handle
    handle.close()


def run(launcher: Launcher, attempt_dir: Path, command: str, no_new_privileges: bool = False, **launch) -> ShimStatus:
    """One attempt through the launcher, as the agent runs it: its shim's end collected, then the shim released."""
    number = len(list(attempt_dir.parent.iterdir()))
    attempt_dir.mkdir()
    LaunchFile(Attempt("reuse", "worker", 0, number), ("sh", "-c", command), {"PATH": os.environ["PATH"]},
               workdir="/", **launch).write(attempt_dir)
    stderr = os.open(attempt_dir / layout.SHIM_LOG_FILE, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        shim = launcher.spawn(attempt_dir, stderr, no_new_privileges)
    finally:
        os.close(stderr)
    shim.wait()
    shim.release()
    status = ShimStatus.read(attempt_dir)
    assert status is not None and status.ended, (attempt_dir / layout.SHIM_LOG_FILE).read_text()
    settled(status.shim_pid)
    return status


def settled(pid: int, timeout: float = 30) -> None:
    """Until the shim waits for its next attempt (its stdout and stderr back on /dev/null, asleep: it has told the
    launcher it is free), or is gone. Otherwise the next attempt could come before the shim said it is free."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            shim = psutil.Process(pid)
            if shim.status() == psutil.STATUS_ZOMBIE:
                return
            if all(os.readlink(f"/proc/{pid}/fd/{fd}") == os.devnull for fd in (1, 2)) and \
                    shim.status() == psutil.STATUS_SLEEPING:
                return
        except (psutil.NoSuchProcess, FileNotFoundError):
            return
        time.sleep(0.01)


def output(attempt_dir: Path) -> str:
    return (attempt_dir / layout.OUTPUT_FILE).read_text()


def test_a_shim_runs_the_next_attempt_and_each_ends_as_its_own(tmp_path, launcher):
    first = run(launcher, tmp_path / "a", "echo one; exit 3")
    second = run(launcher, tmp_path / "b", "echo two; exit 4")
    assert second.shim_pid == first.shim_pid, "the free shim ran the second attempt"
    assert (first.exit.exit_code, second.exit.exit_code) == (3, 4)
    assert (output(tmp_path / "a"), output(tmp_path / "b")) == ("one\n", "two\n")
    assert len(psutil.Process(launcher.process.pid).children()) == 1, "no shim forked for the second"


def test_a_shim_that_ran_a_thread_serves_no_other_attempt(tmp_path, launcher):
    """A task that runs past a tenth of a second has its process tree watched from a thread of its shim's."""
    first = run(launcher, tmp_path / "a", "sleep 0.4")
    second = run(launcher, tmp_path / "b", "true")
    assert second.shim_pid != first.shim_pid
    assert not psutil.pid_exists(first.shim_pid) or psutil.Process(first.shim_pid).status() == psutil.STATUS_ZOMBIE


def test_an_interpreter_that_imports_threading_at_startup_still_uses_its_shims_again(tmp_path, monkeypatch):
    """A sitecustomize (or a .pth file) that imports logging has threading imported in every process, the launcher
    and its shims too: that alone says nothing of an attempt's threads. The free shim runs the next attempt; one
    whose task was watched from a thread still serves no other."""
    site, started = tmp_path / "site", tmp_path / "started"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import logging, os\nwith open({str(started)!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    launcher = Launcher()
    try:
        attempts = tmp_path / "attempts"
        attempts.mkdir()
        first = run(launcher, attempts / "a", "exit 3")
        assert str(launcher.process.pid) in started.read_text().split(), "the site hook ran in the launcher"
        second = run(launcher, attempts / "b", "true")
        assert second.shim_pid == first.shim_pid, "the free shim ran the second attempt"
        watched = run(launcher, attempts / "c", "sleep 0.4")
        assert watched.shim_pid == first.shim_pid
        after = run(launcher, attempts / "d", "true")
        assert after.shim_pid != watched.shim_pid, "a shim that ran a thread serves no other attempt"
        assert (first.exit.exit_code, second.exit.exit_code, watched.exit.exit_code, after.exit.exit_code) == \
            (3, 0, 0, 0)
    finally:
        launcher.close()


def test_free_shims_end_with_their_launcher(tmp_path, launcher):
    shim = run(launcher, tmp_path / "a", "true").shim_pid
    assert psutil.Process(shim).status() != psutil.STATUS_ZOMBIE, "free, waiting for another attempt"
    launcher.close()  # as when the agent exits
    deadline = time.monotonic() + 30
    while psutil.pid_exists(shim) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not psutil.pid_exists(shim)


@as_root
def test_no_new_privileges_never_reach_a_task_that_runs_without_them(tmp_path, launcher):
    """A task under a user of its own runs with no new privileges, set in its shim for good: that shim must never
    run a task of the agent's own user, which may use setuid programs (sudo)."""
    show = "grep NoNewPrivs /proc/self/status"
    restricted = run(launcher, tmp_path / "a", show, True, uid=TASK_UID, gid=TASK_UID)
    free = run(launcher, tmp_path / "b", show)
    again = run(launcher, tmp_path / "c", show, True, uid=TASK_UID, gid=TASK_UID)
    assert [output(tmp_path / d).split() for d in "abc"] == [["NoNewPrivs:", "1"], ["NoNewPrivs:", "0"],
                                                             ["NoNewPrivs:", "1"]]
    assert free.shim_pid != restricted.shim_pid
    assert again.shim_pid in (restricted.shim_pid, free.shim_pid), "a free shim ran it"


# A shim whose task outlives WATCH_AFTER_SECONDS (shim/runner.py) starts a thread to watch the task's tree, and then
# serves no other attempt. Under load (CI runs tests beside TensorFlow jobs) a task that enters a private /tmp can
# take that long, and the next task gets a fresh shim, which proves nothing about a shim used again: the three are
# run again.
REUSE_TRIES = 5


@as_root
def test_a_jobs_private_tmp_stays_with_it_when_its_shim_runs_the_next_job(tmp_path, launcher):
    """One shim runs a task of job A (its /tmp is A's dir), then one of job B, then one with no private /tmp: B must
    see none of A's files, and the last one the host's /tmp. Whichever shims ran them, each try must hold."""
    user = {"uid": TASK_UID, "gid": TASK_UID}
    for n in range(REUSE_TRIES):
        dirs = {}
        for job in ("a", "b"):
            dirs[job] = tmp_path / f"tmp-{job}-{n}"
            dirs[job].mkdir()
            os.chown(dirs[job], TASK_UID, TASK_UID)
        attempts = tmp_path / f"attempts-{n}"
        attempts.mkdir()
        first = run(launcher, attempts / "a", "echo secret > /tmp/of-a; ls /tmp", True, private_tmp=str(dirs["a"]),
                    **user)
        second = run(launcher, attempts / "b", "ls -a /tmp; cat /tmp/of-a", True, private_tmp=str(dirs["b"]),
                     **user)
        host = tempfile.mkdtemp(dir="/tmp")  # the host's /tmp (tmp_path may lie elsewhere)
        try:
            third = run(launcher, attempts / "c", f"test -d {host} && echo host", True, **user)
        finally:
            os.rmdir(host)
        assert (dirs["a"] / "of-a").read_text() == "secret\n" and output(attempts / "a") == "of-a\n"
        assert second.exit.exit_code != 0 and "secret" not in output(attempts / "b")
        assert output(attempts / "b").split()[:2] == [".", ".."] and "of-a" not in output(attempts / "b").split()
        assert third.exit.exit_code == 0 and output(attempts / "c") == "host\n"
        if first.shim_pid == second.shim_pid == third.shim_pid:
            return
    pytest.fail(f"no shim ran all three tasks in {REUSE_TRIES} tries")


def freed_shims(count: int) -> tuple[launcher_process.Shims, list[socket.socket]]:
    """The launcher's side of count shims (pids 1000...) that each said they are free, oldest first, and the
    shims' ends of their channels."""
    shims = launcher_process.Shims()
    theirs = []
    for pid in range(count):
        ours, their_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        shims.add(1000 + pid, ours)
        their_end.send(b"free 0")
        shims.heard(ours.fileno())
        theirs.append(their_end)
    return shims, theirs


def test_the_launcher_keeps_few_shims_free_and_not_for_long():
    shims, theirs = freed_shims(launcher_process.MAX_FREE_SHIMS + 2)
    assert len(shims.free) == launcher_process.MAX_FREE_SHIMS
    for their_end in theirs[:2]:  # the two freed first were told to end: the end of their channel
        assert their_end.recv(64) == b""
    assert shims.take(no_new_privileges=False)[0] == 1000 + launcher_process.MAX_FREE_SHIMS + 1, "the newest"
    assert shims.expire(time.monotonic() + launcher_process.FREE_SECONDS) is None
    assert shims.free == [] and len(shims.channels) == 1, "the one taken is busy, not free"
    for their_end in theirs[2:-1]:
        assert their_end.recv(64) == b""
        their_end.close()
    theirs[-1].close()


def test_a_burst_s_extra_free_shims_end_soon_and_the_first_few_stay():
    shims, theirs = freed_shims(launcher_process.KEPT_FREE_SHIMS + 3)
    freed = time.monotonic()
    due = shims.expire(freed + launcher_process.BURST_FREE_SECONDS - 0.5)
    assert len(shims.free) == launcher_process.KEPT_FREE_SHIMS + 3, "none is due yet"
    assert 0 < due <= 0.5
    due = shims.expire(freed + launcher_process.BURST_FREE_SECONDS + 0.5)
    assert len(shims.free) == launcher_process.KEPT_FREE_SHIMS, "those past the kept ones ended"
    for their_end in theirs[:3]:  # the oldest went: the end of their channels
        assert their_end.recv(64) == b""
    assert due > launcher_process.FREE_SECONDS - launcher_process.BURST_FREE_SECONDS - 1, "the rest stay for long"
    assert shims.take(no_new_privileges=False)[0] == 1000 + launcher_process.KEPT_FREE_SHIMS + 2, "the newest"
    for their_end in theirs:
        their_end.close()


def test_the_supervisor_runs_short_attempts_one_after_another_in_one_shim(tmp_path):
    reports = Reports()
    supervisor = Supervisor(tmp_path, reports)
    try:
        pids = []
        for n in range(3):
            attempt = Attempt(f"short-{n}", "worker", 0, 1)
            supervisor.launch(Launch("n", attempt, ("sh", "-c", f"exit {n}"), {"PATH": os.environ["PATH"]}, "/", 0,
                                     1.0, uid=TASK_UID, gid=TASK_UID))
            reports.wait_for(attempt, Phase.EXITED)
            record = supervisor.current(attempt)
            assert record.exit.exit_code == n and reports.ran(attempt) == [Phase.RUNNING, Phase.EXITED]
            pids.append(ShimStatus.read(record.dir).shim_pid)
            settled(pids[-1])
        assert len(set(pids)) == 1, "released once collected, the shim ran the next one"
    finally:
        supervisor.stop_all(0)
        supervisor.launcher.close()
