"""Where an elastic job's size is chosen (core/model/elastic.py keeps it). Pure.

Placing: the whole group goes at the largest size in its range that fits now, or waits while even the
smallest does not. A restart of the group (a failure, a lost node, a preemption) therefore comes back at a
smaller size when fewer workers fit, and the queue starts a new job once its smallest size fits.

Growing (grow_to): a RUNNING job below its largest size grows when more workers would fit on what is free
plus what it holds itself, at most once per resize interval (counted from its last placement), and never
while a job of its class or a higher one waits in the queue: what frees up goes to that job first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tfcluster.daemon.coordinator.core.model import elastic
from tfcluster.daemon.coordinator.core.model.capacity import NodeCapacity
from tfcluster.daemon.coordinator.core.model.job import Job
from tfcluster.daemon.coordinator.core.scheduling.placement import TaskPlacement, Unfit, place
from tfcluster.daemon.coordinator.core.scheduling.preemption import adjust, held_by
from tfcluster.model import WORKER
from tfcluster.spec import JobSpec
from tfcluster.states import JobState

Placer = Callable[..., "list[TaskPlacement] | Unfit"]


def place_sized(spec: JobSpec, capacity: list[NodeCapacity], placer: Placer = place, largest: int | None = None,
                **how) -> list[TaskPlacement] | Unfit:
    """placer(spec, capacity, **how) at the largest size that fits, and is no larger than `largest` (the owner's
    GPU quota's bound, queue.Holdings.largest_size; None: none) (a fixed spec, or tasks re-placed alone with
    `only`, at the size it has). Unfit: even the smallest size does not fit, and why."""
    if not elastic.is_elastic(spec) or how.get("only") is not None:
        return placer(spec, capacity, **how)
    smallest = placer(elastic.smallest(spec), capacity, **how)
    if isinstance(smallest, Unfit):  # one search says it waits: the common case of a busy cluster costs no more
        return smallest
    for workers in elastic.sizes(spec):
        if workers == spec.role(WORKER).min_count:
            break
        if largest is not None and workers > largest:
            continue
        result = placer(elastic.at_size(spec, workers), capacity, **how)
        if not isinstance(result, Unfit):
            return result
    return smallest


def may_grow(job: Job, waiting: Iterable[Job], now: float) -> bool:
    """A RUNNING elastic job below its largest size, placed a resize interval ago or longer, with no job of its
    class or a higher one waiting (`waiting`: the PENDING jobs)."""
    spec = job.spec
    if not elastic.is_elastic(spec) or job.state != JobState.RUNNING or job.final_evaluation_until:
        return False
    if elastic.size(spec) >= spec.role(WORKER).max_count or now - job.placed < spec.resize_interval_seconds:
        return False
    return not any(other.rank >= job.rank for other in waiting if other is not job)


def grow_to(job: Job, capacity: list[NodeCapacity], largest: int | None = None) -> int:
    """The largest size above its own, and no larger than `largest` (its owner's GPU quota's bound; None: none),
    that the job (may_grow) fits at on capacity (what is free now) plus what it holds; 0: none."""
    spec, current = job.spec, elastic.size(job.spec)
    mine = adjust(capacity, held_by([job]), give_back=True)  # a group restart frees what it holds, too
    for workers in elastic.sizes(spec):
        if workers <= current:
            return 0
        if largest is not None and workers > largest:
            continue
        if not isinstance(place(elastic.at_size(spec, workers), mine), Unfit):
            return workers
    return 0
