"""The attempts a node's supervisor keeps: the newest of each task, running or ended, and of the ended ones only
the newest (supervisor.FINISHED_KEPT, for supervisor.FINISHED_KEPT_SECONDS). Not thread-safe: the supervisor
holds its lock around each call.

The ended ones are kept in the order they ended, so forgetting the oldest takes them from the front: a node that
keeps thousands of ended attempts pays nothing for them at each poll of its hooks (five a second), heartbeat or
view, where sorting them all first cost 1.8-1.9 ms a poll at 5,000 (docs/benchmarks.md, "An agent's history").
"""

from __future__ import annotations

from collections import Counter, OrderedDict

from tfcluster.daemon.agent.tasks.record import TaskKey, TaskRecord


class KeptAttempts:
    def __init__(self) -> None:
        self.tasks: dict[TaskKey, TaskRecord] = {}  # the newest attempt of each task
        self.ended: OrderedDict[TaskKey, TaskRecord] = OrderedDict()  # those of them that ended, oldest first
        self.ended_unsorted = False  # one found ended after a restart was kept after one that ended later
        self.jobs: Counter[str] = Counter()  # per job, its tasks kept

    def keep(self, record: TaskRecord) -> None:
        """The record becomes its task's newest attempt: one launched, adopted, or found ended after a restart."""
        key = record.key
        if key not in self.tasks:
            self.jobs[key[0]] += 1
        self.tasks[key] = record
        self.ended.pop(key, None)
        if record.exited.is_set():  # found ended after a restart: put in its place before the next forgetting
            newest = next(reversed(self.ended.values()), None)
            self.ended[key] = record
            self.ended_unsorted |= newest is not None and newest.finished_at > record.finished_at

    def ended_now(self, record: TaskRecord) -> None:
        """The record has just ended: the newest ended, unless a newer attempt of its task came meanwhile."""
        if self.tasks.get(record.key) is record:
            self.ended[record.key] = record

    def forget(self, now: float, keep_ended: int, keep_seconds: float) -> list[TaskRecord]:
        """Forgets the oldest ended attempts past the newest keep_ended and those ended keep_seconds ago."""
        if self.ended_unsorted:
            self.ended = OrderedDict(sorted(self.ended.items(), key=lambda item: item[1].finished_at))
            self.ended_unsorted = False
        forgotten = []
        for oldest in self.ended.values():
            if len(self.ended) - len(forgotten) <= keep_ended and now - oldest.finished_at <= keep_seconds:
                break
            forgotten.append(oldest)
        for record in forgotten:
            job_id = record.attempt.job_id
            del self.ended[record.key], self.tasks[record.key]
            self.jobs[job_id] -= 1
            if not self.jobs[job_id]:
                del self.jobs[job_id]
        return forgotten
