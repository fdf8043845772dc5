"""The cluster's jobs: every job kept, the live ones in order, the ended ones until retention lets them go. Pure.

Jobs owns the registry and its indexes: the live jobs oldest first, the ended ones in the order they ended (and
how many ended in each state), the live ones a scheduling pass looks at and those the tick looks at, each
submission's request id, the holder of each task UID, and the counter that numbers jobs. A job enters through add
(loaded, or made by new), leaves the live ones through settle once it has ended, and leaves for good through
prune; each of these changes every index with it, so none holds a job that is not kept.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType

from tfcluster.daemon.coordinator.core.model import task_uids as taskusers
from tfcluster.daemon.coordinator.core.model.capacity import task_list
from tfcluster.daemon.coordinator.core.model.changelog import (ChangeLog, EndedJobAmended, JobAdded, JobEnded, JobRemoved,
                                                            JobsNumbered)
from tfcluster.daemon.coordinator.core.model.job import Job, Task
from tfcluster.daemon.coordinator.core.model.registry import Registry
from tfcluster.spec import JobSpec
from tfcluster.states import JobState

KEEP_FINISHED_JOBS = 1000
KEEP_FINISHED_SECONDS = 7 * 86400.0


class Jobs(Registry[Job]):
    """The registry, read as a mapping of job id -> Job; changed only through its methods."""

    def __init__(self, task_uids: taskusers.UidRange = taskusers.UidRange(),
                 keep_finished_jobs: int = KEEP_FINISHED_JOBS, keep_finished_seconds: float = KEEP_FINISHED_SECONDS,
                 changes: ChangeLog | None = None):
        self.changes = changes if changes is not None else ChangeLog()  # told of every job added, ended, removed
        self.task_uids = task_uids
        self.keep_finished_jobs, self.keep_finished_seconds = keep_finished_jobs, keep_finished_seconds
        self.cluster_tag = ""  # ends every job id: ids of another state dir's jobs never collide
        self._jobs: dict[str, Job] = {}
        super().__init__(self._jobs)
        self._live: dict[str, Job] = {}   # jobs not ended, oldest first
        # The live jobs a scheduling pass looks at (Job.waits_for_placement): with hundreds running and hundreds
        # waiting, a pass at each task's exit reads the waiting ones, not every live job.
        self._to_place: dict[str, Job] = {}
        # The live jobs the coordinator's tick looks at: all but those that only wait in the queue (Job.waits_in_queue),
        # for which time alone changes nothing. A queue of 10,000 cost 7 µs a job at each tick, 0.4 of a core.
        self._ticking: dict[str, Job] = {}
        self._ended: dict[str, Job] = {}  # ended jobs, in the order they ended (retention removes from the front)
        self._ended_states: Counter[JobState] = Counter()  # how many of them ended in each state (it never changes)
        self.live: Mapping[str, Job] = MappingProxyType(self._live)
        self.to_place: Mapping[str, Job] = MappingProxyType(self._to_place)
        self.ticking: Mapping[str, Job] = MappingProxyType(self._ticking)
        self.ended: Mapping[str, Job] = MappingProxyType(self._ended)
        self._requests: dict[str, str] = {}  # a submission's client request id -> its job
        # task UID -> the kept jobs that have it: one, or ended ones and the job that took it over when the range
        # ran short (taskusers.allocate)
        self._by_uid: dict[int, dict[str, Job]] = {}
        self._next_number = 1

    # ---- reading -------------------------------------------------------------------------------

    @property
    def next_number(self) -> int:
        """The number the next job gets: above every job's ever given out."""
        return self._next_number

    def by_request(self, request_id: str) -> Job | None:
        """The job a submission with this client request id made, while it is kept."""
        job_id = self._requests.get(request_id) if request_id else None
        return self._jobs[job_id] if job_id is not None else None

    def by_state(self) -> Counter[JobState]:
        """How many kept jobs are in each state: the live ones counted now, the ended ones as they ended."""
        return self._ended_states + Counter(job.state for job in self._live.values())

    # ---- changes -------------------------------------------------------------------------------

    def add(self, job: Job) -> None:
        """A job from the store (or a new one)."""
        self._hold_uid(job)
        self._jobs[job.id] = job
        (self._ended if job.ended else self._live)[job.id] = job
        if job.ended:
            self._ended_states[job.state] += 1
        else:
            self._track_live(job)
        if job.request_id:
            self._requests[job.request_id] = job.id
        self._next_number = max(self._next_number, job.number + 1)
        self.changes.append(JobAdded(job))

    def new(self, spec: JobSpec, request_id: str, now: float, owner: str = "", groups: tuple[str, ...] = ()) -> Job:
        """A new PENDING job with the next number and a task UID of its own; raises taskusers.RangeExhausted."""
        uid = self._allocate_uid(self._next_number)
        number = self._next_number
        job_id = f"{spec.name}-{number}-{self.cluster_tag}" if self.cluster_tag else f"{spec.name}-{number}"
        job = Job(id=job_id, spec=spec, number=number, request_id=request_id, created=now, uid=uid, owner=owner,
                  groups=groups,
                  tasks=[Task(type=t, index=i) for t, i in task_list(spec)])
        self.add(job)
        self.changes.append(JobsNumbered(self._next_number))
        return job

    def continue_numbering(self, next_number: int) -> None:
        """The store gave out numbers up to next_number - 1 (to jobs since removed, too): none is given out again."""
        self._next_number = max(self._next_number, next_number)

    def assign_missing_uids(self) -> None:
        """Live jobs saved by a coordinator before 0.3 have no task UID: each gets one now, after every kept job
        was loaded (none may take a UID another holds) and before any of their tasks is launched again."""
        for job in self._live.values():
            if not job.uid:
                job.uid = self._allocate_uid(job.number)
                self._hold_uid(job)

    def settle(self, job: Job) -> bool:
        """After a change to a job: True when it has just ended (it leaves the live jobs)."""
        if job.id in self._live:
            self._track_live(job)
        if not job.ended or job.id not in self._live:
            return False
        del self._live[job.id]
        self._ended[job.id] = job
        self._ended_states[job.state] += 1
        self.changes.append(JobEnded(job))
        return True

    def _track_live(self, job: Job) -> None:
        """The live job in the indexes a scheduling pass and the tick read, or out of them."""
        if job.waits_for_placement():
            self._to_place[job.id] = job
        else:
            self._to_place.pop(job.id, None)
        if job.ended or job.waits_in_queue():
            self._ticking.pop(job.id, None)
        else:
            self._ticking[job.id] = job

    def amended(self, job: Job) -> None:
        """An ended job changed once more (a late evaluation): the writer writes it again."""
        if job.id in self._ended:
            self.changes.append(EndedJobAmended(job))

    def prune(self, now: float) -> list[Job]:
        """Removes the oldest ended jobs beyond keep_finished_jobs, and those ended longer ago than
        keep_finished_seconds; returns them."""
        removed = []
        while self._ended:
            job = next(iter(self._ended.values()))
            if len(self._ended) <= self.keep_finished_jobs and now - job.finished <= self.keep_finished_seconds:
                break
            del self._ended[job.id], self._jobs[job.id]
            self._ended_states[job.state] -= 1
            if self._requests.get(job.request_id) == job.id:
                del self._requests[job.request_id]
            holders = self._by_uid.get(job.uid, {})
            holders.pop(job.id, None)
            if not holders:
                self._by_uid.pop(job.uid, None)
            removed.append(job)
            self.changes.append(JobRemoved(job))
        return removed

    def _allocate_uid(self, number: int) -> int:
        def held_by_live(uid: int) -> bool:
            return any(not job.ended for job in self._by_uid.get(uid, {}).values())

        return taskusers.allocate(number, self.task_uids, held_by_live, lambda uid: uid in self._by_uid)

    def _hold_uid(self, job: Job) -> None:
        if job.uid:
            self._by_uid.setdefault(job.uid, {})[job.id] = job

