"""Reads the state a tfcluster 0.1 coordinator left (one JSON blob per job) into the records of this one.

0.1 kept each job as a single document in `jobs(id, seq, state, doc)`, its nodes as they are kept now, and
the last job number issued in `counters('job')`. Run once, inside the transaction that creates the
current schema, so an upgraded coordinator finds every job and node it had, and issues no job id twice.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from tfcluster import layout
from tfcluster.daemon.coordinator.job import Failure, Job, Task
from tfcluster.daemon.coordinator.records import dumps, job_doc, spec_from_doc, task_doc
from tfcluster.model import Evaluation, Gpu, TaskExit
from tfcluster.roles.tfconfig import cluster_json
from tfcluster.states import TaskState


def from_version_1(db: sqlite3.Connection) -> None:
    rows = db.execute("SELECT doc FROM jobs").fetchall()
    last = db.execute("SELECT value FROM counters WHERE name = 'job'").fetchone()
    db.execute("ALTER TABLE jobs RENAME TO jobs_v1")
    db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, number INTEGER NOT NULL, request_id TEXT NOT NULL, "
               "doc TEXT NOT NULL)")
    db.execute("CREATE TABLE tasks (job_id TEXT NOT NULL, key TEXT NOT NULL, doc TEXT NOT NULL, "
               "PRIMARY KEY (job_id, key))")
    db.execute("CREATE TABLE evaluations (job_id TEXT NOT NULL, checkpoint TEXT NOT NULL, doc TEXT NOT NULL, "
               "PRIMARY KEY (job_id, checkpoint))")
    for (text,) in rows:
        job = _job(json.loads(text))
        db.execute("INSERT INTO jobs VALUES (?, ?, '', ?)", (job.id, job.number, dumps(job_doc(job))))
        db.executemany("INSERT INTO tasks VALUES (?, ?, ?)", [(job.id, t.key, dumps(task_doc(t))) for t in job.tasks])
        db.executemany("INSERT INTO evaluations VALUES (?, ?, ?)",
                       [(job.id, e.checkpoint, dumps(e.__dict__)) for e in job.evaluations])
    db.execute("DROP TABLE jobs_v1")
    if last is not None:
        db.execute("DELETE FROM counters WHERE name = 'job'")
        db.execute("INSERT INTO counters(name, value) VALUES('next_job_number', ?)", (last[0] + 1,))


def _job(old: dict[str, Any]) -> Job:
    spec = spec_from_doc(old["spec"])
    tasks = [_task(t, spec.checkpoint_dir, old["id"], old.get("node_state_dirs", {}), old.get("node_peers", {}),
                   spec.stop_grace_seconds) for t in old["tasks"]]
    training = [(t.type, t.index, t.address) for t in tasks if t.type != "evaluator" and t.node]
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
    return TaskExit(exit_code=old.get("exit_code"), signal=old.get("signal"), message=old.get("message", ""),
                    log_tail=tuple(old.get("log_tail", ())), busy_port=old.get("busy_port", 0),
                    final_checkpoint=old.get("final_checkpoint", ""))
