"""What each job used, and the usage ledger that outlives job retention. Pure.

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
  per window as sums that follow the window's start (_Window), so a pass costs the entries that straddle that
  start, not one pass over every job that ended within the window (a million of them is a day of short jobs).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

DEFAULT_KEEP_USAGE_SECONDS = 90 * 86400.0
GROUP_PREFIX = "group:"  # a group's key among the per-user and per-group totals
_DECAY_CACHES = 4  # half-lives kept at once: a policy reload may change it; the old one's cache is dropped


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
        self.jobs += 1


def _keys(entry: Entry) -> tuple[str, ...]:
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
    return _decayed_hours(entry.gpu_seconds, entry.start, entry.end, now, half_life)


def _decayed_hours(gpu_seconds: float, start: float, end: float, now: float, half_life: float) -> float:
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


@dataclass
class _Decayed:
    """Every kept entry's decayed GPU-hours per owner, as at `anchor`: the sums at a later time are these times
    0.5 ** ((later - anchor) / half_life), so neither time passing nor a new entry needs a pass over the rest."""
    half_life: float
    anchor: float
    by_owner: dict[str, float] = field(default_factory=dict)

    def move_anchor(self, to: float) -> None:
        """Weights grow as 2 ** ((end - anchor) / half_life) for entries ending after the anchor: moving it
        forward before they get large keeps the sums far from overflow."""
        if to > self.anchor:
            factor = 0.5 ** ((to - self.anchor) / self.half_life)
            self.by_owner = {owner: value * factor for owner, value in self.by_owner.items() if value * factor > 0}
            self.anchor = to

    def add(self, entry: Entry, sign: float = 1.0) -> None:
        if entry.end - self.anchor > self.half_life:
            self.move_anchor(entry.end)
        value = self.by_owner.get(entry.owner, 0.0) + sign * decayed_gpu_hours(entry, self.anchor, self.half_life)
        self.by_owner[entry.owner] = max(0.0, value)  # removing what was added may leave a rounding error below 0

    def at(self, now: float) -> dict[str, float]:
        self.move_anchor(now)
        factor = 0.5 ** ((now - self.anchor) / self.half_life)  # now before the anchor: a clock that stepped back
        return {owner: value * factor for owner, value in self.by_owner.items()}


class _Window:
    """The ledger's GPU-seconds per user and per group in the rolling window [now - seconds, now], pro-rated as
    Ledger.totals does, kept as the window's start (the cutoff) moves on and entries come and go. An entry that
    began at or after the cutoff counts whole, in running sums; one that began before it and ended after it
    straddles the cutoff and is pro-rated when asked: there are no more of those than jobs that ran across that
    moment. Entries without GPU-seconds add nothing and are not kept."""

    def __init__(self, seconds: float, cutoff: float, entries: Iterable[Entry]):
        self.seconds, self.cutoff = seconds, cutoff
        self._inside: dict[str, Entry] = {}  # job id -> entry: began at or after the cutoff
        self._starts: list[tuple[float, str]] = []  # heap of (start, job id) of those, and of some since gone
        self._sums: dict[str, float] = {}  # key -> GPU-seconds of the inside entries
        self._counts: dict[str, int] = {}  # key -> inside entries: at 0 its sum is dropped, rounding errors too
        self._straddling: dict[str, Entry] = {}  # job id -> entry: began before the cutoff, ended at or after it
        for entry in entries:
            self.add(entry)

    def add(self, entry: Entry) -> None:
        if not entry.gpu_seconds or entry.end < self.cutoff:
            return
        if entry.start < self.cutoff:
            self._straddling[entry.job_id] = entry
            return
        self._inside[entry.job_id] = entry
        heapq.heappush(self._starts, (entry.start, entry.job_id))
        self._count(entry, 1)

    def remove(self, entry: Entry) -> None:
        """The entry left the ledger (its heap item goes when it reaches the top)."""
        self._straddling.pop(entry.job_id, None)
        if self._inside.pop(entry.job_id, None) is not None:
            self._count(entry, -1)

    def _count(self, entry: Entry, sign: int) -> None:
        for key in _keys(entry):
            count = self._counts.get(key, 0) + sign
            if count:
                self._counts[key] = count
                self._sums[key] = max(0.0, self._sums.get(key, 0.0) + sign * entry.gpu_seconds)
            else:
                self._counts.pop(key, None)
                self._sums.pop(key, None)

    def move_to(self, cutoff: float) -> bool:
        """The window now starts at cutoff; False when that is before its start (a clock stepped back): the
        caller builds it anew."""
        if cutoff < self.cutoff:
            return False
        self.cutoff = cutoff
        while self._starts and self._starts[0][0] < cutoff:
            _, job_id = heapq.heappop(self._starts)
            entry = self._inside.pop(job_id, None)
            if entry is not None:
                self._count(entry, -1)
                self._straddling[job_id] = entry
        for job_id in [i for i, e in self._straddling.items() if e.end < cutoff]:
            del self._straddling[job_id]
        return True

    def gpu_seconds(self, now: float) -> dict[str, float]:
        """Key -> GPU-seconds of the window that ends at now (move_to its start first)."""
        used = dict(self._sums)
        for entry in self._straddling.values():
            share = entry.share_between(self.cutoff, now)
            for key in _keys(entry):
                used[key] = used.get(key, 0.0) + entry.gpu_seconds * share
        return used


class Ledger:
    """The ended jobs' entries, oldest end first, for keep_seconds after each ended. Its changes go to `changed`
    (the cluster's change log) so the store keeps them: an entry recorded or dropped."""

    def __init__(self, keep_seconds: float = DEFAULT_KEEP_USAGE_SECONDS, changed=None):
        self.keep_seconds = keep_seconds
        self.changed = changed or (lambda entry, recorded: None)
        self._entries: dict[str, Entry] = {}  # job id -> its entry
        # The entries in the order they ended, and their ends: a window's query starts where the window does.
        self._ordered: list[Entry] = []
        self._ends: list[float] = []
        self._decayed: dict[float, _Decayed] = {}  # half-life -> the sums for it
        self._windows: dict[float, _Window] = {}  # a quota's window (seconds) -> the sums for it

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._entries

    def entries(self) -> list[Entry]:
        return list(self._ordered)

    def load(self, entries: Iterable[Entry]) -> None:
        """Entries from the store (already stored: nothing to write)."""
        for entry in sorted(entries, key=lambda e: e.end):
            self._add(entry)
        self._decayed.clear()
        self._windows.clear()

    def _add(self, entry: Entry) -> None:
        self._entries[entry.job_id] = entry
        # A clock stepped back may end a job before the last one recorded: it goes where its end puts it.
        at = bisect.bisect_right(self._ends, entry.end)
        self._ordered.insert(at, entry)
        self._ends.insert(at, entry.end)

    def record(self, entry: Entry) -> None:
        """A job ended: its entry joins the ledger (once)."""
        if entry.job_id in self._entries:
            return
        self._add(entry)
        for sums in self._decayed.values():
            sums.add(entry)
        for window in self._windows.values():
            window.add(entry)
        self.changed(entry, True)

    def prune(self, now: float) -> list[Entry]:
        """Drops the entries of jobs that ended longer than keep_seconds ago; returns them."""
        count = bisect.bisect_left(self._ends, now - self.keep_seconds)
        if not count:
            return []
        dropped = self._ordered[:count]
        del self._ordered[:count], self._ends[:count]
        for entry in dropped:
            del self._entries[entry.job_id]
            for sums in self._decayed.values():
                sums.add(entry, -1.0)
            for window in self._windows.values():
                window.remove(entry)
            self.changed(entry, False)
        return dropped

    # ---- queries -------------------------------------------------------------------------------

    def totals(self, since: float, now: float, live: Iterable[Entry] = ()) -> dict[str, Totals]:
        """Per user (their name) and per group (GROUP_PREFIX + its name), what the jobs used between since and
        now: the ledger's, and the live jobs' (as entries up to now). A job counts once in each of its groups."""
        totals: dict[str, Totals] = {}
        in_window = self._ordered[bisect.bisect_left(self._ends, since):]
        for entry in [*in_window, *live]:
            if entry.end < since or not (entry.start or entry.gpu_seconds or entry.cpu_seconds):
                continue
            share = entry.share_between(since, now)
            for key in _keys(entry):
                totals.setdefault(key, Totals()).add(entry, share)
        return totals

    def decayed(self, now: float, half_life: float, live: Iterable[tuple[str, float, float]] = ()) -> dict[str, float]:
        """Each owner's decayed GPU-hours at now: the ledger's (from sums kept up to date), and the live jobs'
        given as (owner, GPU-seconds so far, first start), each taken as used evenly from its start to now."""
        if half_life <= 0:
            raise ValueError(f"a half-life must be positive, got {half_life}")
        sums = self._decayed.get(half_life)
        if sums is None:
            if len(self._decayed) >= _DECAY_CACHES:
                self._decayed.pop(next(iter(self._decayed)))
            sums = self._decayed[half_life] = _Decayed(half_life, now)
            for entry in self._ordered:
                sums.add(entry)
        result = sums.at(now)
        for owner, gpu_seconds, started in live:
            if gpu_seconds:
                result[owner] = result.get(owner, 0.0) + _decayed_hours(gpu_seconds, started, now, now, half_life)
        return result

    def gpu_seconds_within(self, seconds: float, now: float, live: Iterable[Entry] = ()) -> dict[str, float]:
        """Per user and per group (keys as in totals), the GPU-seconds used in the window [now - seconds, now]:
        the ledger's (from sums kept for that window) and the live jobs' (as entries up to now)."""
        if self._ends and self._ends[-1] > now:  # a clock stepped back: entries end after now, each pro-rated
            return {key: t.gpu_seconds for key, t in self.totals(now - seconds, now, live).items()}
        window = self._windows.get(seconds)
        if window is None or not window.move_to(now - seconds):
            if window is None and len(self._windows) >= _DECAY_CACHES:
                self._windows.pop(next(iter(self._windows)))
            start = bisect.bisect_left(self._ends, now - seconds)
            window = self._windows[seconds] = _Window(seconds, now - seconds, self._ordered[start:])
        used = window.gpu_seconds(now)
        for entry in live:
            if entry.gpu_seconds and entry.end >= now - seconds:
                share = entry.share_between(now - seconds, now)
                for key in _keys(entry):
                    used[key] = used.get(key, 0.0) + entry.gpu_seconds * share
        return used
