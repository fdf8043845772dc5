"""Preemption: a job that cannot fit takes the GPUs and ports of placed jobs of a lower, preemptible class. Pure.

Who may be taken from (candidates): a STARTING or RUNNING job whose rank (its class's value) is lower than
the waiting job's and whose class is preemptible; equal ranks never preempt, so without a policy (every job
rank 0) nothing does. Which of them (choose_victims): the fewest jobs, and among sets as small the most
recently started ones, and only a set whose resources, given back, really let the waiting job fit.

The victims stop gracefully and go back to the queue (lifecycle/back_to_queue.py, preempt). Until the job they stopped for is
placed, what they held is kept for it (held_for on each victim; holdings and free_for): no third job, and no
victim placed again, takes it while the victims' tasks save and exit.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import replace

from tfcluster.daemon.coordinator.core.model.elastic import smallest
from tfcluster.daemon.coordinator.core.model.job import Job
from tfcluster.daemon.coordinator.core.scheduling.placement import NodeCapacity, Unfit, place
from tfcluster.states import JobState

# Sets of victims tried (each costs a placement) before settling for a greedy choice: the exact search is over
# sets of one or two jobs among tens of candidates; beyond that the greedy one is as good in practice.
SEARCH_BUDGET = 300

Holdings = dict[str, tuple[set[int], set[int]]]  # node -> (GPU indices, ports)


def may_take_from(job: Job) -> bool:
    """The job's resources may be taken by a job of a higher class now (not once its training is over: only its
    final evaluation is left, and it ends soon by itself)."""
    return job.preemptible and job.state in (JobState.STARTING, JobState.RUNNING) and not job.final_evaluation_until


def candidates(waiting: Job, placed: Iterable[Job]) -> list[Job]:
    """Of the jobs that may be taken from (may_take_from), those of a lower rank than waiting's, the most
    recently started first."""
    lower = [j for j in placed if j.rank < waiting.rank]
    return sorted(lower, key=lambda j: (j.placed, j.number), reverse=True)


def choose_victims(waiting: Job, candidates: list[Job], capacity: list[NodeCapacity]) -> list[Job]:
    """The fewest candidates whose resources, given back, let waiting fit; among sets as small, the one of the
    most recently started (candidates come most recent first). [] when even all of them would not do."""
    if not candidates or not _fits(waiting, capacity, candidates):
        return []
    tried = 0
    for size in range(1, len(candidates)):
        for victims in itertools.combinations(candidates, size):
            if tried == SEARCH_BUDGET:
                return _greedy(waiting, candidates, capacity)
            tried += 1
            if _fits(waiting, capacity, victims):
                return list(victims)
    return list(candidates)


def _greedy(waiting: Job, candidates: list[Job], capacity: list[NodeCapacity]) -> list[Job]:
    """The most recent candidates until waiting fits, then without each (oldest first) it still fits without."""
    chosen: list[Job] = []
    for candidate in candidates:
        chosen.append(candidate)
        if _fits(waiting, capacity, chosen):
            break
    for victim in reversed(list(chosen)):
        rest = [j for j in chosen if j is not victim]
        if rest and _fits(waiting, capacity, rest):
            chosen = rest
    return chosen


def _fits(waiting: Job, capacity: list[NodeCapacity], victims: Iterable[Job]) -> bool:
    # an elastic job preempts only what it needs to start
    return not isinstance(place(smallest(waiting.spec), adjust(capacity, held_by(victims), give_back=True)), Unfit)


def held_by(jobs: Iterable[Job]) -> Holdings:
    """What the jobs' tasks hold, or held when preempted (back_to_queue.preempt unplaces the others): node -> GPUs,
    ports."""
    held: Holdings = {}
    for job in jobs:
        for task in job.tasks:
            if task.node:
                gpus, ports = held.setdefault(task.node, (set(), set()))
                gpus.update(g.index for g in task.gpus)
                ports.add(task.port)
    return held


def holdings(live: Iterable[Job]) -> dict[str, Holdings]:
    """The job each preempted job's resources are kept for -> those resources."""
    victims: dict[str, list[Job]] = {}
    for job in live:
        if job.held_for:
            victims.setdefault(job.held_for, []).append(job)
    return {holder: held_by(jobs) for holder, jobs in victims.items()}


def free_for(job: Job | None, capacity: dict[str, NodeCapacity], held: dict[str, Holdings]) -> list[NodeCapacity]:
    """The capacity job may be placed on: without what is kept for other jobs (job None: for any job)."""
    nodes = list(capacity.values())
    for holder, resources in held.items():
        if job is None or holder != job.id:
            nodes = adjust(nodes, resources, give_back=False)
    return nodes


def adjust(capacity: list[NodeCapacity], resources: Holdings, give_back: bool) -> list[NodeCapacity]:
    """capacity with resources given back (free again) or taken (used)."""
    adjusted = []
    for n in capacity:
        if n.name not in resources:
            adjusted.append(n)
            continue
        gpus, ports = resources[n.name]
        if give_back:
            adjusted.append(replace(n, used_gpus=n.used_gpus - gpus, used_ports=n.used_ports - ports))
        else:
            adjusted.append(replace(n, used_gpus=n.used_gpus | gpus, used_ports=n.used_ports | ports))
    return adjusted


def release(holder: str, live: Iterable[Job]) -> bool:
    """What was kept for holder is free for anyone again (it was placed, it ended, or it still does not fit
    now that its victims are gone). True when anything was kept."""
    released = False
    for job in live:
        if job.held_for == holder:
            job.held_for, released = "", True
    return released


def still_stopping(holder: str, live: Iterable[Job]) -> bool:
    """Some job preempted for holder is still stopping (its resources are not all free yet)."""
    return any(j.held_for == holder and j.state == JobState.STOPPING for j in live)
