"""Brings the documents a store holds to this release's shape, in any store, once at start.

Run on the loaded documents before the cluster is built from them; what a step changes is written back through
the store's put/delete contract, with the revisions loaded (a coordinator that another overtook meanwhile is
refused there, like at any write). The steps:
- a state dir's cluster tag is chosen the first time it is opened: it ends every job id, so the ids of two
  state dirs never collide;
- tfcluster 0.1 kept each job as one document (its tasks and evaluations inside) and the last job number
  issued in the counter `job`: each job becomes its job, task and evaluation documents, and the counter the
  next number to issue, so an upgraded coordinator finds every job it had and issues no job id twice.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

from tfcluster import layout
from tfcluster.daemon.coordinator.core.model.job import Failure, Job, Task
from tfcluster.daemon.coordinator.store.documents import (CLUSTER_TAG, NEXT_JOB_NUMBER, dumps, evaluation_key,
                                                            job_doc, spec_from_doc, task_doc, task_key)
from tfcluster.daemon.coordinator.store.api import Delete, Document, Put, Store, Write
from tfcluster.model import Evaluation, Gpu, TaskExit, is_training
from tfcluster.roles.tfconfig import cluster_json
from tfcluster.states import TaskState

Documents = dict[tuple[str, str], Document]


def upgrade(store: Store) -> list[Document]:
    """Every document of the store, in this release's shape; each step's changes are written before the next."""
    documents: Documents = {(d.kind, d.key): d for d in store.load()}
    steps: list[Callable[[Documents], list[Write]]] = [from_version_1, issue_cluster_tag]
    for step in steps:
        writes = step(documents)
        if writes:
            revisions = store.write(writes)
            for w in writes:
                if isinstance(w, Put):
                    documents[(w.kind, w.key)] = Document(w.kind, w.key, w.body, revisions[(w.kind, w.key)])
                else:
                    del documents[(w.kind, w.key)]
    return list(documents.values())


def issue_cluster_tag(documents: Documents) -> list[Write]:
    if ("counter", CLUSTER_TAG) in documents:
        return []
    tag = secrets.randbelow(36 ** 4 - 36 ** 3) + 36 ** 3  # four base-36 digits
    return [Put("counter", CLUSTER_TAG, json.dumps(tag))]


def base36(number: int) -> str:
    """A cluster tag as it ends job ids."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while number:
        number, digit = divmod(number, 36)
        text = digits[digit] + text
    return text


def from_version_1(documents: Documents) -> list[Write]:
    writes: list[Write] = []
    for (kind, key), document in documents.items():
        old = json.loads(document.body) if kind == "job" else None
        if old is None or not any(isinstance(t, dict) for t in old["tasks"]):  # tasks named by key: this release's
            continue
        job = _job(old)
        writes.append(Put("job", job.id, dumps(job_doc(job)), document.revision))
        writes += [Put("task", task_key(job.id, t.key), dumps(task_doc(t))) for t in job.tasks]
        writes += [Put("evaluation", evaluation_key(job.id, e.checkpoint), dumps(e.__dict__)) for e in job.evaluations]
    last = documents.get(("counter", "job"))
    if last is not None:
        writes.append(Delete("counter", "job", last.revision))
        stored = documents.get(("counter", NEXT_JOB_NUMBER))
        writes.append(Put("counter", NEXT_JOB_NUMBER, json.dumps(json.loads(last.body) + 1),
                          stored.revision if stored else 0))
    return writes


def _job(old: dict[str, Any]) -> Job:
    spec = spec_from_doc(old["spec"])
    tasks = [_task(t, spec.checkpoint_dir, old["id"], old.get("node_state_dirs", {}), old.get("node_peers", {}),
                   spec.stop_grace_seconds) for t in old["tasks"]]
    training = [(t.type, t.index, t.address) for t in tasks if is_training(t.type) and t.node]
    failure = old.get("last_failure")
    return Job(
        id=old["id"], spec=spec, number=int(old["id"].rsplit("-", 1)[1]), state=old["state"], tasks=tasks,
        restarts=old["restarts"], preemptions=old.get("preemptions", 0),
        evaluator_restarts=old.get("evaluator_restarts", 0), message=old["message"], created=old["created"],
        finished=old["finished"], outcome=old.get("outcome", ""), restarting=tuple(old.get("restarting", ())),
        not_before=old.get("not_before", 0.0), final_evaluation_until=old.get("final_evaluation_until", 0.0),
        cluster_json=cluster_json(training) if training else "",
        last_failure=Failure(task=failure["task"], node=failure["node"], time=failure["time"],
                             exit=_exit(failure), lost=failure["exit_code"] is None and failure["signal"] is None)
        if failure else None,
        checkpoint_node=old.get("checkpoint_node", ""), syncing=old.get("syncing", 0),
        sync_source=old.get("sync_source", ""), sync_until=old.get("sync_until", 0.0), syncs=old.get("syncs", 0),
        evaluations=[Evaluation(e["checkpoint"], e["step"], e["metrics"], e["time"])
                     for e in old.get("evaluations", [])])


def _task(old: dict[str, Any], shared_dir: str, job_id: str, state_dirs: dict[str, str], peers: dict[str, str],
          grace: float) -> Task:
    node = old["node"]
    ended = TaskState(old["state"]).ended
    local = layout.host_checkpoint_dir(state_dirs[node], job_id) if node in state_dirs else ""
    return Task(type=old["type"], index=old["index"], node=node, host=old["host"], port=old["port"],
                gpus=tuple(Gpu(**g) for g in old["gpus"]), checkpoint_dir=shared_dir or local,
                peer=peers.get(node, ""), state=old["state"], attempt=old["attempt"], pid=old["pid"],
                exit=_exit(old) if ended else None, stop_grace=grace if old.get("stop_requested") else None,
                ready=old.get("ready", False))


def _exit(old: dict[str, Any]) -> TaskExit:
    """0.1 kept a task's exit in the task's own document, at its top level."""
    return TaskExit.from_doc(old)
