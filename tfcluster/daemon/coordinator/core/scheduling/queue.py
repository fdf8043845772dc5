"""The queue of PENDING jobs: their order, the quotas that hold some back, and the capacity held for the head of
each class so that a stream of small jobs cannot starve a large one. Pure.

Order: a higher class first, then the owner with the fewest decayed GPU-hours (fair share, as Slurm's
multifactor priority), then the older job. Within one scheduling pass (QueuePass) the jobs are tried in that
order against what is free; the first job of a class that does not fit holds the GPUs and ports it would take
once the work running there ends (a Hold), and jobs behind it start only where they leave those alone
(backfill). Usage comes in as plain mappings, so where it is counted (the jobs kept, or a ledger) is the
caller's business.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from operator import attrgetter

from tfcluster.daemon.coordinator.core.model.elastic import at_size, is_elastic, sizes, smallest
from tfcluster.daemon.coordinator.core.model.job import Job
from tfcluster.daemon.coordinator.core.scheduling.avoidance import avoided, place_avoiding
from tfcluster.daemon.coordinator.core.scheduling.placement import (NodeCapacity, TaskPlacement, Unfit, needs, place,
                                                                 task_list)
from tfcluster.daemon.coordinator.core.scheduling.policy import Policy, Subject
from tfcluster.model import WORKER
from tfcluster.spec import JobSpec

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Usage:
    """What owners have used, as the queue needs it."""
    shares: Mapping[str, float] = field(default_factory=dict)  # owner -> decayed GPU-hours (fair share)
    used_gpu_hours: Mapping[str, float] = field(default_factory=dict)  # Subject.key -> GPU-hours in its window


NO_USAGE = Usage()


def order(jobs: Iterable[Job], shares: Mapping[str, float]) -> list[Job]:
    """Pending jobs in the order they are placed: class, then the owner's fair share, then age. Sorted by one key at
    a time, the last sort deciding (each sort keeps the order of equal ones): asked at every pass of a queue of
    hundreds, that reads each job's fields in C, not a tuple built in Python per job."""
    ordered = sorted(jobs, key=_NUMBER)
    if shares:
        ordered.sort(key=lambda j: shares.get(j.owner, 0.0))
    ordered.sort(key=_RANK, reverse=True)  # reversed, equal ranks keep their order
    return ordered


_NUMBER, _RANK = attrgetter("number"), attrgetter("rank")


def gpus_asked(spec: JobSpec, exact: bool = False) -> int:
    """The GPUs the job needs to run at all (an elastic one: at its smallest size; exact: at the size it says)."""
    spec = spec if exact else smallest(spec)
    return sum(spec.gpus_for(t) for t, _ in task_list(spec))


# ---- quotas ---------------------------------------------------------------------------------------

class Holdings:
    """The GPUs and running jobs each quota subject (Subject.key) holds now; the pass adds what it places."""

    def __init__(self, policy: Policy, holding: Iterable[tuple[Job, int]] = ()):
        """holding: each job that holds resources now (Job.holds), with the GPUs it holds."""
        self.policy = policy
        self.gpus: Counter[str] = Counter()
        self.running: Counter[str] = Counter()
        if not any(limits.has_quota for limits in (*policy.users.values(), *policy.groups.values())):
            return  # nothing to count against: the jobs need not be read
        for job, gpus in holding:
            self.add(job, gpus)

    def add(self, job: Job, gpus: int) -> None:
        for subject in self.policy.subjects(job.owner, job.groups):
            self.gpus[subject.key] += gpus
            self.running[subject.key] += 1

    def largest_size(self, job: Job, holding: int = 0) -> int | None:
        """The most workers an elastic job may run at within its owner's GPU quotas, with `holding` GPUs of its own
        counted among those held (a RUNNING job that grows gives them back); None: no quota bounds it. The
        queue admits a job at its smallest size (quota_reason), so without this bound the largest size that
        fits would take up to MAX-MIN workers' GPUs past the quota."""
        if not is_elastic(job.spec):
            return None
        room = None
        for subject in self.policy.subjects(job.owner, job.groups):
            if subject.limits.gpus is not None:
                left = subject.limits.gpus - self.gpus[subject.key] + holding
                room = left if room is None else min(room, left)
        if room is None:
            return None
        within = [w for w in sizes(job.spec) if gpus_asked(at_size(job.spec, w), exact=True) <= room]
        return max(within, default=job.spec.role(WORKER).min_count)


def quota_reason(job: Job, holdings: Holdings, used_gpu_hours: Mapping[str, float]) -> str:
    """Why the job must wait for its owner's (or one of its groups') quota; "" when none holds it back."""
    subjects = holdings.policy.subjects(job.owner, job.groups)
    if not subjects:  # no quota names the owner or a group of theirs (asked of every waiting job on each pass)
        return ""
    asked = _gpus_asked_by(job)
    for subject in subjects:
        limits, key = subject.limits, subject.key
        if limits.gpus is not None and asked and holdings.gpus[key] + asked > limits.gpus:
            return (f"waiting: {subject} quota of {_count(limits.gpus, 'GPU')} is in use "
                    f"({holdings.gpus[key]} running + {asked} asked)")
        if limits.running_jobs is not None and holdings.running[key] + 1 > limits.running_jobs:
            return (f"waiting: {subject} quota of {_count(limits.running_jobs, 'running job')} is in use "
                    f"({holdings.running[key]} running)")
        used = used_gpu_hours.get(key, 0.0)
        if limits.gpu_hours is not None and asked and used >= limits.gpu_hours:
            return (f"waiting: {subject} quota of {limits.gpu_hours:g} GPU-hours per {limits.window} is used up "
                    f"({used:.1f} used)")
    return ""


def _gpus_asked_by(job: Job) -> int:
    """gpus_asked of the job's spec, kept on the job until its spec is replaced: asked of every waiting job on each
    pass, and its spec's roles walked each time cost more than the rest of the quota check."""
    kept = job.__dict__.get("_gpus_asked")
    if kept is None or kept[0] is not job.spec:
        kept = (job.spec, gpus_asked(job.spec))
        object.__setattr__(job, "_gpus_asked", kept)  # not a field: the store neither sees nor saves it
    return kept[1]


def never_within_quota(spec: JobSpec, subjects: Iterable[Subject]) -> str:
    """Why a job can never run within its owner's quotas (it asks for more GPUs than one allows); "" if it can."""
    asked = gpus_asked(spec)
    for subject in subjects:
        if subject.limits.gpus is not None and asked > subject.limits.gpus:
            return f"it asks for {_count(asked, 'GPU')}, more than {subject} quota of {subject.limits.gpus}"
        if subject.limits.running_jobs == 0:
            return f"{subject} quota allows no running job"
    return ""


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


# ---- usage from the jobs kept --------------------------------------------------------------------

# ---- holding capacity for the head of a class ----------------------------------------------------

@dataclass(frozen=True)
class Hold:
    """What a waiting job at the head of its class holds: per node, the GPUs and ports it will take."""
    job_id: str
    rank: int
    gpus: Mapping[str, frozenset[int]]
    ports: Mapping[str, frozenset[int]]

    def describe(self) -> str:
        shown = ", ".join(f"{node} ({len(g)} GPUs)" for node, g in list(self.gpus.items())[:4])
        more = f" and {len(self.gpus) - 4} more nodes" if len(self.gpus) > 4 else ""
        return f"{shown}{more}" if shown else "ports only"


@dataclass
class Waiting:
    reason: str
    for_resources: bool = True  # False: held back by a quota, which no preemption may get around


class QueuePass:
    """One pass over the queue, in order: what is free (`free`: node -> capacity, shared with the caller) and,
    for the jobs further down, what is free and not held for a job ahead of them (`view`)."""

    def __init__(self, free: dict[str, NodeCapacity], holds: dict[str, Hold], holdings: Holdings, usage: Usage,
                 idle: Callable[[str], NodeCapacity]):
        self.free, self.holds, self.holdings, self.usage, self.idle = free, holds, holdings, usage, idle
        self.view = dict(free)
        self.held_ranks: set[int] = set()
        self.held_gpus: dict[str, frozenset[int]] = {}  # node -> its GPUs held for jobs ahead
        self.holders: list[str] = []  # the jobs those are held for
        self.held_free = 0  # held GPUs free now
        # What a job asked for (placement.needs, and its size bound) -> why it did not fit on the view. The view
        # only shrinks during a pass (placed jobs take, holds are added), so a look-alike job further down does
        # not fit either: a queue of hundreds of equal jobs costs one search per pass, not hundreds.
        self.no_room: dict[tuple, str] = {}
        # A look-alike's whole answer (same owner, groups, class and needs; never placed, avoiding no node) while
        # nothing in this pass changed since it was given: a job taking, or a hold added, empties it. The queue
        # of hundreds then costs a dict lookup a job at each task's exit, not its quota, size and wording.
        self.answered: dict[tuple, Waiting] = {}

    def skip(self, job: Job) -> None:
        """A job not tried again this pass (nothing changed since it did not fit): what it holds stays held."""
        hold = self.holds.get(job.id)
        if hold is not None:
            self._hold(hold)

    def consider(self, job: Job) -> list[TaskPlacement] | Waiting:
        """Places the job on what is free and not held for a job ahead of it, or says why it waits (and, at
        the head of its class, holds what it waits for)."""
        self.holds.pop(job.id, None)
        previous = {(t.type, t.index): (t.node, t.port) for t in job.tasks if t.node}
        alike = None if previous or job.seen.failures_on else (job.owner, job.groups, job.rank, needs(job.spec))
        answer = self.answered.get(alike) if alike is not None else None
        if answer is not None:
            return answer
        answer = self._consider(job, previous)
        if alike is not None and isinstance(answer, Waiting) and job.id not in self.holds:  # it took no hold
            self.answered[alike] = answer
        return answer

    def _consider(self, job: Job, previous: dict[tuple[str, int], tuple[str, int]]) -> list[TaskPlacement] | Waiting:
        reason = quota_reason(job, self.holdings, self.usage.used_gpu_hours)
        if reason:
            return Waiting(reason, for_resources=False)
        result = self._place(job, previous)
        if not isinstance(result, Unfit):
            return result
        reason = f"waiting for resources: {result.reason}"
        # Held GPUs that are free now are all that sets the two apart: without any, it would not fit anyway.
        if self.held_free and not isinstance(place(smallest(job.spec), list(self.free.values()), previous=previous),
                                             Unfit):
            reason = f"waiting: what is free is held for {', '.join(self.holders[:3])}, ahead of it in the queue"
        if job.rank not in self.held_ranks:
            hold = self._hold_for(job)
            if hold is not None:
                self.holds[job.id] = hold
                self._hold(hold)
        return Waiting(reason)

    def _place(self, job: Job, previous: dict[tuple[str, int], tuple[str, int]]) -> list[TaskPlacement] | Unfit:
        """The job on the view, unless a job that asked for the same did not fit on it earlier in the pass. A job
        placed before, or avoiding nodes, is its own case and always searched."""
        largest = self.holdings.largest_size(job)
        asked = None if previous or avoided(job) else (needs(job.spec), largest)
        if asked in self.no_room:
            return Unfit(self.no_room[asked])
        result = place_avoiding(job, list(self.view.values()), previous=previous, largest=largest)
        if asked is not None and isinstance(result, Unfit):
            self.no_room[asked] = result.reason
        return result

    def took(self, job: Job, placement: list[TaskPlacement]) -> None:
        """The job was placed: what it took is no longer free for the jobs after it."""
        self.answered.clear()
        self.holdings.add(job, sum(len(p.gpus) for p in placement))
        for p in placement:
            for capacity in (self.free, self.view):
                capacity[p.node] = capacity[p.node].taking(p)

    def _hold(self, hold: Hold) -> None:
        self.answered.clear()
        self.held_ranks.add(hold.rank)
        self.holders.append(hold.job_id)
        for name in hold.gpus.keys() | hold.ports.keys():
            n = self.view.get(name)
            if n is not None:
                gpus = hold.gpus.get(name, frozenset())
                self.view[name] = replace(n, used_gpus=n.used_gpus | gpus,
                                          used_ports=n.used_ports | hold.ports.get(name, frozenset()))
                self.held_free += len(gpus - self.held_gpus.get(name, frozenset()) - self.free[name].used_gpus)
                self.held_gpus[name] = self.held_gpus.get(name, frozenset()) | gpus

    def _hold_for(self, job: Job) -> Hold | None:
        """Where the job would go once the work running on the nodes ends, leaving what is held for jobs ahead
        of it alone: the nodes with the most GPUs free now first, and on each its free GPUs first."""
        nodes, prefer = [], {}
        for name, now in self.free.items():
            held = self.held_gpus.get(name, frozenset())
            gpus = sorted(now.gpus, key=lambda g: (g.index in now.used_gpus, g.index))
            nodes.append(replace(self.idle(name), gpus=tuple(gpus), used_gpus=held, unavailable=now.unavailable))
            prefer[name] = now.free_gpus
        result = place(smallest(job.spec), nodes, prefer=prefer)  # an elastic job holds what it needs to start
        if isinstance(result, Unfit):
            return None
        gpus: dict[str, set[int]] = {}
        ports: dict[str, set[int]] = {}
        for p in result:
            gpus.setdefault(p.node, set()).update(g.index for g in p.gpus)
            ports.setdefault(p.node, set()).add(p.port)
        return Hold(job.id, job.rank, {n: frozenset(g) for n, g in gpus.items() if g},
                    {n: frozenset(p) for n, p in ports.items()})

