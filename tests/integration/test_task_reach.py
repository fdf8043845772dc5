"""A task whose program, workdir or checkpoint dir is out of its user's reach fails to start at once, saying which
directory stops that user and what to do, and the job is not restarted for it: no restart would change it.

Real supervisors, shims and per-job UIDs (root only), and a real cluster for the job's side: what a user sees in
`tfcluster status`, and that the cluster goes on running the next job.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from harness import running_cluster, wait_until
from tfcluster import layout
from tfcluster.commands import Launch
from tfcluster.daemon.agent.tasks.supervisor import Supervisor
from tfcluster.daemon.agent.tasks.users import TaskUsers, make_state_dir
from tfcluster.model import Attempt
from tfcluster.states import Phase

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tasks switch to their job's UID only under a root agent")

UID = 61999


def launch(tmp_path: Path, command: tuple[str, ...], env: dict[str, str] | None = None, workdir: str = ""):
    """One task through a real supervisor and shim, as the job's UID; its last report once it ended."""
    reports = []
    state = tmp_path / "state"
    make_state_dir(state)
    supervisor = Supervisor(state, reports.append, task_users=TaskUsers())
    attempt = Attempt("j-1", "worker", 0, 1)
    supervisor.launch(Launch("n", attempt, command, env or {}, workdir, 0, 1.0, uid=UID, gid=UID))
    wait_until(lambda: supervisor.current(attempt).exited.is_set(), 30, what="the task to end")
    supervisor.launcher.close()
    return reports[-1]


def locked_python(tmp_path: Path) -> tuple[Path, Path]:
    """A Python only root reaches (its dir is 0700, as a Python installed under /root is), and a link to it from an
    open dir (as a virtualenv's bin/python is): (the locked dir, the link)."""
    locked = tmp_path / "home-of-root"
    (locked / "bin").mkdir(parents=True)
    (locked / "bin" / "python3").symlink_to(os.path.realpath(sys.executable))
    locked.chmod(0o700)
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(locked / "bin" / "python3")
    return locked, venv_bin / "python"


def assert_names_the_lock(report, locked: Path) -> None:
    assert report.phase == Phase.FAILED_TO_START
    assert report.exit.permanent, "no restart can mend it"
    message = report.exit.message
    assert f"this job's user (uid {UID}) cannot pass through {locked} (mode 0700, owner root:root)" in message
    assert f"chmod o+x {locked}" in message


def test_a_program_behind_a_closed_dir_names_that_dir_through_the_link(tmp_path):
    locked, python = locked_python(tmp_path)
    report = launch(tmp_path, (str(python), "-c", "pass"))
    assert report.exit.message.startswith(f"cannot start command '{python}': Permission denied; ")
    assert_names_the_lock(report, locked)


def test_a_program_found_on_path_only_behind_a_closed_dir(tmp_path):
    locked, _ = locked_python(tmp_path)
    report = launch(tmp_path, ("python3", "-c", "pass"), env={"PATH": f"{locked}/bin"})
    assert f"on the task's PATH ({locked}/bin)" in report.exit.message
    assert_names_the_lock(report, locked)


def test_a_script_whose_interpreter_is_behind_a_closed_dir(tmp_path):
    locked, _ = locked_python(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(f"#!{locked}/bin/python3\nprint('never')\n")
    script.chmod(0o755)
    report = launch(tmp_path, (str(script),))
    assert f"its #! interpreter {locked}/bin/python3: " in report.exit.message
    assert_names_the_lock(report, locked)


def test_a_missing_program_says_where_it_was_looked_for(tmp_path):
    report = launch(tmp_path, ("no-such-program",), env={"PATH": "/usr/bin:/bin"})
    assert report.exit.permanent
    assert report.exit.message == ("cannot start command 'no-such-program': No such file or directory; not found on "
                                   "the task's PATH (/usr/bin:/bin)")


def test_a_workdir_behind_a_closed_dir(tmp_path):
    locked, _ = locked_python(tmp_path)
    report = launch(tmp_path, (sys.executable, "-c", "pass"), workdir=str(locked / "bin"))
    assert report.exit.message.startswith(f"cannot enter the workdir {locked}/bin: ")
    assert_names_the_lock(report, locked)


def test_a_checkpoint_dir_the_job_cannot_write_fails_at_once_saying_why(tmp_path):
    shared = tmp_path / "root-owned"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    report = launch(tmp_path, (sys.executable, "-c", "pass"),
                    env={layout.CHECKPOINT_DIR: str(shared / "ckpt"), layout.MODEL_DIR: str(shared / "ckpt")})
    assert report.phase == Phase.FAILED_TO_START and report.exit.permanent
    assert report.exit.message == (
        f"{shared}/ckpt: cannot be created by this job's user (uid {UID}) (Permission denied); tasks run under "
        f"per-job UIDs: use a dir that uid can write, or run tasks as their owners (--task-user owner)")
    assert not (shared / "ckpt").exists()
    existing = shared / "existing"
    existing.mkdir(mode=0o755)
    report = launch(tmp_path, (sys.executable, "-c", "pass"), env={layout.CHECKPOINT_DIR: str(existing)})
    assert report.exit.message.startswith(f"{existing}: not writable by this job's user (uid {UID}); ")


def test_the_job_fails_at_once_without_spending_its_restarts_and_the_cluster_goes_on(tmp_path_factory, tmp_path):
    locked, python = locked_python(tmp_path)
    with running_cluster(tmp_path_factory.mktemp("reach"), {"a": {}}) as cluster:
        result = cluster.cli("start", "--name", "locked", "--strategy", "mirrored", "--wait", "--", str(python),
                             "-c", "pass")
        job = cluster.job(result.stdout.strip())
        assert job["state"] == "FAILED" and job["restarts"] == 0, job
        assert f"cannot pass through {locked} (mode 0700" in job["message"]
        assert job["message"].endswith("not restarted: no restart would change that")
        ok = cluster.cli("start", "--name", "fine", "--strategy", "mirrored", "--wait", "--", sys.executable, "-c",
                         "pass")
        assert cluster.job(ok.stdout.strip())["state"] == "SUCCEEDED"
