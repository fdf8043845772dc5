"""Jobs stopped to go back to the queue, with no restart charged to them: preempted by a job of a higher class,
requeued off a node an admin drained, or stopped to be placed again larger (elastic). Each is a graceful stop of
the whole group (wind_down, with the job's stop signal, so its programs save first), then PENDING again.
"""

from __future__ import annotations

import logging

from tfcluster.commands import Command
from tfcluster.daemon.coordinator.core.lifecycle import restart
from tfcluster.daemon.coordinator.core.lifecycle.transitions import wind_down
from tfcluster.daemon.coordinator.core.model import elastic
from tfcluster.daemon.coordinator.core.model.job import Job, describe_preemption
from tfcluster.daemon.logformat import fields

log = logging.getLogger("tfcluster.coordinator")


def preempt(job: Job, by: Job, now: float) -> list[Command]:
    """A job of a higher class takes this one's resources (preemption.py): what restart.preempted decides,
    a graceful stop of the whole group (SIGTERM, so the program saves, then SIGKILL after the grace), and
    back to PENDING once every task is gone, its resources kept for `by` until `by` is placed."""
    decision = restart.preempted(job, describe_preemption(by.id, by.owner, now))
    if decision.scope == restart.NOTHING:
        return []
    job.preempted_by, job.preempted_by_owner, job.preempted_at, job.held_for = by.id, by.owner, now, by.id
    for task in job.tasks:  # what it holds now is kept for `by`; a task ended earlier (an evaluator given up)
        if not job.holds(task):  # holds nothing, and what it held may be another job's by now
            task.unplace()
    log.warning("%s: %s", job.id, decision.reason, extra=fields(job=job.id))
    restart.book(job, decision, None, now)
    return wind_down(job, restart.RESTART, decision.reason, now)


def requeue(job: Job, why: str, now: float) -> list[Command]:
    """An admin drained a node the job runs on with --requeue: as a preemption with nobody waiting for what it
    frees (restart.preempted): a graceful stop of the whole group, then back to the queue, where placement passes
    the drained node by; no restart is charged."""
    decision = restart.preempted(job, why)
    if decision.scope == restart.NOTHING:
        return []
    log.warning("%s: %s", job.id, decision.reason, extra=fields(job=job.id))
    restart.book(job, decision, None, now, restart.DRAINED)
    return wind_down(job, restart.RESTART, decision.reason, now)


def grow(job: Job, workers: int, now: float) -> list[Command]:
    """More workers fit for an elastic job (core/scheduling/elastic.py): the whole group stops with the job's
    preemption signal, so its programs save first, and goes back to the queue at once, which places it at the
    largest size that fits then. No restart is charged."""
    reason = (f"growing {elastic.size(job.spec)} \u2192 {workers} workers: stopping the group with "
              f"{job.spec.stop_signal} to save, then restarting it from the checkpoint")
    decision = restart.resized(job, reason)
    if decision.scope == restart.NOTHING:
        return []
    log.info("%s: %s", job.id, reason, extra=fields(job=job.id))
    restart.book(job, decision, None, now, restart.RESIZED)
    return wind_down(job, restart.RESTART, reason, now)
