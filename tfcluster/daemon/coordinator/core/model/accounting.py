"""What each job used, and what the usage ledger (ledger.py), which outlives job retention, keeps of it. Pure.

A job's usage adds up its tasks' attempts: GPU-seconds are each attempt's GPUs times the time it was RUNNING
(from the coordinator's own clock: the report that it runs, to the report of its exit or its loss); CPU-seconds
and peak RSS are what the agent measured of the attempt's process tree (TaskExit), plus, for an attempt still
running, the live figures its heartbeats carry (Task.seen.live). A job keeps the sum over its ended attempts
(Job.usage, stored with it); its running attempts are added up to the time asked.

When a job ends, one ledger entry records it (owner, groups, when it first ran and when it ended, its usage);
entries are kept for the ledger's horizon (--keep-usage-for, 90 days by default), whatever retention does with
the job itself. Queries take the live jobs as entries made up to now, so running work counts too:
- totals per user and per group over a window (`tfcluster usage`), a job's usage pro-rated to the part of its
  run inside the window (usage is taken as spread evenly between its first start and its end);
- each owner's decayed GPU-hours (fair share, as Slurm's multifactor priority does): GPU-hours used at time t
  count 0.5 ** ((now - t) / half_life). Kept per half-life as running sums anchored at one time, so a
  scheduling pass costs one pass over the live jobs, not one over the ledger;
- each user's and group's GPU-hours in a rolling window (GPU-hour quotas, asked on every scheduling pass): kept
  per window as sums that follow the window's start (ledger.py's _Window), so a pass costs the entries that
  straddle that start, not one pass over every job that ended within the window (a day of short jobs: a million).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GROUP_PREFIX = "group:"  # a group's key among the per-user and per-group totals


@dataclass(frozen=True)
class Usage:
    """Resources used: summed over attempts (peak RSS: the largest of them). Frozen: a job's usage is replaced,
    never changed in place, so that the job notices it must be stored again."""
    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_rss_bytes: int = 0
    started: float = 0.0  # when the first of these attempts began running; 0: none ran

    def __add__(self, other: Usage) -> Usage:
        starts = [s for s in (self.started, other.started) if s]
        return Usage(self.gpu_seconds + other.gpu_seconds, self.cpu_seconds + other.cpu_seconds,
                     max(self.peak_rss_bytes, other.peak_rss_bytes), min(starts) if starts else 0.0)


@dataclass(frozen=True)
class Entry:
    """One job's usage in the ledger; a live job's is made up to the time of a query and not kept."""
    job_id: str
    owner: str
    groups: tuple[str, ...]
    start: float  # when it first ran (0: it never ran)
    end: float    # when it ended
    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_rss_bytes: int = 0
    jobs: int = 1  # the jobs it sums: 1, or those of an hour's entry (ledger.py folds short jobs into one)

    def share_between(self, since: float, until: float) -> float:
        """The fraction of its usage inside [since, until], its usage taken as spread evenly over its run."""
        if self.end <= self.start:
            return 1.0 if since <= self.end <= until else 0.0
        overlap = min(self.end, until) - max(self.start, since)
        return max(0.0, min(1.0, overlap / (self.end - self.start)))


@dataclass
class Totals:
    """What one user or one group used over a window."""
    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_rss_bytes: int = 0
    jobs: int = 0

    def add(self, entry: Entry, share: float) -> None:
        self.gpu_seconds += entry.gpu_seconds * share
        self.cpu_seconds += entry.cpu_seconds * share
        self.peak_rss_bytes = max(self.peak_rss_bytes, entry.peak_rss_bytes)
        self.jobs += entry.jobs


def counted_under(entry: Entry) -> tuple[str, ...]:
    """Where an entry counts: its owner's name, and GROUP_PREFIX + each of its groups, once."""
    return (entry.owner, *(GROUP_PREFIX + g for g in dict.fromkeys(entry.groups)))


def by_user_and_group(totals: dict[str, Totals]) -> tuple[dict[str, Totals], dict[str, Totals]]:
    """Ledger.totals' keys apart: user name -> totals, and group name -> totals."""
    users = {k: t for k, t in totals.items() if not k.startswith(GROUP_PREFIX)}
    groups = {k[len(GROUP_PREFIX):]: t for k, t in totals.items() if k.startswith(GROUP_PREFIX)}
    return users, groups


# ---- a job's usage ---------------------------------------------------------------------------------

def attempt_usage(gpus: int, running_since: float, cpu_seconds: float, peak_rss_bytes: int, now: float) -> Usage:
    """One attempt's usage until now: its GPUs for as long as it has been running (0 since: it never ran)."""
    ran = max(0.0, now - running_since) if running_since else 0.0
    return Usage(gpus * ran, cpu_seconds, peak_rss_bytes, running_since)


def job_usage(job, now: float) -> Usage:
    """The job's ended attempts (Job.usage) and its running ones up to now."""
    usage = job.usage
    for task in job.tasks:
        if task.running_since:
            live = task.seen.live
            usage = usage + attempt_usage(len(task.gpus), task.running_since, live.cpu_seconds,
                                          live.peak_rss_bytes, now)
    return usage


def entry_of(job, now: float) -> Entry:
    """The job as a ledger entry: an ended job's as it ended, a live one's as if it ended now."""
    usage = job_usage(job, now)
    end = job.finished if job.ended and job.finished else now
    return Entry(job.id, job.owner, tuple(job.groups), usage.started, max(end, usage.started), usage.gpu_seconds,
                 usage.cpu_seconds, usage.peak_rss_bytes)


# ---- the ledger ------------------------------------------------------------------------------------

def decayed_gpu_hours(entry: Entry, now: float, half_life: float) -> float:
    """The entry's GPU-hours, each moment's use weighted 0.5 ** ((now - then) / half_life)."""
    return decayed_hours(entry.gpu_seconds, entry.start, entry.end, now, half_life)


def decayed_hours(gpu_seconds: float, start: float, end: float, now: float, half_life: float) -> float:
    """GPU-seconds used evenly from start to end, as decayed GPU-hours at now: the integral of the weight over the
    run, times the even rate. now may precede the end (a weight above 1), which lets sums anchored at one time
    take entries that end after it."""
    if not gpu_seconds:
        return 0.0
    hours = gpu_seconds / 3600.0
    if end <= start:
        return hours * 0.5 ** ((now - end) / half_life)
    weight = 0.5 ** ((now - end) / half_life) - 0.5 ** ((now - start) / half_life)
    return hours / (end - start) * half_life / math.log(2) * weight


def accrued(job, now: float) -> tuple[float, float]:
    """A live job's GPU-seconds so far (its ended attempts' and its running ones' up to now), and when its first
    attempt began running (0: none did). What fair share asks of every live job on every pass: floats only."""
    gpu_seconds, started = job.usage.gpu_seconds, job.usage.started
    for task in job.tasks:
        since = task.running_since
        if since:
            gpu_seconds += len(task.gpus) * max(0.0, now - since)
            started = min(started, since) if started else since
    return gpu_seconds, started
