"""The agent's health check runs the operator's program as Slurm's HealthCheckProgram convention has it: exit 0
passes, anything else fails with the program's first line, made one safe line; a program that hangs or cannot
run is a failure saying so."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tfcluster.daemon.agent.node.health import HealthCheck
from tfcluster.model import MAX_DRAIN_REASON


def program(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "check"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.parametrize("body, failure", [
    ("exit 0", ""),
    ("echo 'ERROR: nhc: Health check failed:  check_fs_mount:  /scratch not mounted'; exit 1",
     "ERROR: nhc: Health check failed:  check_fs_mount:  /scratch not mounted"),
    ("echo; echo '  GPU 1 fell off the bus  ' >&2; exit 3", "GPU 1 fell off the bus"),
    ("printf 'bad\\033[2Jline\\n'; exit 1", "bad?[2Jline"),
    ("kill -9 $$", "failed (signal 9) without a line of reason"),
])
def test_the_verdict_is_the_exit_and_the_first_line(tmp_path, body, failure):
    verdict = HealthCheck(program(tmp_path, body)).check()
    assert verdict == failure if not failure.startswith("failed (") else verdict.endswith(failure)


def test_a_long_line_is_cut_to_what_a_drain_reason_holds(tmp_path):
    assert len(HealthCheck(program(tmp_path, f"echo {'x' * 1000}; exit 1")).check()) == MAX_DRAIN_REASON


def test_a_check_that_hangs_or_cannot_run_is_a_failure_saying_so(tmp_path):
    hangs = HealthCheck(program(tmp_path, "sleep 30"), interval=300, timeout=0.5)
    assert hangs.check() == f"{hangs.program} did not finish within 0.5 s"
    gone = HealthCheck(tmp_path / "missing")
    assert gone.check().startswith(f"cannot run {tmp_path / 'missing'}: ")


def test_the_last_verdict_is_kept_until_the_next_check(tmp_path):
    flag = tmp_path / "sick"
    check = HealthCheck(program(tmp_path, f"test -e {flag} && {{ echo sick; exit 1; }}; exit 0"))
    assert check.check() == "" and check.failure == ""
    flag.touch()
    assert check.check() == "sick" and check.failure == "sick"
    flag.unlink()
    assert check.check() == "" and check.failure == ""
