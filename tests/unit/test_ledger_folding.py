"""The usage ledger folds short jobs into hours (core/model/ledger.py): a sweep of short trials or a stream of tiny
jobs keeps one entry per owner, groups and hour instead of one per job for 90 days, in memory and in the store.
Totals over whole hours, job counts and peak memory stay as they were; the kept sums follow; the store holds the
hours under a kind of their own (a release from before folding ignores them) and a restart reads them back."""

from __future__ import annotations

import json

import pytest

from tfcluster.daemon.coordinator.core.model.accounting import Entry
from tfcluster.daemon.coordinator.core.model.changelog import ChangeLog, UsageDropped, UsageRecorded
from tfcluster.daemon.coordinator.core.model.ledger import (FOLD_MOST, HOUR_SECONDS, Ledger, hour_key,
                                                            is_hour_entry)
from tfcluster.daemon.coordinator.store.api import MemoryStore
from tfcluster.daemon.coordinator.store.documents import from_documents
from tfcluster.daemon.coordinator.store.records import Writer

HOUR, DAY = HOUR_SECONDS, 86400.0
T0 = 1_764_892_800.0  # a whole hour
OWNERS = (("alice", ("vision",)), ("bob", ()), ("carol", ("vision", "nlp")))


def short_jobs(ledger: Ledger, hours: int, every: float = 10.0, start: float = T0) -> float:
    """A short job (5 s) ends every `every` seconds for `hours` hours, the owners in turn, none across the turn of
    an hour; returns the time after."""
    now, number = start + 5.0, 0
    while now < start + hours * HOUR:
        owner, groups = OWNERS[number % len(OWNERS)]
        ledger.record(Entry(f"trial-{number}-abcd", owner, groups, now - 5.0, now, gpu_seconds=5.0,
                            cpu_seconds=2.0 + number % 7, peak_rss_bytes=1000 + number % 13))
        number += 1
        now += every
    return now


def totals(ledger: Ledger, since: float, until: float) -> dict:
    return {k: (pytest.approx(t.gpu_seconds), pytest.approx(t.cpu_seconds), t.peak_rss_bytes, t.jobs)
            for k, t in ledger.totals(since, until).items()}


def fold_all(ledger: Ledger, now: float) -> int:
    """Folds at now until nothing is left to fold (passes back to back); how many were folded."""
    every, ledger.fold_every = ledger.fold_every, 0.0
    folded = 0
    while done := ledger.fold(now):
        folded += done
    ledger.fold_every = every
    return folded


def test_short_jobs_fold_into_hours_and_whole_hours_add_up_as_before():
    ledger = Ledger()
    now = short_jobs(ledger, hours=6)
    ledger.record(Entry("long-1-abcd", "alice", ("vision",), T0, T0 + 3 * HOUR, gpu_seconds=8 * 3 * HOUR))
    before = {span: totals(ledger, *span) for span in ((T0, now), (T0 + HOUR, now), (T0 + 3 * HOUR, now), (0, now))}
    jobs = len(ledger)
    folded = fold_all(ledger, now)
    assert folded == jobs - 1 - 360, "every short job but those of the last hour is folded; the long one is not"
    assert {span: totals(ledger, *span) for span in before} == before
    hours = [e for e in ledger.entries() if is_hour_entry(e.job_id)]
    assert len(hours) == 5 * len(OWNERS) and sum(e.jobs for e in hours) == folded
    assert "long-1-abcd" in ledger and len(ledger) == len(hours) + 1 + 360
    again = fold_all(ledger, now + HOUR)
    assert again == 360 and len([e for e in ledger.entries() if is_hour_entry(e.job_id)]) == 6 * len(OWNERS), \
        "the last hour's jobs join their hours' entries later"
    assert totals(ledger, T0, now) == before[(T0, now)]


def test_a_window_inside_an_hour_pro_rates_that_hour():
    ledger = Ledger()
    now = short_jobs(ledger, hours=3)
    exact = ledger.totals(T0 + HOUR / 2, T0 + 2 * HOUR)["bob"].gpu_seconds
    fold_all(ledger, now + HOUR)
    assert ledger.totals(T0 + HOUR / 2, T0 + 2 * HOUR)["bob"].gpu_seconds == pytest.approx(exact, rel=0.01)


def test_the_kept_sums_follow_folding():
    ledger = Ledger()
    now = short_jobs(ledger, hours=5)
    ledger.decayed(now, 2 * DAY)
    ledger.gpu_seconds_within(3 * HOUR, now)  # both kept from here on
    fold_all(ledger, now)
    fresh = Ledger()
    fresh.load(ledger.entries())
    later = now + 5 * 60
    kept, built = ledger.decayed(later, 2 * DAY), fresh.decayed(later, 2 * DAY)
    assert kept.keys() == built.keys() and all(kept[k] == pytest.approx(built[k]) for k in kept)
    kept, built = ledger.gpu_seconds_within(3 * HOUR, later), fresh.gpu_seconds_within(3 * HOUR, later)
    assert kept.keys() == built.keys() and all(kept[k] == pytest.approx(built[k]) for k in kept)


def test_a_backlog_folds_a_bounded_number_at_a_time():
    ledger = Ledger()
    now = short_jobs(ledger, hours=4, every=1.0)  # 14,400 jobs
    until = now + 120 - HOUR  # by the third pass: the hours that ended an hour ago
    due = sum(1 for e in ledger.entries() if e.end < until - until % HOUR)
    assert ledger.fold(now) == FOLD_MOST and ledger.fold(now + 1) == 0, "one pass every few seconds"
    assert ledger.fold(now + 60) == FOLD_MOST and ledger.fold(now + 120) == due - 2 * FOLD_MOST
    assert ledger.fold(now + 125) == 0


def test_folding_tells_the_store_and_a_restart_reads_the_hours_back():
    changes, store, writer = ChangeLog(), MemoryStore(), Writer()
    ledger = Ledger(changed=lambda entry, recorded: changes.append(
        UsageRecorded(entry) if recorded else UsageDropped(entry.job_id)))

    def write():
        batch = writer.collect(changes)
        writer.written(batch, store.write(list(batch.writes.values())))

    now = short_jobs(ledger, hours=3)
    write()
    fold_all(ledger, now)
    write()
    kinds = {}
    for d in store.load():
        kinds.setdefault(d.kind, []).append(d)
    assert len(kinds["usage"]) == 360, "the last hour's jobs, each its own"
    assert all("jobs" not in json.loads(d.body) for d in kinds["usage"]), "as a release before folding reads them"
    assert sorted(d.key for d in kinds["usage_hour"]) == sorted(
        hour_key(owner, groups, T0 + h * HOUR) for owner, groups in OWNERS for h in range(2))
    restarted = Ledger()
    restarted.load(from_documents(store.load()).usage)
    assert restarted.entries() == ledger.entries()
    assert totals(restarted, 0, now) == totals(ledger, 0, now)
    fold_all(restarted, now + HOUR)  # an hour's entry read back grows on
    assert sum(e.jobs for e in restarted.entries()) == sum(e.jobs for e in ledger.entries())


def test_an_hours_entry_leaves_with_the_horizon():
    ledger = Ledger(keep_seconds=DAY)
    now = short_jobs(ledger, hours=2)
    fold_all(ledger, now + HOUR)
    assert len(ledger) == 2 * len(OWNERS)
    assert len(ledger.prune(T0 + HOUR + DAY + 1)) == len(OWNERS), "the first hour's entries, ended an hour in"
    assert len(ledger.prune(now + 2 * DAY)) == len(OWNERS) and len(ledger) == 0
