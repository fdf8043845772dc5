"""What the tasks placed on each node hold there (GPU indices, ports, the bytes of their memory limits), kept up to
date as jobs change instead of added up at every scheduling pass. Pure.

A pass runs at each task's exit (what it freed may let a waiting job start), and every pass reads what is held on
every node. Added up from the jobs, that read cost every placed task of the cluster each time: hundreds of
microseconds with a few hundred tasks, tens of milliseconds with tens of thousands. Here it costs the nodes that
hold something. The cluster hands over each job after every change to it (Cluster.settle, beside the node table's
placements); what the job holds now is compared with what was recorded for it, so a change costs that job's tasks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from tfcluster.daemon.coordinator.core.model.job import Job


class Hold(NamedTuple):
    """What one task holds on its node (a tuple: made for each placed task at each change of its job)."""
    node: str
    port: int
    gpus: tuple[int, ...]
    memory: int  # the bytes of its memory limit; 0: none


def holds_of(job: Job) -> dict[str, Hold]:
    """Task key -> what it holds, for the job's tasks that hold their node's resources now: live ones, and those
    placed and waiting to launch there (a later wave, a restart in place, a backoff). An ended job holds nothing."""
    if job.ended:
        return {}
    return {task.key: Hold(task.node, task.port, tuple(g.index for g in task.gpus), job.spec.memory_for(task.type))
            for task in job.tasks if task.node and job.holds(task)}


class Held:
    """Node -> what its tasks hold, as of the last track() of each job."""

    def __init__(self) -> None:
        self._by_job: dict[str, dict[str, Hold]] = {}  # job id -> task key -> its hold (jobs that hold something)
        # Counted, not sets: should two tasks ever hold the same port, releasing one leaves the other's held.
        self._gpus: dict[str, Counter[int]] = {}
        self._ports: dict[str, Counter[int]] = {}
        self._memory: dict[str, int] = {}

    def track(self, job: Job) -> None:
        """The job may have changed: what it holds is recorded anew."""
        now, before = holds_of(job), self._by_job.get(job.id, {})
        if now == before:
            return
        for key, hold in before.items():
            if now.get(key) != hold:
                self._release(hold)
        for key, hold in now.items():
            if before.get(key) != hold:
                self._take(hold)
        if now:
            self._by_job[job.id] = now
        else:
            self._by_job.pop(job.id, None)

    def jobs(self) -> Iterator[tuple[str, int]]:
        """Each job that holds something: its id, and how many GPUs it holds."""
        for job_id, holds in self._by_job.items():
            yield job_id, sum(len(hold.gpus) for hold in holds.values())

    def gpus(self) -> Mapping[str, Counter[int]]:
        """Node -> its GPU indices held (a node holding none is absent)."""
        return self._gpus

    def ports(self) -> Mapping[str, Counter[int]]:
        """Node -> its ports held (a node holding none is absent)."""
        return self._ports

    def memory(self) -> Mapping[str, int]:
        """Node -> the bytes of the memory limits held there (a node holding none is absent)."""
        return self._memory

    def _take(self, hold: Hold) -> None:
        if hold.gpus:
            self._gpus.setdefault(hold.node, Counter()).update(hold.gpus)
        self._ports.setdefault(hold.node, Counter())[hold.port] += 1
        if hold.memory:
            self._memory[hold.node] = self._memory.get(hold.node, 0) + hold.memory

    def _release(self, hold: Hold) -> None:
        if hold.gpus:
            _uncount(self._gpus, hold.node, hold.gpus)
        _uncount(self._ports, hold.node, (hold.port,))
        if hold.memory:
            left = self._memory[hold.node] - hold.memory
            if left:
                self._memory[hold.node] = left
            else:
                del self._memory[hold.node]


def _uncount(counts: dict[str, Counter[int]], node: str, values: tuple[int, ...]) -> None:
    counter = counts[node]
    for value in values:
        counter[value] -= 1
        if not counter[value]:
            del counter[value]
    if not counter:
        del counts[node]
