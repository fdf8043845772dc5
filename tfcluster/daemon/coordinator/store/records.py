"""The coordinator's records as store documents, and the writer that turns the change log into store writes.

A job, each of its tasks, each evaluation, each node and each trust record is one document (plain JSON), so a
change to a task writes that task alone, and a job's thousand evaluations are not rewritten with each change.
The documents do not depend on any one store (store/api.py). The writer keeps the revision of every document it
knows, and writes each with the revision it expects, so a store can refuse a writer another one overtook.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from tfcluster.daemon.coordinator.core.model.accounting import Entry, Usage
from tfcluster.daemon.coordinator.core.model.changelog import (Change, ChangeLog, EndedJobAmended, JobAdded, JobEnded,
                                                               JobRemoved, JobsNumbered, NodeAdded, NodeRemoved,
                                                               SweepAdded, TokenDropped, TrustAdded, UsageDropped,
                                                               UsageRecorded)
from tfcluster.daemon.coordinator.core.access.trust import Holder, JoinToken, Removal, Trust
from tfcluster.daemon.coordinator.core.model.job import Failure, Job, Record, Task
from tfcluster.daemon.coordinator.core.model.ledger import is_hour_entry
from tfcluster.daemon.coordinator.core.model.node import Drain, Node
from tfcluster.daemon.coordinator.core.model.sweep import Sweep
from tfcluster.daemon.coordinator.store.api import Delete, Document, Put, Revisions, Write
from tfcluster.model import WORKER, Evaluation, Gpu, NodeInfo, TaskExit
from tfcluster.spec import EnvironmentSpec, JobSpec, RestartPolicy, RoleSpec
from tfcluster.sweepspec import SweepSpec

NEXT_JOB_NUMBER = "next_job_number"  # counters
CLUSTER_TAG = "cluster_tag"


def task_key(job_id: str, key: str) -> str:
    return f"{job_id}/{key}"  # job ids hold no slash (spec.NAME_RE and numbers)


def evaluation_key(job_id: str, checkpoint: str) -> str:
    return f"{job_id}/{checkpoint}"


@dataclass
class State:
    """Everything a store holds, as records."""
    jobs: list[Job]  # oldest first
    nodes: list[Node]
    trust: Trust
    next_job_number: int = 1
    cluster_tag: int = 0  # chosen once for a state dir (migrate.py)
    usage: list[Entry] = field(default_factory=list)  # the usage ledger (ledger.py)
    sweeps: list[Sweep] = field(default_factory=list)  # oldest first


def from_documents(documents: list[Document]) -> State:
    by_kind: dict[str, list[Document]] = {}
    for d in documents:
        by_kind.setdefault(d.kind, []).append(d)
    parts: dict[str, tuple[list[str], list[str]]] = {}  # job id -> its tasks' documents, its evaluations'
    for index, kind in ((0, "task"), (1, "evaluation")):
        for d in by_kind.get(kind, []):
            parts.setdefault(d.key.partition("/")[0], ([], []))[index].append(d.body)
    jobs = [job_from_docs(d.body, *parts.get(d.key, ([], []))) for d in by_kind.get("job", [])]
    counters = {d.key: json.loads(d.body) for d in by_kind.get("counter", [])}
    return State(jobs=sorted(jobs, key=lambda j: j.number),
                 nodes=sorted((node_from_doc(d.body) for d in by_kind.get("node", [])), key=lambda n: n.name),
                 trust=trust_from_docs([(d.kind, d.body) for k in ("token", "removal", "holder")
                                        for d in by_kind.get(k, [])]),
                 next_job_number=counters.get(NEXT_JOB_NUMBER, 1), cluster_tag=counters.get(CLUSTER_TAG, 0),
                 usage=[usage_from_doc(d.body) for k in ("usage", "usage_hour") for d in by_kind.get(k, [])],
                 sweeps=sorted((sweep_from_doc(d.body) for d in by_kind.get("sweep", [])), key=lambda s: s.number))


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


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"))


# ---- documents ----------------------------------------------------------------------------------

def plain(value: Any) -> Any:
    """value as JSON-ready data, as dataclasses.asdict makes it of a record, without the deep copy of every
    string and number in it that asdict makes (containers are new: nothing mutable is shared with the record)."""
    kind = type(value)
    names = _FIELD_NAMES.get(kind) or (_field_names(kind) if dataclasses.is_dataclass(kind) else None)
    if names is not None:
        return {name: plain(getattr(value, name)) for name in names}
    if kind is list or kind is tuple:
        return kind(plain(item) for item in value)
    if kind is dict:
        return {plain(k): plain(v) for k, v in value.items()}
    return value


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(kind: type) -> tuple[str, ...]:
    """A record type's field names, looked up once (dataclasses.fields builds them anew on each call)."""
    names = _FIELD_NAMES.get(kind)
    if names is None:
        names = _FIELD_NAMES[kind] = tuple(f.name for f in dataclasses.fields(kind))
    return names


def job_doc(job: Job, spec_doc: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job's document; spec_doc: its spec's, when the caller has it already."""
    doc = {name: getattr(job, name) for name in _field_names(Job) if name not in ("tasks", "evaluations", "seen",
                                                                                    "spec")}
    doc["spec"] = plain(job.spec) if spec_doc is None else spec_doc
    doc["last_failure"] = plain(job.last_failure) if job.last_failure else None
    doc["tasks"] = [t.key for t in job.tasks]
    doc["usage"] = dataclasses.asdict(job.usage)
    return doc


def task_doc(task: Task) -> dict[str, Any]:
    doc = {name: getattr(task, name) for name in _field_names(Task) if name != "seen"}
    doc["gpus"] = [plain(g) for g in task.gpus]
    doc["exit"] = plain(task.exit) if task.exit else None
    return doc


def node_doc(node: Node) -> dict[str, Any]:
    return {"info": plain(node.info), "state": node.state, "drain": plain(node.drain) if node.drain else None,
            "lost_since": node.lost_since}


def job_from_docs(job_text: str, task_texts: list[str], evaluation_texts: list[str]) -> Job:
    doc = json.loads(job_text)
    tasks = {t.key: t for t in (_task(json.loads(text)) for text in task_texts)}
    order = doc.pop("tasks")
    failure = doc.pop("last_failure")
    evaluations = sorted((Evaluation(**json.loads(text)) for text in evaluation_texts), key=lambda e: e.time)
    return Job(**{**doc, "spec": spec_from_doc(doc["spec"]), "restarting": tuple(doc["restarting"]),
                  "groups": tuple(doc.get("groups", ())), "usage": Usage(**doc.get("usage", {})),
                  "tasks": [tasks[key] for key in order], "evaluations": evaluations,
                  "last_failure": Failure(**{**failure, "exit": _exit(failure["exit"])}) if failure else None})


def sweep_from_doc(text: str) -> Sweep:
    doc = json.loads(text)
    sweep = doc["sweep"]
    return Sweep(**{**doc, "spec": spec_from_doc(doc["spec"]), "parameters": tuple(doc["parameters"]),
                    "groups": tuple(doc["groups"]), "jobs": tuple(doc["jobs"]),
                    "stopped_early": tuple(doc["stopped_early"]),
                    "sweep": SweepSpec(**{**sweep, "parameters": {k: tuple(v) for k, v in sweep["parameters"].items()}})})


def trust_from_docs(docs: list[tuple[str, str]]) -> Trust:
    trust = Trust()
    for kind, text in docs:
        doc = json.loads(text)
        if kind == "token":
            trust.tokens[doc["id"]] = JoinToken(**doc)
        elif kind == "holder":
            trust.holders[doc["node"]] = Holder(**doc)
        else:
            trust.removals[doc["node"]] = Removal(**doc)
    return trust


def usage_kind(key: str) -> str:
    """Where a ledger entry is kept: a job's under "usage", an hour's (ledger.py folds short jobs) under
    "usage_hour", which a release from before folding does not read (it sees less usage, and never misreads)."""
    return "usage_hour" if is_hour_entry(key) else "usage"


def usage_doc(entry: Entry) -> tuple[str, dict[str, Any]]:
    """The entry's kind and document; a job's entry has no `jobs` (always 1), as a release before it wrote it."""
    doc = dataclasses.asdict(entry)
    if not is_hour_entry(entry.job_id):
        del doc["jobs"]
    return usage_kind(entry.job_id), doc


def usage_from_doc(text: str) -> Entry:
    doc = json.loads(text)
    return Entry(**{**doc, "groups": tuple(doc["groups"])})


def node_from_doc(text: str) -> Node:
    doc = json.loads(text)
    info = doc["info"]
    return Node(info=NodeInfo(**{**info, "port_range": tuple(info["port_range"]),
                                 "gpus": tuple(Gpu(**g) for g in info["gpus"]),
                                 "labels": tuple(info.get("labels", ()))}),  # none in a node stored before labels
                state=doc["state"],
                drain=Drain(**doc["drain"]) if doc.get("drain") else None,  # none before 0.9
                lost_since=doc.get("lost_since", 0.0))  # none from earlier releases: counted from loading


def _task(doc: dict[str, Any]) -> Task:
    return Task(**{**doc, "gpus": tuple(Gpu(**g) for g in doc["gpus"]), "exit": _exit(doc["exit"])})


def _exit(doc: dict[str, Any] | None) -> TaskExit | None:
    return TaskExit.from_doc(doc) if doc else None


def spec_from_doc(doc: dict[str, Any]) -> JobSpec:
    roles = {k: RoleSpec(**{**v, "command": tuple(v["command"]), "nodes": tuple(v["nodes"]),
                            "labels": tuple(v.get("labels", ()))})  # none in a job stored before labels
             for k, v in doc["roles"].items()}
    restart = RestartPolicy(**{**doc["restart"], "permanent_exit_codes": tuple(doc["restart"]["permanent_exit_codes"])})
    environment = EnvironmentSpec(**doc.get("environment", {}))  # none in a job stored before code travelled
    return JobSpec(**{**doc, "command": tuple(doc["command"]), "roles": roles, "restart": restart,
                      "environment": environment})
