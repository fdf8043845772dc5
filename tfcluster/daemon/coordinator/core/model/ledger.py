"""The usage ledger: one entry per ended job, kept for --keep-usage-for whatever retention does with the job, and
the sums kept over it for what every scheduling pass asks (fair share's decayed GPU-hours, each quota's window).
Pure. What an entry holds, and a job's usage, are accounting.py.

Short jobs are folded: the entry of a job that ran for at most FOLD_RUN_SECONDS joins its owner's (and groups')
entry for the hour it ended in, which counts its jobs, once that hour closed FOLD_AFTER_SECONDS ago. A sweep of
short trials, or tiny jobs at a hundred a second, would otherwise keep one entry per job for 90 days, in memory
and in the store (9 million a day at a hundred a second: past etcd's default quota of 2 GB within a day). What
folding changes:
a folded job's usage counts as spread over the hour it ended in rather than over its own run, so a window that
starts or ends inside that hour pro-rates it by the hour; totals over whole hours, job counts and peak memory
are unchanged.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from tfcluster.daemon.coordinator.core.model.accounting import (Entry, Totals, counted_under, decayed_gpu_hours,
                                                                 decayed_hours)

DEFAULT_KEEP_USAGE_SECONDS = 90 * 86400.0
_DECAY_CACHES = 4  # half-lives kept at once: a policy reload may change it; the old one's cache is dropped
HOUR_SECONDS = 3600.0
FOLD_AFTER_SECONDS = 3600.0  # an hour is folded once it ended this long ago: the last hour or two stay exact
FOLD_RUN_SECONDS = 3600.0    # a job that ran longer keeps its own entry (such jobs are few: they hold resources)
FOLD_EVERY_SECONDS = 10.0
FOLD_MOST = 5_000            # entries folded in one pass at most: a large backlog goes in many small writes
HOUR_KEY_PREFIX = "hour/"    # an hour's entry's key (Entry.job_id); a job id never holds a "/"


def hour_key(owner: str, groups: tuple[str, ...], hour: float) -> str:
    """The key of the entry that sums the owner's short jobs (with these groups) that ended in the hour."""
    who = hashlib.sha256(json.dumps([owner, list(groups)]).encode()).hexdigest()[:16]
    return f"{HOUR_KEY_PREFIX}{int(hour)}/{who}"


def is_hour_entry(key: str) -> bool:
    return key.startswith(HOUR_KEY_PREFIX)


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
        for key in counted_under(entry):
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
        _add_gpu_seconds(used, self._straddling.values(), self.cutoff, now)
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
        self._folded_through = 0.0  # the entries that ended before this were looked at for folding
        self._folded_at = float("-inf")
        self.fold_every = FOLD_EVERY_SECONDS

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

    def fold(self, now: float) -> int:
        """Folds the entries of short jobs into their hours' entries, an hour once it ended FOLD_AFTER_SECONDS ago
        (at most FOLD_MOST entries a pass, a pass every fold_every seconds); returns how many were folded. The
        store is told of each entry dropped and each hour's entry recorded; the kept sums follow."""
        if now - self._folded_at < self.fold_every:
            return 0
        self._folded_at = now
        first = looked = bisect.bisect_left(self._ends, self._folded_through)
        until = now - FOLD_AFTER_SECONDS
        last, folding, kept = bisect.bisect_left(self._ends, until - until % HOUR_SECONDS), [], []
        while looked < last and len(folding) < FOLD_MOST:
            entry = self._ordered[looked]
            short = entry.jobs == 1 and not is_hour_entry(entry.job_id) and entry.end - entry.start <= FOLD_RUN_SECONDS
            (folding if short else kept).append(entry)
            looked += 1
        if looked > first:  # the next pass starts there (entries ending at that very time are looked at again)
            self._folded_through = self._ends[looked - 1]
        if not folding:
            return 0
        hours: dict[str, list[Entry]] = {}
        for entry in folding:
            hour = entry.end - entry.end % HOUR_SECONDS
            hours.setdefault(hour_key(entry.owner, tuple(entry.groups), hour), []).append(entry)
        replaced = [self._entries[key] for key in hours if key in self._entries]
        summed = [_summed(key, entries, self._entries.get(key)) for key, entries in hours.items()]
        # The entries looked at are side by side in the ordered lists: what stays of them goes back in one slice.
        self._ordered[first:looked], self._ends[first:looked] = kept, [e.end for e in kept]
        self._replace(folding, replaced, summed)
        for entry in folding:
            self.changed(entry, False)
        for entry in summed:
            self.changed(entry, True)
        return len(folding)

    def _replace(self, folded: list[Entry], replaced: list[Entry], summed: list[Entry]) -> None:
        """The entries folded are out of the ordered lists already; the hours' entries replaced leave them and
        those summed join them (a few: one per owner, groups and hour); the index and the kept sums follow."""
        for entry in replaced:
            at = bisect.bisect_left(self._ends, entry.end)
            while self._ordered[at] is not entry:
                at += 1
            del self._ordered[at], self._ends[at]
        for entry in summed:
            at = bisect.bisect_right(self._ends, entry.end)
            self._ordered.insert(at, entry)
            self._ends.insert(at, entry.end)
        for entry in (*folded, *replaced):
            del self._entries[entry.job_id]
        for entry in summed:
            self._entries[entry.job_id] = entry
        for sign, entries in ((-1.0, (*folded, *replaced)), (1.0, summed)):
            for entry in entries:
                for sums in self._decayed.values():
                    sums.add(entry, sign)
                for window in self._windows.values():
                    (window.add if sign > 0 else window.remove)(entry)

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
            if not share:  # it ran before the window only (it ended as the window began)
                continue
            for key in counted_under(entry):
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
                result[owner] = result.get(owner, 0.0) + decayed_hours(gpu_seconds, started, now, now, half_life)
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
        _add_gpu_seconds(used, live, now - seconds, now)
        return used


def _add_gpu_seconds(used: dict[str, float], entries: Iterable[Entry], since: float, now: float) -> None:
    """Adds to used each entry's GPU-seconds inside [since, now], under its owner and groups."""
    for entry in entries:
        if entry.gpu_seconds and entry.end >= since:
            share = entry.share_between(since, now)
            for key in counted_under(entry):
                used[key] = used.get(key, 0.0) + entry.gpu_seconds * share


def _summed(key: str, entries: list[Entry], kept: Entry | None) -> Entry:
    """The hour's entry: what it summed already (kept), and the entries folded into it now."""
    everything = entries + ([kept] if kept is not None else [])
    hour = float(key.split("/")[1])
    return Entry(key, entries[0].owner, tuple(entries[0].groups), hour, hour + HOUR_SECONDS,
                 sum(e.gpu_seconds for e in everything), sum(e.cpu_seconds for e in everything),
                 max(e.peak_rss_bytes for e in everything), sum(e.jobs for e in everything))
