"""Host-local checkpoints (a spec without checkpoint_dir): each node keeps its own, and agents copy them
where they are needed. Pure.

While training runs, the chief's agent ships each new checkpoint to the evaluator's agent. Before a
restarted group starts, the node that held the chief's checkpoints copies its whole dir (backups included)
to the group's other nodes, so every task resumes from the same point.
"""

from __future__ import annotations

from collections.abc import Callable

from tfcluster.commands import Command, ExpectFiles, ShipCheckpoints, SyncCheckpoints
from tfcluster.daemon.coordinator.core.model.job import Job
from tfcluster.model import CHIEF, EVALUATOR, WORKER, NodeInfo
from tfcluster.states import JobState

SYNC_DEADLINE_SECONDS = 600.0


def restore(job: Job, info_of: Callable[[str], NodeInfo | None], now: float) -> list[Command]:
    """At placement: copy the previous chief's checkpoint dir to the group's nodes that lack it."""
    source, job.checkpoint_node = job.checkpoint_node, job.decisive_task().node
    if not job.host_local or not source:
        return []
    if info_of(source) is None:
        job.message = _noted(job.message, f"the checkpoints were on {source}, which is gone; training starts over")
        return []
    if not _targets(job, source):
        return []
    job.syncs += 1
    job.syncing, job.sync_source, job.sync_until = job.syncs, source, now + SYNC_DEADLINE_SECONDS
    job.message = _noted(job.message, _copying(job))
    return sync_commands(job, now)


def _targets(job: Job, source: str) -> dict[str, str]:
    """The group's nodes other than source that a copy reaches: node -> its peer address."""
    return {t.node: t.peer for t in job.tasks
            if t.type in (CHIEF, WORKER, EVALUATOR) and t.node != source and t.peer}


def _copying(job: Job) -> str:
    return f"copying checkpoints from {job.sync_source} to {', '.join(sorted(_targets(job, job.sync_source)))}"


def _noted(message: str, note: str) -> str:
    """The job's message with note after it: what placing it said (an elastic job's resize) stays in status."""
    return f"{message}; {note}" if message else note


def sync_commands(job: Job, now: float) -> list[Command]:
    """The copy under way, its targets told to expect it first (sent again until its answer arrives: the
    agent keeps the answer)."""
    job.seen.sync_sent_at = now
    targets = _targets(job, job.sync_source)
    nodes = sorted(targets)
    expect = [ExpectFiles(node, job.id, sender=job.sync_source, uid=job.uid, gid=job.uid) for node in nodes]
    return [*expect, SyncCheckpoints(node=job.sync_source, job_id=job.id, sync_id=job.syncing,
                                     targets=tuple(targets[n] for n in nodes), target_nodes=tuple(nodes))]


def sync_finished(job: Job, sync_id: int, ok: bool, message: str) -> bool:
    """True when this answer ends the copy the job waits for (then the group may start)."""
    if sync_id != job.syncing or job.state != JobState.STARTING:
        return False
    copying = _copying(job)
    before = "" if job.message == copying else job.message.removesuffix(f"; {copying}")
    job.syncing = 0
    job.message = before if ok else _noted(before, f"copying the checkpoints failed ({message}); starting without them")
    return True


def shipping(job: Job) -> list[Command]:
    """With the evaluator on another node, the chief's agent ships it each new checkpoint."""
    decisive, evaluator = job.decisive_task(), job.evaluator()
    if not job.host_local or evaluator is None or not evaluator.node or not decisive.live:
        return []
    if evaluator.node == decisive.node or not evaluator.peer:
        return []
    return [ExpectFiles(evaluator.node, job.id, sender=decisive.node, uid=job.uid, gid=job.uid),
            ShipCheckpoints(node=decisive.node, attempt=job.attempt_of(decisive), targets=(evaluator.peer,),
                            target_nodes=(evaluator.node,))]
