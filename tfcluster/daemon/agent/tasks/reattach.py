"""What a restarted agent finds on disk of the attempts an earlier agent process started: each one's record, from
its launch and status files (supervisor.py's adopt_running reattaches to those still running and reports those
that ended meanwhile)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

from tfcluster import layout
from tfcluster.daemon.agent.shim.taskfiles import LaunchFile, ShimStatus, TaskFileError
from tfcluster.daemon.agent.tasks.record import TaskRecord

log = logging.getLogger("tfcluster.agent")


def recorded_attempts(state_dir: Path, ended_since: float) -> Iterator[tuple[TaskRecord, ShimStatus]]:
    """The record and status of each attempt on this node that still runs or ended after ended_since; a bad file
    is named in the log and its attempt left alone."""
    for directory in attempt_dirs(state_dir):
        try:
            status = ShimStatus.read(directory)
            # An attempt that ended long ago (a node keeps days of them) needs no more than its status read.
            wanted = status is not None and (not status.ended or status.finished >= ended_since)
            launch = LaunchFile.read(directory) if wanted else None
        except TaskFileError as e:
            log.warning("not reattaching to %s: %s", directory, e)
            continue
        if status is not None and launch is not None:
            yield TaskRecord.from_files(directory, launch, status), status


def attempt_dirs(state_dir: Path) -> Iterator[Path]:
    """Every attempt dir of the jobs on this node, those of jobs marked over too: one of theirs that still runs
    (started as its job ended) is reattached to, reported, and stopped by the coordinator, not left running
    unwatched."""
    try:
        jobs = sorted(os.scandir(layout.jobs_dir(state_dir)), key=lambda entry: entry.name)
    except OSError:  # no jobs dir yet
        return
    for job in jobs:
        if job.is_dir(follow_symlinks=False):
            yield from sorted(_attempts_of(job.path))


def _attempts_of(job_dir: str) -> Iterator[Path]:
    """tasks/<task>/attempt-<n> under a job's dir (os.scandir: Path.glob took most of a restart's time)."""
    try:
        tasks = [entry.path for entry in os.scandir(os.path.join(job_dir, layout.TASKS_NAME))
                 if entry.is_dir(follow_symlinks=False)]
    except OSError:  # no task started here yet
        return
    for task in tasks:
        try:
            yield from (Path(entry.path) for entry in os.scandir(task)
                        if entry.name.startswith(layout.ATTEMPT_DIR_PREFIX) and entry.is_dir(follow_symlinks=False))
        except OSError:  # removed meanwhile
            continue
