"""What `--json` prints and the dashboard's API serves, built from the wire's status messages: the status, a
plan, usage, the queue and the policy as JSON objects. Their fields are a contract: scripts read them.
"""

from __future__ import annotations

import json
from typing import Any

from tfcluster.api.v1 import control_pb2
from tfcluster.conditions import EXCLUDING
from tfcluster.model import exit_words, is_training
from tfcluster.roles.tfconfig import build_tf_configs
from tfcluster.states import NodeState


def gpu_doc(g) -> dict[str, Any]:
    return {"index": g.index, "uuid": g.uuid, "name": g.name, "memory_mib": g.memory_mib}


def node_doc(n: control_pb2.NodeStatus) -> dict[str, Any]:
    drained, d = n.HasField("drain"), n.drain
    return {"name": n.name, "address": n.address, "state": n.state, "gpus": [gpu_doc(g) for g in n.gpus],
            "hostname": n.hostname, "cpu_count": n.cpu_count, "memory_bytes": n.memory_bytes,
            "memory_allocated_bytes": n.memory_allocated_bytes,
            "agent_version": n.agent_version, "last_seen_seconds_ago": round(n.last_seen_seconds_ago, 3),
            "port_range": [n.port_range_start, n.port_range_end], "running_tasks": n.running_tasks,
            "condition": n.condition, "schedulable": n.state == NodeState.READY and not n.condition and not drained,
            "drain": {"reason": d.reason, "by": d.by, "since": d.since, "state": d.state} if drained else None,
            "conditions": [condition_doc(c) for c in n.conditions], "labels": list(n.labels),
            "gpu_driver": n.gpu_driver, "cuda_version": n.cuda_version}


def condition_doc(c) -> dict[str, Any]:
    """One problem the node's agent found on a GPU (gpu null: on the node); excludes: the GPU is left out of
    placement while it holds."""
    gpu = c.gpu if c.HasField("gpu") else None
    return {"gpu": gpu, "kind": c.kind, "message": c.message, "since": c.since,
            "excludes": gpu is not None and c.kind in EXCLUDING}


def evaluation_doc(e) -> dict[str, Any]:
    return {"checkpoint": e.checkpoint, "step": e.step, "metrics": dict(e.metrics), "time": e.time}


def _optional(msg, field: str):
    return getattr(msg, field) if msg.HasField(field) else None


def job_doc(j: control_pb2.JobStatus) -> dict[str, Any]:
    # Every task's TF_CONFIG is the training tasks' cluster plus the task itself: rebuilt here, not sent.
    placed = [(t.type, t.index, t.address) for t in j.tasks if t.address]
    tf_configs = build_tf_configs(placed) if any(is_training(t[0]) for t in placed) else {}
    tasks = [{"type": t.type, "index": t.index, "node": t.node, "address": t.address,
              "gpus": [gpu_doc(g) for g in t.gpus], "state": t.state, "pid": t.pid or None,
              "exit_code": _optional(t, "exit_code"), "signal": _optional(t, "signal"),
              "exit": exit_words(_optional(t, "exit_code"), _optional(t, "signal")), "attempt": t.attempt,
              "message": t.message, "tf_config": t.tf_config or tf_configs.get((t.type, t.index), "")}
             for t in j.tasks]
    f = j.last_failure
    failure = {"task": f.task, "node": f.node, "exit_code": _optional(f, "exit_code"), "signal": _optional(f, "signal"),
               "message": f.message, "log_tail": list(f.log_tail), "time": f.time, "description": f.description}
    return {"id": j.id, "name": j.name, "state": j.state, "strategy": j.strategy, "restarts": j.restarts,
            "message": j.message, "created": j.created, "finished": j.finished or None, "tasks": tasks,
            "evaluation": {"latest": evaluation_doc(j.last_evaluation) if j.HasField("last_evaluation") else None,
                           "history": [evaluation_doc(e) for e in j.evaluations]},
            "last_failure": failure if j.HasField("last_failure") else None,
            "evaluator_restarts": j.evaluator_restarts, "preemptions": j.preemptions, "uid": j.uid or None,
            "owner": j.owner, "priority": j.priority, "queue_position": j.queue_position or None,
            "waiting_since": j.waiting_since or None,
            "usage": {"gpu_seconds": j.gpu_seconds, "cpu_seconds": j.cpu_seconds, "peak_rss_bytes": j.peak_rss_bytes},
            "preempted_by": j.preempted_by or None, "preempted_by_owner": j.preempted_by_owner or None,
            "preempted_at": j.preempted_at or None, "sweep": j.sweep or None,
            "sweep_parameters": dict(j.sweep_parameters) if j.sweep else None,
            "workers": {"min": j.workers.min, "max": j.workers.max, "current": j.workers.current,
                        "resizes": j.workers.resizes} if j.HasField("workers") else None}


def sweep_doc(s: control_pb2.SweepStatus, order: list[int]) -> dict[str, Any]:
    """`tfcluster sweep status --json`: the sweep, and its trials in `order` (trial indexes, best first)."""
    settings = s.sweep
    by_index = {t.index: t for t in s.trials}
    trials = [{"index": t.index, "job": t.job_id or None, "parameters": dict(t.parameters), "state": t.state or None,
               "best": t.best if t.HasField("best") else None, "best_step": t.best_step if t.HasField("best") else None,
               "stopped_early": t.stopped_early, "message": t.message} for t in (by_index[i] for i in order)]
    return {"id": s.id, "name": s.name, "owner": s.owner, "state": s.state, "message": s.message,
            "created": s.created, "finished": s.finished or None,
            "method": settings.method, "metric": settings.metric, "goal": settings.goal,
            "max_concurrent": settings.max_concurrent, "early_stopping": settings.early_stopping or None,
            "parameters": {p.name: list(p.values) for p in settings.parameters}, "trials": trials}


def plan_doc(p: control_pb2.PlanJobResponse) -> dict[str, Any]:
    return {"fits": p.fits, "reason": p.reason, "strategy": p.strategy, "tasks": [
        {"type": t.task_type, "index": t.task_index, "node": t.node, "address": t.address,
         "gpus": [g.index for g in t.gpus], "command": list(t.command), "env_names": list(t.env_names),
         "tf_config": json.loads(t.tf_config)}
        for t in p.tasks]}


def summary_doc(s: control_pb2.ClusterSummary) -> dict[str, Any]:
    return {"nodes_by_state": dict(s.nodes_by_state), "gpus_total": s.gpus_total,
            "gpus_allocated": s.gpus_allocated, "jobs_by_state": dict(s.jobs_by_state), "insecure": s.insecure,
            "leader": s.leader}


def usage_doc(u: control_pb2.GetUsageResponse) -> dict[str, Any]:
    """`tfcluster usage --json`: one object."""
    def totals(t: control_pb2.UsageTotals) -> dict[str, Any]:
        return {"name": t.name, "gpu_seconds": t.gpu_seconds, "cpu_seconds": t.cpu_seconds,
                "peak_rss_bytes": t.peak_rss_bytes, "jobs": t.jobs}

    return {"since": u.since, "until": u.until, "horizon_seconds": u.horizon_seconds,
            "users": [totals(t) for t in u.users], "groups": [totals(t) for t in u.groups]}


def status_doc(nodes, jobs, summary: control_pb2.ClusterSummary | None = None) -> dict[str, Any]:
    doc = {"nodes": [node_doc(n) for n in nodes], "jobs": [job_doc(j) for j in jobs]}
    if summary is not None:
        doc["summary"] = summary_doc(summary)
    return doc


def queue_doc(response: control_pb2.GetQueueResponse, now: float) -> dict[str, Any]:
    return {"total": response.total, "jobs": [
        {"position": q.position, "id": q.id, "name": q.name, "owner": q.owner, "priority": q.priority,
         "rank": q.rank, "tasks": q.tasks, "gpus": q.gpus, "reason": q.reason, "waiting_since": q.waiting_since,
         "waiting_seconds": round(max(0.0, now - q.waiting_since), 3)}
        for q in response.jobs]}


def policy_doc(response: control_pb2.GetPolicyResponse) -> dict[str, Any]:
    return {"source": response.source or None, "loaded_at": response.loaded_at or None, "text": response.text}
