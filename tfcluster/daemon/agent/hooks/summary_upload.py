"""Every task's TensorBoard summaries, sent up to the coordinator as they are written (no shared storage).

Each task has a summary dir (TFCLUSTER_SUMMARY_DIR: its own under the job's dir on this node, the evaluator's
role's own). About every UPLOAD_SECONDS this hook lists it for event files and sends each one's bytes past what
it sent before, as SummaryData messages of at most MAX_CHUNK_BYTES; the coordinator keeps them per job and task
(coordinator/store/summaries.py). Event files only grow, so an (offset, bytes) pair says all; a file that shrank
was replaced and is sent again from its start.

Only what the task itself wrote leaves the node: a regular file of the task's user, reached without following a
link, read through the agent's own descriptor (handback.py), as evaluations and checkpoints are. Files older
than the task's first attempt seen here are another run's (a shared model dir) and stay. A job sends at most
summaries.MAX_JOB_BYTES. After a registration everything is sent again: the coordinator may be a new one, and
bytes it already holds are taken again as they are.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from tfcluster import summaries, wire
from tfcluster.api.v1 import agent_pb2
from tfcluster.daemon.agent.hooks.api import Send, TaskHook
from tfcluster.daemon.agent.tasks import handback
from tfcluster.daemon.logformat import fields
from tfcluster.summaries import SummaryChunk

log = logging.getLogger("tfcluster.agent")

UPLOAD_SECONDS = 1.0  # how often a running task's summary dir is looked at
POLL_BUDGET_BYTES = 4 * 1024 * 1024  # sent per look at one task at most: the rest follows at the next
BACKLOG_MESSAGES = 64  # the stream's queue this long: the next look waits (heartbeats go first)
TaskKey = tuple[str, str, int]


class FileUploads:
    """What has been sent of one task's event files, and what is new."""

    def __init__(self, summary_dir: str, since: float):
        self.summary_dir, self.since = summary_dir, since
        self.sent: dict[str, int] = {}  # path below the summary dir -> bytes sent
        self.looked_at = float("-inf")
        # The task's attempts up to this one have ended and everything they wrote was sent (0: none yet). Its next
        # attempt on this node writes to the same dir, and is read again while it runs.
        self.done_through = 0

    def new_chunks(self, key: TaskKey, owner: int | None, budget: int) -> list[SummaryChunk]:
        chunks: list[SummaryChunk] = []
        for relative, _, name in handback.files_under(self.summary_dir):
            if budget <= 0:
                break
            if summaries.EVENT_FILE_MARK not in name or summaries.path_problem(relative):
                continue
            try:
                chunks += self._read_new(key, relative, owner, budget)
            except OSError:
                continue  # removed meanwhile, a link, or not the task's: nothing of it is sent
            budget -= sum(len(c.data) for c in chunks)
        return chunks

    def _read_new(self, key: TaskKey, relative: str, owner: int | None, budget: int) -> list[SummaryChunk]:
        with os.fdopen(handback.open_below(self.summary_dir, relative, owner), "rb") as f:
            found = os.fstat(f.fileno())
            offset = self.sent.get(relative, 0)
            if relative not in self.sent and found.st_mtime < self.since:
                return []
            if found.st_size < offset:  # replaced by a shorter file: the new one from its start
                offset = 0
            f.seek(offset)
            chunks = []
            while budget > 0:
                data = f.read(min(summaries.MAX_CHUNK_BYTES, budget))
                if not data:
                    break
                chunks.append(SummaryChunk(key[0], key[1], key[2], relative, offset, data))
                offset += len(data)
                budget -= len(data)
            self.sent[relative] = offset
            return chunks


class SummaryUploadHook(TaskHook):
    """Sends each task's new summary bytes; all of them again after each registration."""

    def __init__(self, send: Send, backlog: Callable[[], int], job_limit: int = summaries.MAX_JOB_BYTES):
        self.send, self.backlog, self.job_limit = send, backlog, job_limit
        self.tasks: dict[TaskKey, FileUploads] = {}
        self.job_bytes: dict[str, int] = {}  # job -> bytes sent this session
        self.full: set[str] = set()  # jobs at their limit (told once in the log)
        self.job_tasks: dict[str, int] = {}  # job -> its tasks in self.tasks: a job's bytes go with its last task
        self.lock = threading.Lock()

    def on_register(self) -> None:
        with self.lock:
            self.tasks.clear()
            self.job_bytes.clear()
            self.full.clear()
            self.job_tasks.clear()

    def on_forget(self, record) -> None:
        job = record.attempt.job_id
        with self.lock:
            if self.tasks.pop(record.key, None) is None:
                return
            self.job_tasks[job] -= 1
            if not self.job_tasks[job]:
                del self.job_tasks[job]
                self.job_bytes.pop(job, None)
                self.full.discard(job)

    def on_poll(self, record) -> None:
        self._upload(record, now=False)

    def on_exit(self, record) -> None:
        self._upload(record, now=True)  # what it wrote before it ended goes before its exit is reported

    def finished_with(self, record) -> bool:
        with self.lock:
            uploads = self.tasks.get(record.key)
            return not record.summary_dir or (uploads is not None and uploads.summary_dir == record.summary_dir
                                              and uploads.done_through >= record.attempt.number)

    def _upload(self, record, now: bool) -> None:
        if not record.summary_dir or (not now and self.backlog() > BACKLOG_MESSAGES):
            return
        key, job = record.key, record.attempt.job_id
        with self.lock:
            uploads = self.tasks.get(key)
            if uploads is None or uploads.summary_dir != record.summary_dir:
                if uploads is None:
                    self.job_tasks[job] = self.job_tasks.get(job, 0) + 1
                uploads = self.tasks[key] = FileUploads(record.summary_dir, record.started_at)
            if uploads.done_through >= record.attempt.number or \
                    (not now and time.monotonic() - uploads.looked_at < UPLOAD_SECONDS):
                return
            uploads.looked_at = time.monotonic()
            budget = min(POLL_BUDGET_BYTES, self.job_limit - self.job_bytes.get(job, 0))
            chunks = uploads.new_chunks(key, record.uid, budget) if budget > 0 else []
            sent = sum(len(c.data) for c in chunks)
            # An ended task's files are read to their end, over as many looks as it takes, then left alone.
            if record.exited.is_set() and sent < budget:
                uploads.done_through = max(uploads.done_through, record.attempt.number)
            self.job_bytes[job] = self.job_bytes.get(job, 0) + sent
            if self.job_bytes[job] >= self.job_limit and job not in self.full:
                self.full.add(job)
                log.warning("%s: the job's summaries reached %d bytes; no more are sent", record.name,
                            self.job_limit, extra=fields(job=job))
        for chunk in chunks:
            self.send(agent_pb2.AgentMessage(summary=wire.summary_to_proto(chunk)))
