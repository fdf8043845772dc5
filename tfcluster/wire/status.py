"""The coordinator's records as the control API's answers: nodes, jobs, sweeps, plans, usage, the queue, the
policy, the doctor's checks."""

from __future__ import annotations

from typing import Any

from tfcluster.api.v1 import control_pb2
from tfcluster.model import WORKER, TaskExit
from tfcluster.states import JobState
from tfcluster.wire.nodes import conditions_to_proto, gpu_to_proto

# ---- status: the coordinator's records as messages ----------------------------------------------
# (Job, Task and Node are the coordinator's records, read by attribute: the agent, which imports this
# module too, imports nothing of the coordinator.)

def node_status(node, running_tasks: int, now: float, memory_allocated: int = 0,
                drain_state: str = "") -> control_pb2.NodeStatus:
    """drain_state: DRAINING or DRAINED while the node is drained (Nodes.drain_state)."""
    i = node.info
    status = control_pb2.NodeStatus(
        name=i.name, address=i.address, state=node.state.value, gpus=[gpu_to_proto(g) for g in i.gpus],
        hostname=i.hostname, cpu_count=i.cpu_count, memory_bytes=i.memory_bytes, agent_version=i.agent_version,
        last_seen_seconds_ago=max(0.0, now - node.seen.last_seen), port_range_start=i.port_range[0],
        port_range_end=i.port_range[1], running_tasks=running_tasks, condition=node.condition,
        memory_allocated_bytes=memory_allocated, conditions=conditions_to_proto(node.seen.conditions),
        labels=i.labels, gpu_driver=i.gpu_driver, cuda_version=i.cuda_version)
    if node.drain is not None:
        d = node.drain
        status.drain.CopyFrom(control_pb2.NodeDrain(reason=d.reason, by=d.by, since=d.since, state=drain_state))
    return status


def _exit_fields(target, exit: TaskExit | None) -> None:
    if exit is not None and exit.exit_code is not None:
        target.exit_code = exit.exit_code
    if exit is not None and exit.signal is not None:
        target.signal = exit.signal


def job_status(job, usage=None, queue_position: int = 0) -> control_pb2.JobStatus:
    """A coordinator's job as its status; usage: what it used up to now (accounting.job_usage), else what its
    ended attempts used; queue_position: its place in the queue while PENDING (0: not known here)."""
    message = job.message
    f = job.last_failure
    if f is not None and f.describe() not in message:
        message = f"{message}; last failure: {f.describe()}" if message else f"last failure: {f.describe()}"
    status = control_pb2.JobStatus(id=job.id, name=job.spec.name, state=job.state.value, strategy=job.strategy,
                                   restarts=job.restarts, message=message, created=job.created,
                                   finished=job.finished, evaluator_restarts=job.evaluator_restarts,
                                   preemptions=job.preemptions, uid=job.uid, owner=job.owner,
                                   priority=job.priority, queue_position=queue_position, rank=job.rank,
                                   waiting_since=max(job.created, job.not_before) if job.state == JobState.PENDING
                                   else 0, preempted_by=job.preempted_by,
                                   preempted_by_owner=job.preempted_by_owner, preempted_at=job.preempted_at,
                                   sweep=job.sweep, sweep_parameters=job.sweep_parameters)
    role = job.spec.role(WORKER)
    if role.elastic:
        status.workers.CopyFrom(control_pb2.WorkerRange(min=role.min_count, max=role.max_count, current=role.count,
                                                        resizes=job.resizes))
    usage = usage or job.usage
    status.gpu_seconds, status.cpu_seconds = usage.gpu_seconds, usage.cpu_seconds
    status.peak_rss_bytes = usage.peak_rss_bytes
    for t in job.tasks:
        task = status.tasks.add(type=t.type, index=t.index, node=t.node, address=t.address,
                                gpus=[gpu_to_proto(g) for g in t.gpus], state=t.state.value, pid=t.pid,
                                attempt=t.attempt, message=t.message)
        _exit_fields(task, t.exit)
    for e in job.evaluations:
        status.evaluations.add(checkpoint=e.checkpoint, step=e.step, metrics=e.metrics, time=e.time)
    if job.evaluations:
        status.last_evaluation.CopyFrom(status.evaluations[-1])
    if f is not None:
        status.last_failure.CopyFrom(control_pb2.Failure(task=f.task, node=f.node, message=f.exit.message,
                                                         log_tail=f.exit.log_tail, time=f.time,
                                                         description=f.describe()))
        _exit_fields(status.last_failure, f.exit)
    return status


def plan_response(plan, commands: dict[tuple[str, int], tuple[str, ...]]) -> control_pb2.PlanJobResponse:
    response = control_pb2.PlanJobResponse(fits=plan.placement is not None, reason=plan.reason,
                                           strategy=plan.strategy)
    for p in plan.placement or []:
        response.tasks.add(task_type=p.type, task_index=p.index, node=p.node, address=p.address,
                           gpus=[gpu_to_proto(g) for g in p.gpus], tf_config=plan.tf_configs[(p.type, p.index)],
                           command=commands[(p.type, p.index)], env_names=sorted(plan.spec.env_for(p.type)))
    return response


def usage_response(users: dict[str, Any], groups: dict[str, Any], since: float, until: float,
                   horizon_seconds: float) -> control_pb2.GetUsageResponse:
    """accounting.Totals per user and per group as the reply of GetUsage, most GPU-seconds first."""
    response = control_pb2.GetUsageResponse(since=since, until=until, horizon_seconds=horizon_seconds)
    for target, totals in ((response.users, users), (response.groups, groups)):
        for name, t in sorted(totals.items(), key=lambda kv: (-kv[1].gpu_seconds, kv[0])):
            target.add(name=name, gpu_seconds=t.gpu_seconds, cpu_seconds=t.cpu_seconds,
                       peak_rss_bytes=t.peak_rss_bytes, jobs=t.jobs)
    return response


# ---- the queue and the policy ------------------------------------------------------------------

WAITING_TO_BE_TRIED = "waiting to be placed"


def queued_job(job, position: int, now: float) -> control_pb2.QueuedJob:
    """One PENDING job of the coordinator's queue, as GetQueue lists it."""
    # Only the scheduler's own words: every reader sees the queue, and a job's other messages (how its last
    # attempt ended) are for those who may read the job.
    reason = job.message if job.message.startswith("waiting") else WAITING_TO_BE_TRIED
    if job.not_before > now:
        reason = f"restarting: not placed again for {job.not_before - now:.0f} s (backoff)"
    return control_pb2.QueuedJob(position=position, id=job.id, name=job.spec.name, owner=job.owner,
                                 priority=job.priority, rank=job.rank, tasks=len(job.tasks),
                                 gpus=sum(job.spec.gpus_for(t.type) for t in job.tasks), reason=reason,
                                 waiting_since=max(job.created, job.not_before), not_before=job.not_before)


def policy_response(policy) -> control_pb2.GetPolicyResponse:
    return control_pb2.GetPolicyResponse(text=policy.text, source=policy.source, loaded_at=policy.loaded_at)


def diagnose_response(checks) -> control_pb2.DiagnoseResponse:
    """`tfcluster doctor`'s checks (core/diagnosis.py's Check: name, subject, level, message, fix)."""
    return control_pb2.DiagnoseResponse(checks=[control_pb2.Check(name=c.name, subject=c.subject, level=c.level,
                                                                  message=c.message, fix=c.fix) for c in checks])
