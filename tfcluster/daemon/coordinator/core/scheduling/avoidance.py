"""Nodes a job keeps failing on are avoided for that job: once AVOID_AFTER_FAILURES of its tasks failed on a node
in a row (a bad GPU, a broken mount only that job touches, a library missing there), its next placements pass the
node by, as Nomad's rescheduler penalises the node a failed allocation ran on. Only for that job, and only while
it can go elsewhere: a job that fits nowhere else is placed there again rather than left waiting. The counts
live in the job's JobSeen (core/model/job.py), kept while the coordinator runs.
"""

from __future__ import annotations

from dataclasses import replace

from tfcluster.daemon.coordinator.core.model.capacity import NodeCapacity
from tfcluster.daemon.coordinator.core.model.job import Job
from tfcluster.daemon.coordinator.core.scheduling.elastic import place_sized
from tfcluster.daemon.coordinator.core.scheduling.placement import TaskPlacement, Unfit

AVOID_AFTER_FAILURES = 3


def avoided(job: Job) -> dict[str, int]:
    """node -> how many of the job's tasks failed there in a row, for the nodes the job avoids."""
    return {node: n for node, n in job.seen.failures_on.items() if n >= AVOID_AFTER_FAILURES}


def place_avoiding(job: Job, capacity: list[NodeCapacity], **how) -> list[TaskPlacement] | Unfit:
    """place() for the job (an elastic one at the largest size that fits: elastic.py), away from the nodes it
    avoids when it fits elsewhere."""
    avoid = avoided(job)
    if avoid:
        elsewhere = place_sized(job.spec, [replace(n, unavailable=_why(avoid[n.name])) if n.name in avoid else n
                                     for n in capacity], **how)
        if not isinstance(elsewhere, Unfit):
            return elsewhere
    return place_sized(job.spec, capacity, **how)


def note(job: Job) -> str:
    """What the job's message says about the nodes it avoids ("" when none)."""
    avoid = avoided(job)
    if not avoid:
        return ""
    return "avoiding " + ", ".join(f"{node} ({_why(n)})" for node, n in sorted(avoid.items()))


def _why(failures: int) -> str:
    return f"{failures} of this job's tasks failed there in a row"
