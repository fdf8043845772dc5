"""The coordinator's records as store documents, and back: a job, each of its tasks, each evaluation, each node, each
trust record, sweep and usage entry is one document (plain JSON), so a change to a task writes that task alone, and
a job's thousand evaluations are not rewritten with each change. The documents do not depend on any one store
(store/api.py); the writer that turns the change log into writes is records.py.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from tfcluster.daemon.coordinator.core.access.trust import Holder, JoinToken, Removal, Trust
from tfcluster.daemon.coordinator.core.model.accounting import Entry, Usage
from tfcluster.daemon.coordinator.core.model.job import Failure, Job, Task
from tfcluster.daemon.coordinator.core.model.ledger import is_hour_entry
from tfcluster.daemon.coordinator.core.model.node import Drain, Node
from tfcluster.daemon.coordinator.core.model.sweep import Sweep
from tfcluster.daemon.coordinator.store.api import Document
from tfcluster.model import Evaluation, Gpu, NodeInfo, TaskExit
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


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"))


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
    doc["usage"] = plain(job.usage)
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
