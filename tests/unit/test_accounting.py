"""Accounting: a job's usage over its attempts, the usage ledger, its windows, fair share's decayed GPU-hours,
the ledger's horizon, and the ledger kept by the store. Pure: a Cluster driven with fake time."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import pytest
from coresim import Sim, info, make_spec

from tfcluster.daemon.coordinator.core.cluster import Cluster
from tfcluster.daemon.coordinator.core.model.accounting import Entry, Usage, decayed_gpu_hours
from tfcluster.daemon.coordinator.core.model.ledger import Ledger
from tfcluster.daemon.coordinator.store.api import MemoryStore, Put
from tfcluster.daemon.coordinator.store.persistence import Persistence
from tfcluster.daemon.coordinator.store.documents import from_documents
from tfcluster.daemon.coordinator.store.records import Writer
from tfcluster.states import JobState

HOUR, DAY = 3600.0, 86400.0


def submit(sim: Sim, owner: str, groups=(), workers=2, gpus=1, name="job"):
    """A multi-worker job of `workers` tasks with `gpus` GPUs each, placed and launched; all its tasks RUNNING."""
    spec = replace(make_spec(gpus=gpus, worker=workers), name=name)
    job, actions = sim.c.submit(spec, sim.now, owner=owner, groups=tuple(groups))
    assert sim.running(job, actions) == []
    assert all(t.state == "RUNNING" for t in job.tasks)
    return job


def finish(sim: Sim, job, **exit_figures):
    for task in job.tasks:
        sim.exit(job, task.key, 0, **exit_figures)
    assert job.state == JobState.SUCCEEDED


def four_gpus():
    return Sim(info("n1", 2), info("n2", 2))


# ---- a job's usage --------------------------------------------------------------------------------

def test_gpu_seconds_are_gpus_times_the_time_running_and_cpu_and_memory_come_from_the_exits():
    sim = four_gpus()
    job = submit(sim, "alice", workers=2, gpus=2)
    sim.now += 100
    assert sim.c.usage_totals(0, sim.now)["alice"].gpu_seconds == pytest.approx(400)  # running: up to now
    finish(sim, job, cpu_seconds=30.5, peak_rss_bytes=2 << 30)
    assert job.usage == Usage(gpu_seconds=400, cpu_seconds=61, peak_rss_bytes=2 << 30, started=100)
    sim.now += 1000  # an ended job uses no more
    entry = sim.c.usage.entries()[0]
    assert (entry.owner, entry.start, entry.end, entry.gpu_seconds) == ("alice", 100, 200, 400)


def test_every_attempt_counts_and_the_time_between_attempts_does_not():
    sim = Sim(info("n1", 1))
    spec = make_spec(strategy="mirrored", gpus=1, worker=1, restart={"max_restarts": 3, "backoff_seconds": 0})
    job, actions = sim.c.submit(spec, sim.now, owner="bob")
    sim.running(job, actions)
    sim.now += 50
    actions = sim.exit(job, "worker:0", 1, cpu_seconds=10.0, peak_rss_bytes=100)
    assert job.restarts == 1 and job.usage.gpu_seconds == 50
    sim.now += 30  # not running: not counted
    sim.heartbeat_all()
    actions += sim.c.tick(sim.now)
    assert sim.running(job, actions) == [] and job.task("worker", 0).attempt == 2
    sim.now += 20
    assert sim.c.gpu_hours_since(0, sim.now)["bob"] * HOUR == pytest.approx(70)
    finish(sim, job, cpu_seconds=5.0, peak_rss_bytes=300)
    assert (job.usage.gpu_seconds, job.usage.cpu_seconds, job.usage.peak_rss_bytes) == (70, 15, 300)


def test_a_lost_task_counts_until_it_was_found_lost():
    sim = Sim(info("n1", 1), info("n2", 1))
    job = submit(sim, "carol", workers=1, gpus=1)
    node = job.task("worker", 0).node
    sim.now += 40
    sim.c.remove_node(node, sim.now)
    assert job.usage.gpu_seconds == 40 and job.task("worker", 0).running_since == 0


def test_heartbeat_figures_of_a_running_attempt_count_until_its_exit_replaces_them():
    sim = Sim(info("n1", 1))
    job = submit(sim, "dan", workers=1, gpus=1)
    task = job.task("worker", 0)
    task.seen.live = Usage(cpu_seconds=12.0, peak_rss_bytes=5000)
    sim.now += 10
    live = sim.c.usage_totals(0, sim.now)["dan"]
    assert (live.gpu_seconds, live.cpu_seconds, live.peak_rss_bytes) == (10, 12, 5000)
    finish(sim, job, cpu_seconds=13.0, peak_rss_bytes=4000)
    assert (job.usage.cpu_seconds, job.usage.peak_rss_bytes) == (13, 5000)


# ---- totals per user and group over a window ------------------------------------------------------

def test_totals_per_user_and_per_group_over_a_window():
    sim = four_gpus()
    a = submit(sim, "alice", groups=("vision", "nlp"), workers=1, gpus=1, name="a")
    b = submit(sim, "bob", groups=("vision",), workers=1, gpus=2, name="b")
    sim.now += HOUR
    finish(sim, a, cpu_seconds=HOUR)
    sim.now += HOUR  # b runs on: counted up to now
    totals = sim.c.usage_totals(0, sim.now)
    assert totals["alice"].gpu_seconds == HOUR and totals["alice"].cpu_seconds == HOUR
    assert totals["bob"].gpu_seconds == 4 * HOUR and totals["bob"].jobs == 1
    assert totals["group:vision"].gpu_seconds == 5 * HOUR and totals["group:vision"].jobs == 2
    assert totals["group:nlp"].gpu_seconds == HOUR
    # The last hour: alice's job ended at its start; bob's ran through it (half of his two hours).
    hours = sim.c.gpu_hours_since(sim.now - HOUR, sim.now)
    assert hours == {"alice": 0.0, "bob": pytest.approx(2.0), "group:vision": pytest.approx(2.0),
                     "group:nlp": 0.0}
    assert b.state == JobState.RUNNING


def test_a_window_takes_the_part_of_each_run_inside_it():
    e = Entry("j", "u", (), start=0, end=100, gpu_seconds=1000)
    assert e.share_between(50, 1000) == 0.5 and e.share_between(0, 100) == 1 and e.share_between(200, 300) == 0
    instant = Entry("k", "u", (), start=10, end=10, gpu_seconds=5)
    assert instant.share_between(0, 20) == 1 and instant.share_between(11, 20) == 0


# ---- fair share -----------------------------------------------------------------------------------

def test_decay_halves_usage_each_half_life():
    ledger = Ledger()
    ledger.record(Entry("j1", "alice", (), start=0, end=0, gpu_seconds=8 * HOUR))
    assert ledger.decayed(0, DAY) == {"alice": pytest.approx(8)}
    assert ledger.decayed(DAY, DAY) == {"alice": pytest.approx(4)}
    assert ledger.decayed(3 * DAY, DAY) == {"alice": pytest.approx(1)}
    assert ledger.decayed(3 * DAY, 3 * DAY) == {"alice": pytest.approx(4)}


def test_usage_spread_over_a_run_decays_from_when_it_was_used():
    # One GPU-hour per hour for a day: the integral of the weights, not the whole day's usage at its end.
    run = Entry("j", "u", (), start=0, end=DAY, gpu_seconds=24 * HOUR)
    h = DAY
    expected = 24 / DAY * h / math.log(2) * (1 - 0.5)
    assert decayed_gpu_hours(run, DAY, h) == pytest.approx(expected)
    assert 12 < decayed_gpu_hours(run, DAY, h) < 24


def test_fair_share_counts_running_jobs_up_to_now_and_orders_heavy_users_last():
    sim = four_gpus()
    submit(sim, "alice", workers=1, gpus=2, name="big")
    small = submit(sim, "bob", workers=1, gpus=1, name="small")
    sim.now += 2 * HOUR
    finish(sim, small)
    sim.now += HOUR
    share = sim.c.fair_share(sim.now, half_life=7 * DAY)
    assert 6 * 0.99 < share["alice"] < 6 and 2 * 0.99 < share["bob"] < 2
    assert sorted(share, key=share.get) == ["bob", "alice"]


def test_the_decayed_sums_kept_per_half_life_match_a_pass_over_the_ledger():
    ledger = Ledger()
    t = 1.7e9  # epoch times: the anchored sums must neither overflow nor lose the figures
    for i in range(300):
        ledger.record(Entry(f"j{i}", f"user{i % 7}", (), start=t + i * HOUR, end=t + i * HOUR + 1800,
                            gpu_seconds=(i % 5 + 1) * 1800))
        if i % 50 == 0:
            ledger.decayed(t + i * HOUR + 1800, 2 * DAY)  # queries between records move the anchor
    now = t + 300 * HOUR
    kept = ledger.decayed(now, 2 * DAY)
    for owner, value in kept.items():
        direct = sum(decayed_gpu_hours(e, now, 2 * DAY) for e in ledger.entries() if e.owner == owner)
        assert value == pytest.approx(direct, rel=1e-9)
    assert ledger.prune(now) == []  # within the default horizon
    ledger.keep_seconds = 100 * HOUR
    assert len(ledger.prune(now)) == 300 - 100
    for owner, value in ledger.decayed(now, 2 * DAY).items():
        direct = sum(decayed_gpu_hours(e, now, 2 * DAY) for e in ledger.entries() if e.owner == owner)
        assert value == pytest.approx(direct, rel=1e-6, abs=1e-12)


def test_a_half_life_must_be_positive():
    with pytest.raises(ValueError, match="half-life"):
        Ledger().decayed(0, 0)


def test_fair_share_is_cheap_with_thousands_of_entries():
    cluster = Cluster()
    cluster.usage.load(Entry(f"j{i}", f"user{i % 50}", ("g",), start=i * 60.0, end=i * 60.0 + 3000,
                             gpu_seconds=3000.0 * (i % 8)) for i in range(20000))
    now = 20000 * 60.0 + 5000
    cluster.fair_share(now, 7 * DAY)  # the first call for a half-life makes its sums
    started = time.perf_counter()
    for i in range(1000):
        cluster.fair_share(now + i, 7 * DAY)
    per_call = (time.perf_counter() - started) / 1000
    assert per_call < 2e-3, f"{per_call * 1e6:.0f} µs per call"  # a pass over the ledger takes 30 ms or more


# ---- the ledger's horizon and the store ------------------------------------------------------------

def test_the_ledger_outlives_job_retention_and_keeps_its_horizon():
    sim = Sim(info("n1", 1))
    sim.c = Cluster(keep_finished_jobs=0, keep_finished_seconds=0, keep_usage_seconds=10 * DAY)
    sim.c.register(info("n1", 1), [], "s", sim.now)
    job = submit(sim, "erin", workers=1, gpus=1)
    sim.now += HOUR
    finish(sim, job)
    sim.c.tick(sim.now + 1)
    assert job.id not in sim.c.jobs and job.id in sim.c.usage  # the job is gone, its usage stays
    assert sim.c.gpu_hours_since(0, sim.now + DAY) == {"erin": pytest.approx(1.0)}
    sim.c.tick(sim.now + 10 * DAY + 1)
    assert len(sim.c.usage) == 0 and sim.c.gpu_hours_since(0, sim.now + 11 * DAY) == {}


def test_the_ledger_is_stored_and_read_back_and_dropped_entries_leave_the_store():
    store, writer = MemoryStore(), Writer()
    sim = four_gpus()
    sim.c.usage.keep_seconds = DAY

    def write():
        batch = writer.collect(sim.c.changes)
        writer.written(batch, store.write(list(batch.writes.values())))

    old = submit(sim, "alice", groups=("vision",), workers=1, gpus=1, name="old")
    sim.now += HOUR
    finish(sim, old, cpu_seconds=7.0, peak_rss_bytes=99)
    live = submit(sim, "bob", workers=1, gpus=2, name="live")
    sim.now += HOUR
    write()
    state = from_documents(store.load())
    assert state.usage == sim.c.usage.entries()
    assert state.usage[0] == Entry(old.id, "alice", ("vision",), 100.0, 100.0 + HOUR, HOUR, 7.0, 99)
    assert next(j for j in state.jobs if j.id == old.id).usage == old.usage == Usage(HOUR, 7.0, 99, 100.0)
    loaded = next(j for j in state.jobs if j.id == live.id)
    assert loaded.task("worker", 0).running_since == 100.0 + HOUR  # a restarted coordinator counts on from there
    restarted = Cluster()
    for job in state.jobs:
        restarted.add_job(job)
    restarted.usage.load(state.usage)
    assert restarted.gpu_hours_since(0, sim.now) == sim.c.gpu_hours_since(0, sim.now)
    sim.c.tick(sim.now + 2 * DAY)
    write()
    assert [d.key for d in store.load() if d.kind == "usage"] == []


def test_a_coordinator_loading_the_store_has_the_ledger_and_counts_running_tasks_on():
    store, writer = MemoryStore(), Writer()
    sim = four_gpus()
    done = submit(sim, "alice", workers=1, gpus=1, name="done")
    running = submit(sim, "bob", workers=1, gpus=1, name="running")
    sim.now += HOUR
    finish(sim, done)
    batch = writer.collect(sim.c.changes)
    writer.written(batch, store.write(list(batch.writes.values())))
    # A task saved by a release that kept no usage: no running_since in its document.
    stripped = [Put(d.kind, d.key, json.dumps({k: v for k, v in json.loads(d.body).items() if k != "running_since"}),
                    d.revision) for d in store.load() if d.kind == "task" and d.key.startswith(running.id)]
    store.write(stripped)
    restarted = Cluster()
    persistence = Persistence(store, restarted, lambda commands: None)
    try:
        persistence.load(sim.now + 10, reconnect_grace=0)
    finally:
        persistence.thread.shutdown()
    assert restarted.usage.entries() == sim.c.usage.entries()
    assert restarted.jobs[running.id].task("worker", 0).running_since == sim.now + 10
    assert restarted.gpu_hours_since(0, sim.now + 10 + HOUR) == {"alice": pytest.approx(1), "bob": pytest.approx(1)}


def _window_by_scan(ledger: Ledger, seconds: float, now: float) -> dict[str, float]:
    """A quota window's GPU-seconds as a pass over every entry in it finds them (Ledger.totals)."""
    return {k: t.gpu_seconds for k, t in ledger.totals(now - seconds, now).items() if t.gpu_seconds}


@pytest.mark.parametrize("seed", range(3))
def test_a_quota_windows_kept_sums_match_a_pass_over_every_entry(seed):
    """GPU-hour quotas are asked on every scheduling pass: their windows' sums follow the window as time passes,
    jobs end (short and long ones, some straddling the window's start), short ones are folded into hours and the
    horizon drops old entries, and
    agree with a scan of the whole window each time; a clock stepped back builds them anew."""
    import random
    rng = random.Random(seed)
    ledger = Ledger(keep_seconds=3 * DAY)
    ledger.fold_every = 0.0
    now, number = 1_000_000.0, 0
    for step in range(600):
        now += rng.choice((1.0, 30.0, 600.0, HOUR))
        if rng.random() < 0.02:
            now -= rng.choice((5.0, HOUR))  # a clock stepped back
        for _ in range(rng.randint(0, 4)):
            number += 1
            ran = rng.choice((0.0, 2.0, 60.0, HOUR, 2 * DAY))
            groups = tuple(rng.sample(("vision", "nlp", "infra"), rng.randint(0, 2)))
            ledger.record(Entry(f"job-{number}", rng.choice(("alice", "bob", "carol")), groups, now - ran, now,
                                gpu_seconds=rng.choice((0.0, ran or 1.0, 8 * ran)), cpu_seconds=1.0))
        ledger.prune(now)
        ledger.fold(now)  # short jobs ended an hour ago join their hours' entries
        for seconds in (HOUR, DAY, 2 * DAY):
            kept = {k: v for k, v in ledger.gpu_seconds_within(seconds, now).items() if v}
            scanned = _window_by_scan(ledger, seconds, now)
            assert kept.keys() == scanned.keys(), (step, seconds)
            assert all(kept[k] == pytest.approx(scanned[k], rel=1e-9, abs=1e-3) for k in kept), (step, seconds)


def test_a_quota_window_counts_a_running_job_up_to_now():
    ledger = Ledger()
    ledger.record(Entry("done-1", "alice", ("vision",), 0.0, HOUR, gpu_seconds=2 * HOUR))
    running = Entry("live-2", "alice", (), 2 * HOUR, 4 * HOUR, gpu_seconds=4 * HOUR)  # as of now, 4 h
    used = ledger.gpu_seconds_within(3 * HOUR, 4 * HOUR, live=[running])
    assert used == {"alice": pytest.approx(4 * HOUR), "group:vision": 0.0}
