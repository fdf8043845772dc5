"""Environments no task has used for --retain-for go at the agent's retention pass; one a running job names,
one used since, and one being built stay."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from tfcluster import layout
from tfcluster.daemon.agent.code.environments import Environments

DAY = 86400.0
NOW = 1_800_000_000.0


def made(envs: Environments, key: str, last_used: float, ready: bool = True) -> Path:
    """An environment as a build leaves it, last used at the time given."""
    directory = envs.root / key
    (directory / "venv" / "bin").mkdir(parents=True)
    if ready:
        (directory / "ready").write_text("")
        os.utime(directory / "ready", (last_used, last_used))
    os.utime(directory, (last_used, last_used))
    (envs.root / f"{key}.lock").touch()
    return directory


def named_by(envs: Environments, job_id: str, key: str) -> None:
    job = layout.job_dir(envs.state_dir, job_id)
    job.mkdir(parents=True)
    (job / "environment").write_text(key + "\n")


def test_only_unused_environments_past_their_time_go(tmp_path):
    envs = Environments(tmp_path, uv="/bin/false")
    old, running, recent, crashed = "a" * 64, "b" * 64, "c" * 64, "d" * 64
    for key, used in ((old, NOW - 8 * DAY), (running, NOW - 30 * DAY), (recent, NOW - DAY)):
        made(envs, key, used)
    made(envs, crashed, NOW - 8 * DAY, ready=False)
    named_by(envs, "job-1", running)
    assert sorted(envs.sweep({"job-1"}, NOW, 7 * DAY)) == [old, crashed]
    assert sorted(p.name for p in envs.root.iterdir()) == sorted([running, f"{running}.lock", recent,
                                                                   f"{recent}.lock"])


def test_an_environment_being_built_is_left_alone(tmp_path):
    envs = Environments(tmp_path, uv="/bin/false")
    key = "e" * 64
    made(envs, key, NOW - 30 * DAY, ready=False)
    fd = os.open(envs.root / f"{key}.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert envs.sweep(set(), NOW, 7 * DAY) == []
    finally:
        os.close(fd)
    assert envs.sweep(set(), NOW, 7 * DAY) == [key]


def test_the_sweep_closes_what_an_earlier_agent_left_open(tmp_path):
    """Earlier agents kept request copies and build logs that every user could read (0644 in 0755 dirs)."""
    envs = Environments(tmp_path, uv="/bin/false")
    key = "f" * 64
    directory = made(envs, key, NOW)
    (directory / "request").mkdir(mode=0o755)
    (directory / "request" / "requirements.txt").write_text("tinypkg\n")
    (directory / "build.log").write_text("uv's output\n")
    (tmp_path / "uv-cache").mkdir()
    lock = envs.root / f"{key}.lock"
    for path, mode in ((envs.root, 0o755), (directory, 0o755), (directory / "request" / "requirements.txt", 0o644),
                       (directory / "build.log", 0o644), (lock, 0o644), (tmp_path / "uv-cache", 0o755)):
        path.chmod(mode)
    assert envs.sweep(set(), NOW, 7 * DAY) == []
    modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in (
        envs.root, directory, directory / "request", directory / "request" / "requirements.txt",
        directory / "build.log", directory / "ready", lock, tmp_path / "uv-cache")}
    assert list(modes.values()) == ["0o711", "0o711", "0o700", "0o600", "0o600", "0o600", "0o600", "0o700"], modes
