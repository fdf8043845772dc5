"""The queue and the policy on the wire (GetQueue, GetPolicy) and as the documents `tfcluster queue --json` and
`tfcluster policy --json` print (their fields are a contract, as status --json's)."""

from __future__ import annotations

from typing import Any

from tfcluster.api.v1 import control_pb2

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


def queue_doc(response: control_pb2.GetQueueResponse, now: float) -> dict[str, Any]:
    return {"total": response.total, "jobs": [
        {"position": q.position, "id": q.id, "name": q.name, "owner": q.owner, "priority": q.priority,
         "rank": q.rank, "tasks": q.tasks, "gpus": q.gpus, "reason": q.reason, "waiting_since": q.waiting_since,
         "waiting_seconds": round(max(0.0, now - q.waiting_since), 3)}
        for q in response.jobs]}


def policy_response(policy) -> control_pb2.GetPolicyResponse:
    return control_pb2.GetPolicyResponse(text=policy.text, source=policy.source, loaded_at=policy.loaded_at)


def policy_doc(response: control_pb2.GetPolicyResponse) -> dict[str, Any]:
    return {"source": response.source or None, "loaded_at": response.loaded_at or None, "text": response.text}
