"""`tfcluster tensorboard`: a TensorBoard on the operator's machine over jobs' summaries, kept up to date.

The coordinator keeps each job's event files as its agents send them (coordinator/store/summaries.py). A
SummaryMirror copies them into a logdir of the caller's, `<logdir>/<JOB>/<type>:<index>/<path>`, so TensorBoard
names each task's run `JOB/TASK`; each sync asks only for the bytes past what it holds (ReadSummaries). The
coordinator decides what the caller may read, as for logs: a user their own jobs, admins and viewers all.
TensorBoard itself (the `tensorboard` package, in the `tf` extra) runs in this process on the loopback address.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tfcluster import summaries

if TYPE_CHECKING:
    from tfcluster.cluster import Job

RELOAD_SECONDS = 1  # how often TensorBoard reads the logdir again
SYNC_SECONDS = 1.0  # how often the logdir is brought up to date


class SummaryMirror:
    """A TensorBoard logdir holding the given jobs' summaries, brought up to date by sync()."""

    def __init__(self, jobs: list[Job], logdir: Path | None = None):
        self.jobs = jobs
        self.owned = logdir is None  # a logdir of its own is removed by close()
        self.logdir = Path(logdir) if logdir is not None else Path(tempfile.mkdtemp(prefix="tfcluster-tensorboard-"))
        os.chmod(self.logdir, 0o700)  # what the coordinator let this user read stays theirs
        self.have: dict[str, dict[str, int]] = {job.id: {} for job in jobs}  # job -> SummaryChunk.key -> size

    def sync(self) -> int:
        """Copies what is new of every job's summaries; returns the bytes written. ClusterError from the first
        job the coordinator refuses."""
        written = 0
        for job in self.jobs:
            have = self.have[job.id]
            while True:
                got = 0
                for chunk in job.summaries(have):
                    self._write(job.id, chunk)
                    have[chunk.key] = chunk.offset + len(chunk.data)
                    got += len(chunk.data)
                written += got
                if not got:  # one call sends a bounded amount: again until nothing is left
                    break
        return written

    def _write(self, job_id: str, chunk: summaries.SummaryChunk) -> None:
        path = self.logdir / job_id / chunk.task / chunk.path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.pwrite(fd, chunk.data, chunk.offset)
        finally:
            os.close(fd)

    def close(self) -> None:
        if self.owned:
            shutil.rmtree(self.logdir, ignore_errors=True)


def start_tensorboard(logdir: Path, port: int = 0) -> str:
    """Serves TensorBoard over logdir on the loopback address from a thread of this process; returns its URL.
    ImportError when the tensorboard package is not installed."""
    from tensorboard import program

    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port),
                          "--reload_interval", str(RELOAD_SECONDS), "--load_fast", "false"])
    return board.launch()
