"""Shims forked by the agent's launcher behave as shims started as interpreters of their own: a session of their
own, their exit seen at once, adopted by a new agent after a restart (the launcher gone); a dead launcher is
replaced, and with none the agent starts the shim itself."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tfcluster import layout
from tfcluster.commands import Launch
from tfcluster.daemon.agent.shim.runner import DRAIN_SECONDS, process_start
from tfcluster.daemon.agent.shim.taskfiles import LaunchFile, ShimStatus
from tfcluster.daemon.agent.tasks import launcher as launcher_module
from tfcluster.daemon.agent.tasks import forked_shim
from tfcluster.daemon.agent.tasks.record import is_shim
from tfcluster.daemon.agent.tasks.supervisor import Supervisor
from tfcluster.model import Attempt, Phase
from tests.unit.taskreports import Reports

TASK_UID = 2_100_999_000  # the job's user, as the coordinator gives it (an agent that is not root ignores it)


def launch(supervisor: Supervisor, job: str, *command: str) -> Attempt:
    attempt = Attempt(job, "worker", 0, 1)
    supervisor.launch(Launch("n", attempt, command, {"PATH": os.environ["PATH"]}, "/", 0, 1.0,
                             uid=TASK_UID, gid=TASK_UID))
    return attempt


def test_a_forked_shim_runs_in_a_session_of_its_own_and_its_exit_is_seen_at_once(tmp_path):
    reports = Reports()
    supervisor = Supervisor(tmp_path, reports)
    try:
        attempt = launch(supervisor, "fork-1", "sh", "-c", "exit 3")
        reports.wait_for(attempt, Phase.EXITED)
        record = supervisor.current(attempt)
        assert record.exit.exit_code == 3 and reports.ran(attempt) == [Phase.RUNNING, Phase.EXITED]
        shim = supervisor.launcher.process
        assert shim is not None, "the launcher forked it"
        status = ShimStatus.read(record.dir)
        assert status.shim_pid == record.shim_pid != shim.pid and status.shim_started > 0
        running = launch(supervisor, "fork-2", "sleep", "60")
        reports.wait_for(running, Phase.RUNNING)
        pid = supervisor.current(running).shim_pid
        assert os.getsid(pid) == pid, "a session of its own"
        assert psutil.Process(pid).name() == forked_shim.SHIM_NAME
        assert psutil.Process(pid).ppid() == supervisor.launcher.process.pid, "the launcher's child, not the agent's"
        assert is_shim(pid, supervisor.current(running).dir, process_start(pid))
    finally:
        supervisor.stop_all(0)
        supervisor.launcher.close()


def test_a_task_of_milliseconds_is_reported_once_and_one_that_runs_on_is_reported_running_before_its_end(tmp_path):
    reports = Reports()
    supervisor = Supervisor(tmp_path, reports)
    try:
        attempt = launch(supervisor, "runs-on", "sleep", "1")
        reports.wait_for(attempt, Phase.RUNNING)
        assert reports.of(attempt) == [Phase.RUNNING], "reported running while it runs, not at its end"
        reports.wait_for(attempt, Phase.EXITED)
        assert reports.of(attempt) == [Phase.RUNNING, Phase.EXITED]
        assert reports.pids == [(attempt, supervisor.current(attempt).pid)] * 2
    finally:
        supervisor.stop_all(0)
        supervisor.launcher.close()


def test_said_more_sees_the_end_in_the_buffer_in_the_pipe_or_within_its_time():
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as stdout:
        os.write(write_end, b'{"phase": "RUNNING", "pid": 7}\n' + forked_shim.DONE_LINE + b"\n")
        stdout.readline()
        assert launcher_module.said_more(stdout, 0), "read into the buffer with the RUNNING line"
        stdout.readline()
        began = time.monotonic()
        assert not launcher_module.said_more(stdout, 0.05), "nothing more: it waited its time"
        assert time.monotonic() - began >= 0.04
        os.write(write_end, forked_shim.DONE_LINE + b"\n")
        assert launcher_module.said_more(stdout, 10), "in the pipe"
        assert stdout.readline().rstrip() == forked_shim.DONE_LINE, "the peek took nothing away"
        os.close(write_end)
        assert launcher_module.said_more(stdout, 10), "its end (the shim exited) says the attempt is over too"
        assert os.get_blocking(stdout.fileno()), "left blocking, as the shim's watch reads it"


def test_shims_outlive_their_launcher_and_a_new_agent_adopts_them(tmp_path):
    reports = Reports()
    supervisor = Supervisor(tmp_path, reports)
    attempt = launch(supervisor, "survive-1", "sleep", "60")
    reports.wait_for(attempt, Phase.RUNNING)
    shim_pid = supervisor.current(attempt).shim_pid
    supervisor.launcher.close()  # as when the agent exits: its end of the socket closes
    assert psutil.pid_exists(shim_pid) and is_shim(shim_pid, supervisor.current(attempt).dir,
                                                   ShimStatus.read(supervisor.current(attempt).dir).shim_started)
    again = Reports()
    restarted = Supervisor(tmp_path, again)
    assert restarted.adopt_running() == 1
    try:
        restarted.stop(attempt, 0)
        again.wait_for(attempt, Phase.EXITED)
        assert restarted.current(attempt).exit.signal == signal.SIGKILL
    finally:
        restarted.stop_all(0)


def test_a_dead_launcher_is_replaced(tmp_path):
    reports = Reports()
    supervisor = Supervisor(tmp_path, reports)
    try:
        first = launch(supervisor, "again-1", "true")
        reports.wait_for(first, Phase.EXITED)
        old = supervisor.launcher.process
        old.kill()
        old.wait()
        second = launch(supervisor, "again-2", "true")
        reports.wait_for(second, Phase.EXITED)
        assert supervisor.launcher.process.pid != old.pid
        assert supervisor.current(second).exit.exit_code == 0
    finally:
        supervisor.launcher.close()


def test_without_a_launcher_the_agent_starts_the_shim_itself(tmp_path, monkeypatch, caplog):
    def no_pidfd(pid: int) -> int:
        raise OSError(38, "Function not implemented")
    monkeypatch.setattr(os, "pidfd_open", no_pidfd)  # Linux before 5.3
    caplog.set_level(logging.DEBUG, "tfcluster.agent")
    reports = Reports()
    supervisor = Supervisor(tmp_path, reports)
    attempt = launch(supervisor, "direct-1", "sh", "-c", "exit 4")
    reports.wait_for(attempt, Phase.EXITED)
    record = supervisor.current(attempt)
    assert record.exit.exit_code == 4 and supervisor.launcher.process is None
    assert "cannot start its shim (no pidfd_open on this system ([Errno 38] Function not implemented)); " \
           "starting it directly" in caplog.text
    again = launch(supervisor, "direct-2", "true")
    reports.wait_for(again, Phase.EXITED)
    assert supervisor.launcher.process is None and supervisor.current(again).exit.exit_code == 0


def test_the_launcher_ends_with_the_agent(tmp_path):
    handle = launcher_module.Launcher()
    handle.warm()
    process = handle.process
    handle.sock.close()  # the agent's end, as when the agent dies
    handle.sock = None
    assert process.wait(timeout=30) == 0


def test_a_shim_whose_answer_never_reached_the_agent_never_runs(tmp_path):
    """The agent would start another shim for the attempt: the one forked for it must not run its task."""
    marker = tmp_path / "ran"
    LaunchFile(Attempt("lost-1", "worker", 0, 1), ("touch", str(marker)), {"PATH": os.environ["PATH"]}).write(tmp_path)
    script = (
        "import os, socket, sys\n"
        "from tfcluster.daemon.agent.tasks import launcher_process as launcher\n"
        "ours, agent = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "agent.close()  # the agent died while the launcher forked\n"
        "out, err = os.open(os.devnull, os.O_WRONLY), os.open(os.devnull, os.O_WRONLY)\n"
        "launcher._answer(ours, os.fsencode(sys.argv[1]), [out, err], launcher.Shims())\n"
        "pid, status = os.wait()\n"
        "print(os.waitstatus_to_exitcode(status))\n")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "1", result.stderr
    assert not marker.exists() and ShimStatus.read(tmp_path) is None


# Prints more than a pipe holds, then ends, leaving a process of its group that holds its output open.
LOUD_TASK = "head -c 300000 /dev/zero | tr '\\0' x; echo; echo last line; sleep 60 & exit 5"


@pytest.mark.parametrize("pidfd", [True, False], ids=["watching-a-pidfd", "before-linux-5.3"])
def test_a_shim_keeps_all_the_output_and_ends_with_its_task_though_the_task_left_a_process_behind(tmp_path, pidfd):
    LaunchFile(Attempt("loud-1", "worker", 0, 1), ("sh", "-c", LOUD_TASK), {"PATH": os.environ["PATH"]}).write(tmp_path)
    script = ("import os, sys\n"
              f"{'' if pidfd else 'del os.pidfd_open'}\n"
              "from tfcluster.daemon.agent.shim.runner import main\n"
              "sys.exit(main())\n")
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=60, capture_output=True)
    assert time.monotonic() - began < DRAIN_SECONDS, "the process left behind was killed with the task's group"
    status = ShimStatus.read(tmp_path)
    assert status.exit.exit_code == 5 and status.exit.log_tail[-1] == "last line"
    assert (tmp_path / layout.OUTPUT_FILE).read_bytes() == b"x" * 300000 + b"\nlast line\n"


# The check installs handlers of its own first: what the process inherited (a shell that starts a job with `&`
# ignores SIGINT, and Python then installs no handler of its own) must not decide the outcome.
WARM_UP_CHECK = """
import os, signal, sys, threading
from tfcluster.daemon.agent.tasks import launcher_process as launcher
def on_term(*_): pass
def on_int(*_): pass
signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGINT, on_int)
sys.stdout.write("before ")
sys.stdout.flush()
launcher.warm_up()
print("threads", threading.active_count(), "sigterm kept", signal.getsignal(signal.SIGTERM) is on_term,
      "sigint kept", signal.getsignal(signal.SIGINT) is on_int, "fds", len(os.listdir("/proc/self/fd")))
"""


def test_the_launchers_warm_up_runs_a_shim_and_leaves_the_launcher_as_it_found_it(tmp_path):
    """The launcher runs one shim of `true` in itself before it forks any (launcher.warm_up): afterwards it must be
    the process it was, single-threaded above all (it forks), with its own signal handlers and stdout, and nothing
    of the scratch attempt left behind."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    fds = subprocess.run([sys.executable, "-c", "import os; print(len(os.listdir('/proc/self/fd')))"],
                         capture_output=True, text=True, check=True, env=env).stdout.strip()
    done = subprocess.run([sys.executable, "-c", WARM_UP_CHECK], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # nothing failed: a failed warm-up says so there
    assert done.stdout == f"before threads 1 sigterm kept True sigint kept True fds {fds}\n"
    assert list(tmp_path.iterdir()) == []


def test_the_launcher_imports_nothing_with_an_at_fork_hook():
    """threading, logging and random each run a hook in every child the launcher forks, and each page such a hook
    writes to is copied into the shim first (launcher_process.py): the launcher, its shim code imported and
    warmed up, must have imported none of them."""
    script = ("import sys\n"
              "from tfcluster.daemon.agent.tasks import launcher_process\n"
              "import tfcluster.daemon.agent.shim.runner\n"
              "launcher_process.warm_up()\n"
              "print(sorted(m for m in ('threading', 'logging', 'random', 'subprocess') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "[]\n", "")
