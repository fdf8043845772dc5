"""The coordinator's records as stored documents, and the collection of what changed since the last write.

A job, each of its tasks, each evaluation and each node is one document (plain JSON-able data), so a
change to a task writes that task alone, and a job's thousand evaluations are not rewritten with each
change. The documents do not depend on SQLite: another store (a replicated one) keeps the same ones.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from tfcluster.daemon.coordinator.cluster import Cluster
from tfcluster.daemon.coordinator.job import Failure, Job, Task
from tfcluster.daemon.coordinator.node import Node
from tfcluster.daemon.coordinator.trust import Holder, JoinToken, Removal, Trust
from tfcluster.model import Evaluation, Gpu, NodeInfo, TaskExit
from tfcluster.spec import JobSpec, RestartPolicy, RoleSpec


@dataclass
class Batch:
    """What one write stores, in one transaction."""
    jobs: list[tuple[str, int, str, str]] = field(default_factory=list)   # id, number, request id, document
    tasks: list[tuple[str, str, str]] = field(default_factory=list)       # job id, task key, document
    evaluations: list[tuple[str, str, str]] = field(default_factory=list)  # job id, checkpoint, document
    dropped_evaluations: list[tuple[str, str]] = field(default_factory=list)  # job id, checkpoint
    nodes: list[tuple[str, str]] = field(default_factory=list)            # name, document
    removed_jobs: list[str] = field(default_factory=list)
    removed_nodes: list[str] = field(default_factory=list)
    trust: list[tuple[str, str, str]] = field(default_factory=list)       # kind (token, removal), key, document
    dropped_trust: list[tuple[str, str]] = field(default_factory=list)    # kind, key
    next_job_number: int = 0
    records: list = field(default_factory=list, repr=False)  # what to mark unsaved again if the write fails
    ended: list = field(default_factory=list, repr=False)    # jobs that ended since the last write

    def __bool__(self) -> bool:
        return bool(self.jobs or self.tasks or self.evaluations or self.dropped_evaluations or self.nodes or
                    self.removed_jobs or self.removed_nodes or self.trust or self.dropped_trust or
                    self.next_job_number)


@dataclass
class Loaded:
    """Everything a store holds, as documents."""
    jobs: list[tuple[str, list[str], list[str]]]  # job document, its task documents, its evaluation documents
    nodes: list[str]
    next_job_number: int
    trust: list[tuple[str, str]] = field(default_factory=list)  # kind, document
    cluster_tag: int = 0  # chosen once for a state dir: job ids of another one never collide with these


class Changes:
    """Collects the unsaved records of a cluster into a Batch, remembering what each write stored."""

    def __init__(self) -> None:
        self.evaluations: dict[str, dict[str, float]] = {}  # job id -> checkpoint -> time of the stored one
        self.next_job_number = 0

    def collect(self, cluster: Cluster, trust: Trust | None = None) -> Batch:
        batch = Batch()
        if trust is not None:
            self._trust(trust, batch)
        # An ended job changes no more once its end is written: only live ones and those that just ended are looked at.
        batch.ended, cluster.just_ended = cluster.just_ended, []
        for job in [*cluster.jobs.live.values(), *batch.ended]:
            if job.unsaved:
                batch.jobs.append((job.id, job.number, job.request_id, dumps(job_doc(job))))
                self._evaluations(job, batch)
                batch.records.append(job)
                job.saved()
            for task in job.tasks:
                if task.unsaved:
                    batch.tasks.append((job.id, task.key, dumps(task_doc(task))))
                    batch.records.append(task)
                    task.saved()
        for node in cluster.nodes.values():
            if node.unsaved:
                batch.nodes.append((node.name, dumps(node_doc(node))))
                batch.records.append(node)
                node.saved()
        batch.removed_jobs, cluster.removed = cluster.removed, []
        batch.removed_nodes, cluster.removed_nodes = cluster.removed_nodes, []
        for job_id in batch.removed_jobs:
            self.evaluations.pop(job_id, None)
        if cluster.jobs.next_number != self.next_job_number:
            batch.next_job_number = self.next_job_number = cluster.jobs.next_number
        return batch

    @staticmethod
    def _trust(trust: Trust, batch: Batch) -> None:
        for kind, records in (("token", trust.tokens), ("removal", trust.removals), ("holder", trust.holders)):
            for key, record in records.items():
                if record.unsaved:
                    batch.trust.append((kind, key, dumps(dataclasses.asdict(record))))
                    batch.records.append(record)
                    record.saved()
        batch.dropped_trust = [("token", t) for t in trust.dropped_tokens]
        trust.dropped_tokens = []

    def _evaluations(self, job: Job, batch: Batch) -> None:
        stored = self.evaluations.setdefault(job.id, {})
        current = {e.checkpoint: e for e in job.evaluations}
        for checkpoint in [c for c in stored if c not in current]:
            batch.dropped_evaluations.append((job.id, checkpoint))
            del stored[checkpoint]
        for e in job.evaluations:
            if stored.get(e.checkpoint) != e.time:
                batch.evaluations.append((job.id, e.checkpoint, dumps(dataclasses.asdict(e))))
                stored[e.checkpoint] = e.time

    def failed(self, batch: Batch, cluster: Cluster) -> None:
        """The write did not happen: the next one stores all of it again."""
        for record in batch.records:
            object.__setattr__(record, "unsaved", True)
        for job_id, checkpoint, _ in batch.evaluations:
            self.evaluations.get(job_id, {}).pop(checkpoint, None)
        for job_id, checkpoint in batch.dropped_evaluations:  # still stored: to be dropped next time
            self.evaluations.setdefault(job_id, {})[checkpoint] = float("nan")
        cluster.removed[:0] = batch.removed_jobs
        cluster.removed_nodes[:0] = batch.removed_nodes
        cluster.just_ended[:0] = batch.ended
        if batch.next_job_number:
            self.next_job_number = 0

    def loaded(self, cluster: Cluster, trust: Trust | None = None) -> None:
        """The cluster was just read from the store: everything in it is stored."""
        for job in cluster.jobs.values():
            job.saved()
            for task in job.tasks:
                task.saved()
            self.evaluations[job.id] = {e.checkpoint: e.time for e in job.evaluations}
        for node in cluster.nodes.values():
            node.saved()
        for record in [*trust.tokens.values(), *trust.removals.values(), *trust.holders.values()] if trust else []:
            record.saved()
        self.next_job_number = cluster.jobs.next_number


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"))


# ---- documents ----------------------------------------------------------------------------------

def job_doc(job: Job) -> dict[str, Any]:
    doc = {f.name: getattr(job, f.name) for f in dataclasses.fields(job) if f.name not in ("tasks", "evaluations",
                                                                                           "seen", "spec")}
    doc["spec"] = dataclasses.asdict(job.spec)
    doc["last_failure"] = dataclasses.asdict(job.last_failure) if job.last_failure else None
    doc["tasks"] = [t.key for t in job.tasks]
    return doc


def task_doc(task: Task) -> dict[str, Any]:
    doc = {f.name: getattr(task, f.name) for f in dataclasses.fields(task) if f.name != "seen"}
    doc["gpus"] = [dataclasses.asdict(g) for g in task.gpus]
    doc["exit"] = dataclasses.asdict(task.exit) if task.exit else None
    return doc


def node_doc(node: Node) -> dict[str, Any]:
    return {"info": dataclasses.asdict(node.info), "state": node.state}


def job_from_docs(job_text: str, task_texts: list[str], evaluation_texts: list[str]) -> Job:
    doc = json.loads(job_text)
    tasks = {t.key: t for t in (_task(json.loads(text)) for text in task_texts)}
    order = doc.pop("tasks")
    failure = doc.pop("last_failure")
    evaluations = sorted((Evaluation(**json.loads(text)) for text in evaluation_texts), key=lambda e: e.time)
    return Job(**{**doc, "spec": spec_from_doc(doc["spec"]), "restarting": tuple(doc["restarting"]),
                  "tasks": [tasks[key] for key in order], "evaluations": evaluations,
                  "last_failure": Failure(**{**failure, "exit": _exit(failure["exit"])}) if failure else None})


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


def node_from_doc(text: str) -> Node:
    doc = json.loads(text)
    info = doc["info"]
    return Node(info=NodeInfo(**{**info, "port_range": tuple(info["port_range"]),
                                 "gpus": tuple(Gpu(**g) for g in info["gpus"])}), state=doc["state"])


def _task(doc: dict[str, Any]) -> Task:
    return Task(**{**doc, "gpus": tuple(Gpu(**g) for g in doc["gpus"]), "exit": _exit(doc["exit"])})


def _exit(doc: dict[str, Any] | None) -> TaskExit | None:
    return TaskExit(**{**doc, "log_tail": tuple(doc["log_tail"])}) if doc else None


def spec_from_doc(doc: dict[str, Any]) -> JobSpec:
    roles = {k: RoleSpec(**{**v, "command": tuple(v["command"]), "nodes": tuple(v["nodes"])})
             for k, v in doc["roles"].items()}
    restart = RestartPolicy(**{**doc["restart"], "permanent_exit_codes": tuple(doc["restart"]["permanent_exit_codes"])})
    return JobSpec(**{**doc, "command": tuple(doc["command"]), "roles": roles, "restart": restart})
