"""The jobs' TensorBoard event files, as their tasks' agents send them (agent/hooks/summary_upload.py).

Kept under the coordinator's state dir, one folder per job and task (<state>/summaries/<job>/<type>-<index>/,
layout.py), so a job's summaries outlive the job and the nodes it ran on; retention removes a job's folder once
the job itself is let go (sweep). A job keeps at most summaries.MAX_JOB_BYTES: bytes past it are refused.

An event file only grows, so a chunk is written at its offset: one that starts past the file's end (bytes went
missing between) is refused, and bytes the store holds already are written again as they are (an agent sends
everything again after it registers). Paths were checked by wire.summary_from_proto; files are opened without
following a link all the same. Only the coordinator's user reads and writes here.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from tfcluster import layout, summaries
from tfcluster.summaries import SummaryChunk

log = logging.getLogger("tfcluster.coordinator")

DIR_MODE = 0o700
FILE_MODE = 0o600
READ_BUDGET_BYTES = 16 * 1024 * 1024  # one ReadSummaries call sends at most this much: the client calls again


class SummaryError(Exception):
    pass


class SummaryStore:
    def __init__(self, directory: Path, job_limit: int = summaries.MAX_JOB_BYTES):
        self.directory, self.job_limit = Path(directory), job_limit
        self.job_bytes: dict[str, int] = {}  # job -> bytes held, counted from its files on the first write

    def write(self, chunk: SummaryChunk) -> None:
        """Raises SummaryError (why the chunk is not kept) or OSError."""
        path = self._file(chunk.job_id, chunk.task_type, chunk.task_index, chunk.path)
        held = self._held(chunk.job_id)
        path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        try:
            size = os.fstat(fd).st_size
            if chunk.offset > size:
                raise SummaryError(f"{chunk.key}: bytes from {chunk.offset} on, but only {size} are held")
            growth = max(0, chunk.offset + len(chunk.data) - size)
            if held + growth > self.job_limit:
                raise SummaryError(f"job {chunk.job_id}'s summaries would pass {self.job_limit} bytes")
            os.pwrite(fd, chunk.data, chunk.offset)
        finally:
            os.close(fd)
        self.job_bytes[chunk.job_id] = held + growth

    def read(self, job_id: str, have: dict[str, int], budget: int = READ_BUDGET_BYTES) -> Iterator[SummaryChunk]:
        """The bytes of the job's files past what `have` says the client holds (by SummaryChunk.key)."""
        for task_type, task_index, relative, path in self._files(job_id):
            key = f"{summaries.task_key(task_type, task_index)}/{relative}"
            offset = have.get(key, 0)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue  # removed meanwhile (retention)
            with os.fdopen(fd, "rb") as f:
                f.seek(offset)
                while budget > 0:
                    data = f.read(min(summaries.MAX_CHUNK_BYTES, budget))
                    if not data:
                        break
                    yield SummaryChunk(job_id, task_type, task_index, relative, offset, data)
                    offset += len(data)
                    budget -= len(data)

    def sweep(self, kept_jobs: set[str]) -> None:
        """Removes the summaries of every job the coordinator no longer keeps (its retention let them go)."""
        if not self.directory.is_dir():
            return
        for entry in os.scandir(self.directory):
            if entry.name not in kept_jobs:
                shutil.rmtree(entry.path, ignore_errors=True)
                self.job_bytes.pop(entry.name, None)
                log.info("summaries of job %s removed: the job is no longer kept", entry.name)

    def task_folders(self, job_id: str) -> Iterator[tuple[str, int, str]]:
        """(task type, task index, folder) of each task of the job that sent summaries."""
        job_dir = self.directory / job_id
        if "/" in job_id or not job_dir.is_dir():
            return
        for task in sorted(os.scandir(job_dir), key=lambda e: e.name):
            task_type, _, index = task.name.rpartition("-")
            if task.is_dir(follow_symlinks=False) and index.isdigit():
                yield task_type, int(index), task.path

    def _held(self, job_id: str) -> int:
        if job_id not in self.job_bytes:
            self.job_bytes[job_id] = sum(os.lstat(path).st_size for *_, path in self._files(job_id))
        return self.job_bytes[job_id]

    def _file(self, job_id: str, task_type: str, task_index: int, relative: str) -> Path:
        if "/" in job_id or job_id in ("", ".", "..") or "/" in task_type or task_type in ("", ".", ".."):
            raise SummaryError(f"not a job and task: {job_id[:200]!r}, {task_type[:40]!r}")
        return self.directory / job_id / layout.task_name(task_type, task_index) / relative

    def _files(self, job_id: str) -> Iterator[tuple[str, int, str, str]]:
        """(task type, task index, path below the task's folder, full path) of the job's event files, in order."""
        for task_type, task_index, task_folder in self.task_folders(job_id):
            for folder, dirs, names in os.walk(task_folder):
                dirs.sort()
                for name in sorted(names):
                    path = os.path.join(folder, name)
                    relative = os.path.relpath(path, task_folder)
                    if not summaries.path_problem(relative) and os.path.isfile(path) and not os.path.islink(path):
                        yield task_type, task_index, relative, path
