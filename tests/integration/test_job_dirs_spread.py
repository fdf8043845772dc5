"""An agent marks its jobs dir as the top of a hierarchy (`chattr +T`) where the filesystem has the mark, so that
ext4 places each job's dir in a block group of its own instead of beside the jobs removed before it; where the
filesystem has no such mark (tmpfs here), the agent starts and runs jobs all the same."""

from __future__ import annotations

import array
import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import psutil
import pytest

from harness import LocalCluster
from tfcluster import layout
from tfcluster.daemon.agent.tasks.users import (FS_IOC_GETFLAGS, FS_TOPDIR_FL, TaskUser, make_state_dir,
                                                prepare_job, spread_subdirs)

TMPFS = Path("/dev/shm")


def inode_flags(path: Path) -> int | None:
    """The dir's inode flags, None where its filesystem keeps none."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        return flags[0]
    except OSError:
        return None
    finally:
        os.close(fd)


def test_the_jobs_dir_is_marked_and_keeps_its_other_flags(tmp_path):
    if inode_flags(tmp_path) is None:
        pytest.skip(f"{tmp_path}'s filesystem keeps no inode flags")
    state = tmp_path / "state"
    make_state_dir(state)
    jobs = layout.jobs_dir(state)
    flags = inode_flags(jobs)
    assert flags & FS_TOPDIR_FL
    # `lsattr` (e2fsprogs) reads the same flag: what an operator sees.
    shown = subprocess.run(["lsattr", "-d", str(jobs)], capture_output=True, text=True, check=True).stdout
    assert "T" in shown.split()[0]
    make_state_dir(state)  # an agent's restart: the mark stays, and nothing else of the dir's flags changes
    assert inode_flags(jobs) == flags
    assert oct(jobs.stat().st_mode & 0o777) == "0o711"


def test_a_jobs_dir_removed_by_hand_is_made_again_for_the_next_job(tmp_path):
    """A task's start makes its job's dir in the jobs dir the agent made when it started; an operator who removed
    that dir meanwhile gets it back, as the agent makes it, with the job's dirs in it."""
    state = tmp_path / "state"
    make_state_dir(state)
    shutil.rmtree(layout.jobs_dir(state))
    paths = prepare_job(state, "job-1", TaskUser(None, None))
    assert paths.home.is_dir() and paths.tmp.is_dir() and paths.checkpoints.is_dir()
    assert oct(layout.jobs_dir(state).stat().st_mode & 0o777) == "0o711"


def test_a_filesystem_without_the_mark_makes_the_state_dir_all_the_same():
    if not any(p.mountpoint == str(TMPFS) and p.fstype == "tmpfs" for p in psutil.disk_partitions(all=True)):
        pytest.skip(f"needs a tmpfs at {TMPFS}")
    state = TMPFS / f"tfcluster-spread-{os.getpid()}"
    try:
        make_state_dir(state)
        jobs = layout.jobs_dir(state)
        assert not spread_subdirs(jobs)  # tmpfs keeps a few inode flags (append, immutable...), never this one
        assert not (inode_flags(jobs) or 0) & FS_TOPDIR_FL
        assert oct(jobs.stat().st_mode & 0o777) == "0o711"
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent runs its tasks as their jobs' users only as root")
def test_a_running_agent_has_marked_its_jobs_dir_and_runs_jobs_under_it(tmp_path):
    if inode_flags(tmp_path) is None:
        pytest.skip(f"{tmp_path}'s filesystem keeps no inode flags")
    cluster = LocalCluster(root=tmp_path)
    try:
        cluster.start_coordinator()
        cluster.start_agents({"a": {}})
        jobs = layout.jobs_dir(cluster.agent_state_dir("a"))
        assert inode_flags(jobs) & FS_TOPDIR_FL
        result = cluster.cli("start", "--name", "spread", "--strategy", "mirrored", "--wait", "--", "true")
        assert result.returncode == 0, result.stdout + result.stderr
        assert [p.name for p in jobs.iterdir()] and all(p.is_dir() for p in jobs.iterdir())
    finally:
        cluster.teardown()
