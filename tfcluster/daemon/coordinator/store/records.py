"""The writer that turns the change log into store writes, and the state a store's documents make (each record's
document is documents.py). The writer keeps the revision of every document it knows, and writes each with the
revision it expects, so a store can refuse a writer another one overtook.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tfcluster.daemon.coordinator.core.model.changelog import (Change, ChangeLog, EndedJobAmended, JobAdded, JobEnded,
                                                               JobRemoved, JobsNumbered, NodeAdded, NodeRemoved,
                                                               SweepAdded, TokenDropped, TrustAdded, UsageDropped,
                                                               UsageRecorded)
from tfcluster.daemon.coordinator.core.model.job import Job, Record
from tfcluster.daemon.coordinator.core.model.node import Node
from tfcluster.daemon.coordinator.store.api import Delete, Document, Put, Revisions, Write
from tfcluster.daemon.coordinator.store.documents import (NEXT_JOB_NUMBER, dumps, evaluation_key, job_doc, node_doc,
                                                          plain, task_doc, task_key, usage_doc, usage_kind)
from tfcluster.model import WORKER
from tfcluster.spec import JobSpec

@dataclass
class Batch:
    """What one write stores, whole or not at all."""
    writes: dict[tuple[str, str], Write] = field(default_factory=dict)  # one per document: the last one wins
    entries: list[Change] = field(default_factory=list, repr=False)  # the change log's, put back if the write fails
    records: list[Record] = field(default_factory=list, repr=False)  # marked saved; unsaved again if it fails
    next_job_number: int = 0  # the next job number to issue, when jobs were numbered since the last write

    def __bool__(self) -> bool:
        return bool(self.writes)

    def put(self, kind: str, key: str, doc: dict[str, Any] | int, expect: int) -> None:
        self.writes[(kind, key)] = Put(kind, key, dumps(doc), expect)

    def delete(self, kind: str, key: str, expect: int) -> None:
        """The document goes. One never stored (expect 0) has nothing to delete: only a put of it in this batch
        is dropped."""
        if expect:
            self.writes[(kind, key)] = Delete(kind, key, expect)
        else:
            self.writes.pop((kind, key), None)


class Writer:
    """Turns the change log, and the records it says are stored, into the writes of a batch. It reads nothing
    else of the cluster."""

    def __init__(self) -> None:
        self.revisions: Revisions = {}  # (kind, key) -> the revision of each stored document
        self.jobs: dict[str, Job] = {}  # jobs whose documents may change: live, or ended and not written since
        self.nodes: dict[str, Node] = {}
        self.trust: dict[tuple[str, str], Record] = {}  # (kind, key) -> a join token, holder or removal
        self.sweeps: dict[str, Record] = {}
        # (kind, key, record) of the records that became unsaved since the last batch: each tracks itself (job.py's
        # Record), so a batch looks at what changed, not at every record: a registration storm of thousands of nodes,
        # a queue of thousands of jobs. A job and its tasks are listed as ("job", the job's id, the record).
        self.changed: list[tuple[str, str, Record]] = []
        self.evaluations: dict[str, dict[str, float]] = {}  # job id -> checkpoint -> time of the stored one
        # job id -> its spec and the spec's document: a spec never changes, and converting it again on each of
        # its job's writes was a tenth of the coordinator's work per job
        self.spec_docs: dict[str, tuple[JobSpec, dict[str, Any]]] = {}
        self.next_job_number = 0

    def loaded(self, documents: list[Document], log: ChangeLog) -> None:
        """The model was just built from these documents (its log says what it holds): everything is stored."""
        self.revisions = {(d.kind, d.key): d.revision for d in documents}
        for change in log.drain():
            self._follow(change, Batch())
        for job in self.jobs.values():
            job.saved()
            for task in job.tasks:
                task.saved()
            self.evaluations[job.id] = {e.checkpoint: e.time for e in job.evaluations}
        for record in [*self.nodes.values(), *self.trust.values(), *self.sweeps.values()]:
            record.saved()
        self.changed.clear()
        stored = [d.body for d in documents if (d.kind, d.key) == ("counter", NEXT_JOB_NUMBER)]
        self.next_job_number = json.loads(stored[0]) if stored else 0

    def collect(self, log: ChangeLog) -> Batch:
        batch = Batch(entries=log.drain())
        ended = [self._follow(change, batch) for change in batch.entries]
        changed = self.changed[:]
        self.changed.clear()  # in place: the tracked records hold this list
        jobs_seen: set[str] = set()
        for kind, key, record in changed:
            if kind == "job":  # the job or one of its tasks changed: the job's unsaved records are written
                job = self.jobs.get(key)
                if job is not None and key not in jobs_seen:
                    jobs_seen.add(key)
                    self._job(job, batch)
            # Still unsaved (it is listed once each time it becomes so), and still the one stored under that key.
            elif record.unsaved and self._tracked(kind, key) is record:
                self._put(batch, record, kind, key, node_doc(record) if kind == "node" else plain(record))
        for job in ended:
            if job is not None:  # written now: it changes no more
                self.jobs.pop(job.id, None)
                self.spec_docs.pop(job.id, None)
        if batch.next_job_number > self.next_job_number:
            batch.put("counter", NEXT_JOB_NUMBER, batch.next_job_number, self._revision("counter", NEXT_JOB_NUMBER))
            self.next_job_number = batch.next_job_number
        return batch

    def _follow(self, change: Change, batch: Batch) -> Job | None:
        """Follows one entry of the change log; the job when it ended."""
        if isinstance(change, (JobAdded, JobEnded, EndedJobAmended)):
            self.jobs[change.job.id] = change.job
            self._track(change.job)
            return None if isinstance(change, JobAdded) else change.job
        if isinstance(change, JobRemoved):
            self._remove(change.job, batch)
        elif isinstance(change, NodeAdded):
            self.nodes[change.node.name] = change.node
            change.node.track(self.changed, "node", change.node.name)
        elif isinstance(change, NodeRemoved):
            self.nodes.pop(change.name, None)
            batch.delete("node", change.name, self._revision("node", change.name))
        elif isinstance(change, SweepAdded):
            self.sweeps[change.sweep.id] = change.sweep
            change.sweep.track(self.changed, "sweep", change.sweep.id)
        elif isinstance(change, TrustAdded):
            self.trust[(change.kind, change.key)] = change.record
            change.record.track(self.changed, change.kind, change.key)
        elif isinstance(change, TokenDropped):
            self.trust.pop(("token", change.token_id), None)
            batch.delete("token", change.token_id, self._revision("token", change.token_id))
        elif isinstance(change, JobsNumbered):
            batch.next_job_number = max(batch.next_job_number, change.next_number)
        elif isinstance(change, UsageRecorded):
            kind, doc = usage_doc(change.entry)
            batch.put(kind, change.entry.job_id, doc, self._revision(kind, change.entry.job_id))
        elif isinstance(change, UsageDropped):
            kind = usage_kind(change.job_id)
            batch.delete(kind, change.job_id, self._revision(kind, change.job_id))
        return None

    def _remove(self, job: Job, batch: Batch) -> None:
        self.jobs.pop(job.id, None)
        self.spec_docs.pop(job.id, None)
        batch.delete("job", job.id, self._revision("job", job.id))
        for key in [task_key(job.id, task.key) for task in job.tasks] + self._dropped_workers(job):
            batch.delete("task", key, self._revision("task", key))
        for checkpoint in self.evaluations.pop(job.id, {}):
            key = evaluation_key(job.id, checkpoint)
            batch.delete("evaluation", key, self._revision("evaluation", key))

    def _job(self, job: Job, batch: Batch) -> None:
        job_changed = job.unsaved  # a resize gives the job tasks anew, which marks it unsaved
        if job_changed:
            self._put(batch, job, "job", job.id, job_doc(job, self._spec_doc(job)))
            self._evaluations(job, batch)
            for key in self._dropped_workers(job):
                batch.delete("task", key, self._revision("task", key))
        for task in job.tasks:
            if task.unsaved:
                self._put(batch, task, "task", task_key(job.id, task.key), task_doc(task))
        if job_changed:
            self._track(job)  # the tasks a resize added, written now, tell of their next change

    def _track(self, job: Job) -> None:
        """The job and its tasks tell this writer when they change; a record unsaved now is listed at once."""
        for record in (job, *job.tasks):
            if not record.tracked_into(self.changed):
                record.track(self.changed, "job", job.id)

    def _dropped_workers(self, job: Job) -> list[str]:
        """The stored tasks of workers an elastic job no longer has (it shrank: core/model/elastic.py)."""
        role = job.spec.role(WORKER)
        keys = (task_key(job.id, f"{WORKER}:{i}") for i in range(role.count, role.max_count))
        return [key for key in keys if ("task", key) in self.revisions]

    def _evaluations(self, job: Job, batch: Batch) -> None:
        stored = self.evaluations.setdefault(job.id, {})
        current = {e.checkpoint: e for e in job.evaluations}
        for checkpoint in [c for c in stored if c not in current]:
            key = evaluation_key(job.id, checkpoint)
            batch.delete("evaluation", key, self._revision("evaluation", key))
            del stored[checkpoint]
        for e in job.evaluations:
            if stored.get(e.checkpoint) != e.time:
                key = evaluation_key(job.id, e.checkpoint)
                batch.put("evaluation", key, plain(e), self._revision("evaluation", key))
                stored[e.checkpoint] = e.time

    def _spec_doc(self, job: Job) -> dict[str, Any]:
        cached = self.spec_docs.get(job.id)
        if cached is None or cached[0] is not job.spec:
            cached = self.spec_docs[job.id] = (job.spec, plain(job.spec))
        return cached[1]

    def _put(self, batch: Batch, record: Record, kind: str, key: str, doc: dict[str, Any]) -> None:
        batch.put(kind, key, doc, self._revision(kind, key))
        batch.records.append(record)
        record.saved()

    def _tracked(self, kind: str, key: str) -> Record | None:
        """The node, sweep or trust record the writer follows under that kind and key."""
        if kind == "node":
            return self.nodes.get(key)
        return self.sweeps.get(key) if kind == "sweep" else self.trust.get((kind, key))

    def _revision(self, kind: str, key: str) -> int:
        return self.revisions.get((kind, key), 0)

    def written(self, batch: Batch, revisions: Revisions) -> None:
        """The store wrote the batch: its documents have these revisions now."""
        for key, w in batch.writes.items():
            if isinstance(w, Put):
                self.revisions[key] = revisions[key]
            else:
                self.revisions.pop(key, None)

    def failed(self, batch: Batch, log: ChangeLog) -> None:
        """The write did not happen: the next one stores all of it again."""
        for record in batch.records:
            record.mark_unsaved()
        for (kind, key), w in batch.writes.items():
            if kind == "evaluation":
                job_id, _, checkpoint = key.partition("/")
                if isinstance(w, Put):  # not stored: written again next time
                    self.evaluations.get(job_id, {}).pop(checkpoint, None)
                else:  # still stored: to be dropped next time
                    self.evaluations.setdefault(job_id, {})[checkpoint] = float("nan")
        log.put_back(batch.entries)
        self.next_job_number = 0  # the entries put back say again which number to store
