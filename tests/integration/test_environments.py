"""Jobs' environments built with the real uv from a wheel this test writes, served with UV_FIND_LINKS and no index:
built once per node however many tasks start at once, reused by the next job, first on the task's PATH, seeing
the agent's own packages unless isolated, and a failed build fails the task with uv's own words."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from harness import wait_until
from tfcluster.commands import Launch
from tfcluster.daemon.agent.code.environments import Environments
from tfcluster.daemon.agent.tasks.supervisor import Supervisor
from tfcluster.daemon.agent.tasks.users import TaskUsers, make_state_dir
from tfcluster.model import Attempt, EnvironmentSpec
from tfcluster.states import Phase
from wheels import write_wheel

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent under test runs tasks as root (a root agent)")

# psutil is one of the agent's own packages (a tfcluster dependency), not the base interpreter's.
PROBE = "import os, sys, tinypkg; print(tinypkg.VALUE, sys.prefix == os.environ['VIRTUAL_ENV'])\n"


@pytest.fixture
def node(tmp_path: Path, monkeypatch):
    """A supervisor with its environments; uv sees only the test's wheels (no index), and every uv run is counted."""
    monkeypatch.setenv("UV_NO_INDEX", "1")
    write_wheel(tmp_path / "wheels")
    counter = tmp_path / "uv-runs"
    uv = tmp_path / "uv"
    real = Environments(tmp_path).uv
    uv.write_text(f"#!/bin/sh\necho \"$1\" >> {counter}\nexec {real} \"$@\"\n")
    uv.chmod(0o755)
    state = tmp_path / "state"
    make_state_dir(state)
    reports = []
    supervisor = Supervisor(state, reports.append, task_users=TaskUsers(allow_root=True),
                            environments=Environments(state, uv=str(uv), find_links=str(tmp_path / "wheels")))
    work = tmp_path / "work"
    work.mkdir()
    (work / "requirements.txt").write_text("tinypkg\n")
    (work / "probe.py").write_text(PROBE)
    supervisor.venv_builds = lambda: counter.read_text().split().count("venv") if counter.exists() else 0
    return supervisor, work, reports


def launch(supervisor: Supervisor, job: str, index: int, command: tuple[str, ...], work: Path,
           spec: EnvironmentSpec = EnvironmentSpec("requirements.txt")) -> Attempt:
    attempt = Attempt(job, "worker", index, 1)
    supervisor.launch(Launch("n", attempt, command, {"PATH": os.environ["PATH"]}, str(work), 0, 1.0, environment=spec))
    return attempt


def ended(supervisor: Supervisor, attempt: Attempt):
    wait_until(lambda: supervisor.current(attempt).exited.is_set(), 120, what=f"{attempt} to end")
    return supervisor.current(attempt)


def output(supervisor: Supervisor, attempt: Attempt) -> str:
    return (supervisor.current(attempt).dir / "output.log").read_text()


def test_two_tasks_starting_at_once_build_one_environment_and_the_next_job_reuses_it(node):
    supervisor, work, reports = node
    threads = [threading.Thread(target=launch, args=(supervisor, "j-1", i, ("python3", "probe.py"), work))
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = [ended(supervisor, Attempt("j-1", "worker", i, 1)) for i in range(2)]
    assert [r.exit.exit_code for r in first] == [0, 0], [r.exit for r in first]
    # `python3` is the environment's: its prefix is VIRTUAL_ENV, and the wheel is importable
    assert output(supervisor, first[0].attempt) == "42 True\n"
    assert supervisor.venv_builds() == 1
    again = ended(supervisor, launch(supervisor, "j-2", 0, ("python3", "probe.py"), work))
    assert again.exit.exit_code == 0 and supervisor.venv_builds() == 1  # found built: no uv run at all
    log = supervisor.environments.log_path("j-2").read_text()
    assert "+ tinypkg==1.0" in log and log.endswith("environment ready\n")


@pytest.mark.parametrize("isolated", [False, True])
def test_the_agents_packages_are_seen_unless_isolated(node, isolated):
    supervisor, work, _ = node
    command = ("python3", "-c", "import tinypkg\ntry:\n import psutil; print('agent packages')\n"
                                "except ImportError:\n print('isolated')")
    record = ended(supervisor, launch(supervisor, "j-iso", 0, command, work, EnvironmentSpec("requirements.txt",
                                                                                              isolated)))
    assert record.exit.exit_code == 0, record.exit
    assert output(supervisor, record.attempt) == ("isolated\n" if isolated else "agent packages\n")


def test_a_missing_package_fails_the_task_with_uvs_own_message(node):
    supervisor, work, reports = node
    (work / "requirements.txt").write_text("nosuchpkg-tfcluster\n")
    record = ended(supervisor, launch(supervisor, "j-bad", 0, ("python3", "probe.py"), work))
    assert record.phase == Phase.FAILED_TO_START
    assert "building the job's environment failed (uv pip exited with 1)" in record.exit.message
    assert "nosuchpkg-tfcluster" in record.exit.message and "not found" in record.exit.message
    assert any("nosuchpkg-tfcluster" in line for line in record.exit.log_tail)
    assert reports[-1].phase == Phase.FAILED_TO_START
    # Nothing half-built is taken for built: the next try builds again.
    (work / "requirements.txt").write_text("tinypkg\n")
    assert ended(supervisor, launch(supervisor, "j-good", 0, ("python3", "probe.py"), work)).exit.exit_code == 0


def test_a_task_waiting_for_its_environment_says_so_and_a_stop_keeps_it_from_starting(node, tmp_path):
    supervisor, work, reports = node
    gate = tmp_path / "gate"
    slow = tmp_path / "slow-uv"
    slow.write_text(f"#!/bin/sh\nwhile [ ! -e {gate} ]; do sleep 0.05; done\nexec {supervisor.environments.uv} \"$@\"\n")
    slow.chmod(0o755)
    supervisor.environments.uv = str(slow)
    attempt = launch(supervisor, "j-slow", 0, ("python3", "probe.py"), work)
    wait_until(lambda: supervisor.progress(), 10, what="the waiting task in the progress list")
    assert supervisor.progress()[0].phase_detail.startswith("building environment (")
    supervisor.stop(attempt, 5.0)
    gate.write_text("")
    record = ended(supervisor, attempt)
    assert record.exit.message == "stopped before it started" and record.pid == 0 and not record.shim_pid
