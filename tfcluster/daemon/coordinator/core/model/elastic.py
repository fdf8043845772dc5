"""Elastic jobs: a multi_worker_mirrored job whose worker count is a range (`count = "MIN..MAX"`). Pure.

The job's spec always holds the size it runs at (`roles.worker.count`), beside the range (min_count,
max_count): everything that places, launches or describes the job (TF_CONFIG, TFCLUSTER_NUM_WORKERS, the
task list) reads that size as it would a fixed one. It changes only when the whole group is placed (the
queue places it at the largest size that fits, core/scheduling/elastic.py), and the group's tasks are then
made to match it here. MirroredStrategy across workers has no way to change its size while it runs, so every
resize is a group restart from the job's checkpoint.
"""

from __future__ import annotations

from dataclasses import replace

from tfcluster.daemon.coordinator.core.model.job import Job, Task, saved_step
from tfcluster.model import ROLE_TYPES, WORKER
from tfcluster.spec import JobSpec


def is_elastic(spec: JobSpec) -> bool:
    return spec.role(WORKER).elastic


def size(spec: JobSpec) -> int:
    """The number of workers it runs at (or asks for, while it waits)."""
    return spec.count(WORKER)


def at_size(spec: JobSpec, workers: int) -> JobSpec:
    """The spec with `workers` workers, its range kept."""
    return replace(spec, roles={**spec.roles, WORKER: replace(spec.role(WORKER), count=workers)})


def sizes(spec: JobSpec) -> range:
    """The sizes it may run at, the largest first."""
    role = spec.role(WORKER)
    return range(role.max_count, role.min_count - 1, -1)


def smallest(spec: JobSpec) -> JobSpec:
    """The spec at its smallest size (what it needs to run at all); a fixed spec as it is."""
    return at_size(spec, spec.role(WORKER).min_count) if is_elastic(spec) else spec


def resize(job: Job, workers: int) -> int:
    """The job (PENDING, being placed) takes `workers` workers: its spec says so, and its tasks are worker
    0..workers-1 (those kept keep their attempt numbers; a new one starts above every attempt the job's tasks,
    dropped ones included, have reached, so no attempt of an index dropped earlier is named again: a late report
    of the old one is told apart). Returns the size before."""
    before = size(job.spec)
    if workers == before:
        return before
    job.spec = at_size(job.spec, workers)
    top = max([job.top_attempt, *(t.attempt for t in job.tasks)])
    job.top_attempt = top
    kept = [t for t in job.tasks if t.type != WORKER or t.index < workers]
    have = {t.index for t in kept if t.type == WORKER}
    added = [Task(type=WORKER, index=i, attempt=top) for i in range(workers) if i not in have]
    job.tasks = sorted(kept + added, key=lambda t: (ROLE_TYPES.index(t.type), t.index))
    return before


def take_size(job: Job, workers: int) -> str:
    """The PENDING elastic job is placed with `workers` workers: it takes that size; what its message says of it
    ("": a fixed job, or the size it ran at before)."""
    if not is_elastic(job.spec):
        return ""
    role = job.spec.role(WORKER)
    if not job.placed:  # its first placement
        resize(job, workers)
        return f"started with {workers} workers (elastic {role.min_count}..{role.max_count})"
    before = resize(job, workers)
    if before == workers:
        return ""
    job.resizes += 1
    step = saved_step(job)
    resumed = "resuming from the checkpoint" + ("" if step is None else f" saved at step {step}")
    return f"resized {before} \u2192 {workers} workers, {resumed}"
