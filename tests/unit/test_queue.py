"""The queue in the pure core, with fake time: order (class, fair share, age), quotas with their reasons, and
capacity held for the head of a class so that small jobs backfill around it instead of starving it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from coresim import Sim, info, make_spec

from tfcluster import wire
from tfcluster.daemon.coordinator.core.cluster import Unplaceable
from tfcluster.daemon.coordinator.core.model.job import Job
from tfcluster.daemon.coordinator.core.scheduling import queue
from tfcluster.daemon.coordinator.core.scheduling.policy import ClassRefused, parse
from tfcluster.daemon.coordinator.store.records import Writer
from tfcluster.states import JobState

CLASSES = """
defaults = { class = "normal", max_class = "high", fair_share_half_life = "1d" }
[classes.high]
value = 100
preemptible = false
[classes.normal]
value = 50
[classes.low]
value = 10
"""


def sim_with(policy: str, *nodes) -> Sim:
    sim = Sim(*nodes)
    sim.c.set_policy(parse(CLASSES + policy, "policy.toml", sim.now))
    return sim


def submit(sim, owner, gpus=1, priority="", groups=(), name="j"):
    spec = replace(make_spec(strategy="mirrored", gpus=gpus, worker=1, name=name), priority=priority)
    job, actions = sim.c.submit(spec, sim.now, owner=owner, groups=groups)
    sim.running(job, actions)
    return job


def finish(sim, job):
    sim.exit(job, "worker:0", 0)
    assert job.state == JobState.SUCCEEDED


def test_order_is_class_then_fair_share_then_age():
    def job(number, owner, rank):
        return Job(id=f"j-{number}", spec=make_spec(worker=1), number=number, owner=owner, rank=rank)
    jobs = [job(1, "alice", 50), job(2, "bob", 50), job(3, "alice", 100), job(4, "carol", 50), job(5, "bob", 10)]
    shares = {"alice": 30.0, "bob": 2.0}  # carol has used nothing
    assert [j.number for j in queue.order(jobs, shares)] == [3, 4, 2, 1, 5]
    assert [j.number for j in queue.order(jobs, {})] == [3, 1, 2, 4, 5]  # no usage: age within a class


def test_a_higher_class_is_placed_first_when_capacity_frees():
    sim = sim_with("", info("n1", 1))
    running = submit(sim, "alice", priority="high")  # of the highest class: nobody may preempt it
    low = submit(sim, "bob", priority="low")
    high = submit(sim, "carol", priority="high")
    assert (high.priority, high.rank, high.preemptible) == ("high", 100, False)
    assert (low.priority, low.rank, low.preemptible) == ("low", 10, True)
    assert [j.id for j in sim.c.queue_order(sim.now)] == [high.id, low.id]
    finish(sim, running)
    assert high.state == JobState.STARTING and low.state == JobState.PENDING


def test_fair_share_puts_the_owner_who_used_less_first():
    sim = sim_with("", info("n1", 2))
    first = submit(sim, "alice", gpus=2)
    sim.now += 3 * 3600  # alice has used 6 GPU-hours
    alice_again, bob = submit(sim, "alice"), submit(sim, "bob")
    usage = sim.c.queue_usage(sim.now)
    assert 5.5 < usage.shares["alice"] < 6  # decayed a little
    assert "bob" not in usage.shares
    assert [j.id for j in sim.c.queue_order(sim.now)] == [bob.id, alice_again.id]
    finish(sim, first)
    assert bob.state == JobState.STARTING


def test_a_third_job_waits_for_the_gpu_quota_with_its_reason():
    sim = sim_with("[users.alice]\ngpus = 2\n", info("n1", 8))
    one, two, three = submit(sim, "alice"), submit(sim, "alice"), submit(sim, "alice")
    assert (one.state, two.state, three.state) == (JobState.RUNNING, JobState.RUNNING, JobState.PENDING)
    assert three.message == "waiting: alice's quota of 2 GPUs is in use (2 running + 1 asked)"
    other = submit(sim, "bob")  # someone else's job is not held back by alice's quota
    assert other.state == JobState.RUNNING
    finish(sim, one)
    assert three.state == JobState.STARTING


def test_a_group_quota_is_shared_by_its_members():
    sim = sim_with("[groups.vision]\ngpus = 4\n", info("n1", 8))
    submit(sim, "alice", gpus=3, groups=("vision",))
    waiting = submit(sim, "bob", gpus=2, groups=("vision",))
    assert waiting.message == "waiting: group vision's quota of 4 GPUs is in use (3 running + 2 asked)"


def test_running_jobs_quota():
    sim = sim_with("[users.alice]\nrunning_jobs = 1\n", info("n1", 8))
    first, second = submit(sim, "alice", gpus=0), submit(sim, "alice", gpus=0)
    assert second.state == JobState.PENDING
    assert second.message == "waiting: alice's quota of 1 running job is in use (1 running)"
    finish(sim, first)
    assert second.state == JobState.STARTING


def test_gpu_hours_quota_over_a_rolling_window():
    sim = sim_with("[users.alice]\ngpu_hours = 4\nwindow = \"1d\"\n", info("n1", 2))
    first = submit(sim, "alice", gpus=2)
    sim.now += 3 * 3600
    finish(sim, first)  # 6 GPU-hours within the window
    later = submit(sim, "alice")
    assert later.state == JobState.PENDING
    assert later.message == "waiting: alice's quota of 4 GPU-hours per 1d is used up (6.0 used)"
    sim.now += 86400 - 1800  # half an hour of those 6 is still within the window
    sim.heartbeat_all()
    sim.c.tick(sim.now)
    assert later.state == JobState.STARTING


def test_a_job_that_can_never_fit_its_quota_or_asks_for_a_class_above_its_owners_is_refused():
    sim = sim_with("[users.alice]\ngpus = 2\nmax_class = \"normal\"\n", info("n1", 8))
    with pytest.raises(Unplaceable, match="it asks for 4 GPUs, more than alice's quota of 2"):
        submit(sim, "alice", gpus=4)
    with pytest.raises(ClassRefused, match="'high' is above alice's highest class, 'normal'"):
        submit(sim, "alice", priority="high")
    with pytest.raises(ClassRefused, match="'urgent' is not a priority class"):
        submit(sim, "bob", priority="urgent")
    unowned = submit(sim, "")  # an insecure cluster's submitter: the defaults
    assert (unowned.priority, unowned.rank) == ("normal", 50)


def test_a_large_job_at_the_head_is_not_starved_by_a_stream_of_small_ones():
    sim = sim_with("", info("n1", 4))
    small = [submit(sim, "bob"), submit(sim, "bob")]
    big = submit(sim, "alice", gpus=4)
    assert big.state == JobState.PENDING
    # Small jobs keep coming; each would fit in a free GPU, but those are held for the big job.
    for _ in range(3):
        newcomer = submit(sim, "carol")
        assert newcomer.state == JobState.PENDING
        assert newcomer.message == f"waiting: what is free is held for {big.id}, ahead of it in the queue"
    finish(sim, small[0])
    assert big.state == JobState.PENDING
    finish(sim, small[1])
    assert big.state == JobState.STARTING


def test_small_jobs_backfill_where_they_do_not_use_what_the_head_waits_for():
    sim = sim_with("", info("n1", 4), info("n2", 4), info("n3", 2))
    on_n1 = submit(sim, "bob", gpus=4)
    on_n2 = submit(sim, "bob", gpus=2)
    assert (on_n1.tasks[0].node, on_n2.tasks[0].node) == ("n1", "n2")
    big = submit(sim, "alice", gpus=4)  # waits; it holds n2, where GPUs are free now (n3 is too small)
    hold = sim.c.holds[big.id]
    assert set(hold.gpus) == {"n2"} and len(hold.gpus["n2"]) == 4
    backfill = [submit(sim, "carol"), submit(sim, "carol")]  # n3 is not what the big job waits for
    assert [(j.state, j.tasks[0].node) for j in backfill] == [(JobState.RUNNING, "n3")] * 2
    third = submit(sim, "carol")  # n2's free GPUs are held
    assert third.state == JobState.PENDING and third.message.startswith("waiting: what is free is held for")
    finish(sim, on_n2)
    assert big.state == JobState.STARTING and big.tasks[0].node == "n2"


def test_a_lower_class_head_does_not_hold_back_a_higher_one():
    sim = sim_with("", info("n1", 2))
    running = submit(sim, "bob", gpus=1)
    low_big = submit(sim, "bob", gpus=2, priority="low")
    high_small = submit(sim, "alice", gpus=1, priority="high")
    assert low_big.state == JobState.PENDING and high_small.state == JobState.RUNNING
    finish(sim, running)
    assert low_big.state == JobState.PENDING  # the high job still runs
    finish(sim, high_small)
    assert low_big.state == JobState.STARTING


def test_a_reloaded_policy_applies_to_waiting_jobs_at_once():
    sim = sim_with("[users.alice]\ngpus = 1\n", info("n1", 4))
    submit(sim, "alice")
    waiting = submit(sim, "alice")
    assert waiting.state == JobState.PENDING
    sim.c.set_policy(parse(CLASSES + "[users.alice]\ngpus = 4\n", "policy.toml", sim.now))
    sim.c.schedule(sim.now)
    assert waiting.state == JobState.STARTING


def test_metrics_count_the_queue_by_class_and_the_wait_until_a_job_first_runs():
    from prometheus_client.exposition import generate_latest

    from tfcluster.daemon.coordinator.web.metrics import CoordinatorMetrics

    sim = sim_with("", info("n1", 1))
    metrics = CoordinatorMetrics(sim.c, clock=lambda: sim.now)
    sim.c.observer = metrics
    first = submit(sim, "alice")
    submit(sim, "bob", priority="low")
    submit(sim, "bob", priority="low")
    sim.now += 90
    finish(sim, first)
    waiting = [j for j in sim.c.jobs.live.values() if j.state == JobState.STARTING][0]
    for t in waiting.tasks:  # launched when the first job ended: now it runs, 90 s after it was submitted
        sim.report(waiting, t.type, t.index, "RUNNING")
    text = generate_latest(metrics.registry).decode()
    assert 'tfcluster_queue_jobs{priority="low"} 1.0' in text and 'tfcluster_queue_jobs{priority="high"} 0.0' in text
    assert 'tfcluster_job_queue_wait_seconds_count{priority="normal"} 1.0' in text
    assert 'tfcluster_job_queue_wait_seconds_bucket{le="60.0",priority="low"} 0.0' in text
    assert 'tfcluster_job_queue_wait_seconds_bucket{le="300.0",priority="low"} 1.0' in text


def test_the_queue_shows_the_schedulers_reasons_and_nothing_a_job_printed():
    from tfcluster.wire import queued_job

    sim = sim_with("[users.alice]\ngpus = 1\n", info("n1", 2))
    submit(sim, "alice")
    held = submit(sim, "alice", gpus=1, name="held")
    entry = queued_job(held, 1, sim.now + 5)
    assert (entry.position, entry.id, entry.owner, entry.priority, entry.rank, entry.tasks, entry.gpus) == \
        (1, held.id, "alice", "normal", 50, 1, 1)
    assert entry.reason == "waiting: alice's quota of 1 GPU is in use (1 running + 1 asked)"
    assert entry.waiting_since == held.created
    held.message = "worker:0 exited with code 1: Traceback ... secret"  # as a restarted job's message may say
    held.not_before = sim.now + 30
    assert queued_job(held, 1, sim.now).reason == "restarting: not placed again for 30 s (backoff)"
    held.not_before = 0.0
    assert queued_job(held, 1, sim.now).reason == "waiting to be placed"


def test_a_long_queue_of_look_alike_jobs_costs_one_search_a_pass(monkeypatch):
    """Hundreds of equal jobs wait (a sweep, a burst of tiny jobs): a pass searches once for those that do not fit
    and tells them all the same reason, since what is free only shrinks during a pass; the queue still goes in
    order as capacity frees."""
    sim = sim_with("", info("n1", 2))
    running = submit(sim, "bob", gpus=2)
    waiting = [submit(sim, "carol", gpus=2) for _ in range(200)]
    assert all(j.state == JobState.PENDING for j in waiting)
    searches = []
    real = queue.place_avoiding
    monkeypatch.setattr(queue, "place_avoiding", lambda job, *a, **kw: searches.append(job.id) or real(job, *a, **kw))
    finish(sim, running)
    # The oldest is placed; the next one is searched for and does not fit; the 198 behind it are not searched.
    assert searches == [waiting[0].id, waiting[1].id]
    assert waiting[0].state == JobState.STARTING
    reasons = {j.message for j in waiting[1:]}
    assert len(reasons) == 1 and reasons.pop().startswith("waiting for resources: ")
    searches.clear()
    sim.report(waiting[0], "worker", 0, "RUNNING")
    finish(sim, waiting[0])
    assert waiting[1].state == JobState.STARTING and searches == [waiting[1].id, waiting[2].id]
    assert all(j.state == JobState.PENDING for j in waiting[2:])


def test_look_alike_jobs_of_other_owners_get_their_own_answers_in_one_pass():
    """A pass answers a run of look-alike jobs once (queue.QueuePass.answered), but only for the same owner,
    groups and class, and only while nothing was placed or held since: interleaved owners, one over its quota,
    each get their own answer."""
    sim = sim_with("[users.alice]\ngpus = 1\n", info("n1", 3))
    blocker = submit(sim, "bob", gpus=3)
    queued = [submit(sim, owner) for owner in ("alice", "alice", "carol", "alice", "carol", "dave")]
    assert all(j.state == JobState.PENDING for j in queued)
    finish(sim, blocker)  # three GPUs free: one pass over the queue
    states = [(j.owner, j.state) for j in queued]
    assert states == [("alice", JobState.STARTING), ("alice", JobState.PENDING), ("carol", JobState.STARTING),
                      ("alice", JobState.PENDING), ("carol", JobState.STARTING), ("dave", JobState.PENDING)]
    quota = "waiting: alice's quota of 1 GPU is in use (1 running + 1 asked)"
    assert queued[1].message == quota and queued[3].message == quota
    assert queued[5].message.startswith("waiting for resources: ")


def test_a_waiting_jobs_new_reason_is_shown_and_not_written_for_every_waiting_job():
    """Why a job waits follows what is free (which task of its gang found no room): every task's exit changes it
    for the whole queue. Status shows the new reason at once; the store does not rewrite every waiting job for it
    (it wrote each of hundreds at every exit), and a job written for a change of its own carries it."""
    one_port = (20000, 20000)
    sim = Sim(info("n1", ports=one_port), info("n2", ports=one_port))
    writer = Writer()
    running, actions = sim.submit(make_spec(worker=2), "running")
    sim.running(running, actions)
    waiting = [sim.submit(make_spec(worker=2), f"w{i}")[0] for i in range(50)]
    assert all(j.state == JobState.PENDING for j in waiting)
    written = {key for kind, key in writer.collect(sim.c.changes).writes if kind == "job"}
    assert {j.id for j in waiting} <= written
    before = {j.message for j in waiting}
    assert len(before) == 1 and "no node left for worker:0" in before.pop()

    sim.exit(running, "worker:1", 0)  # one port is free: each waiting job's worker:0 fits, its worker:1 does not
    assert {j.message for j in waiting} == {waiting[0].message} and "no node left for worker:1" in waiting[0].message
    assert wire.job_status(waiting[0]).message == waiting[0].message  # what `status` shows
    written = {key for kind, key in writer.collect(sim.c.changes).writes if kind == "job"}
    assert written.isdisjoint(j.id for j in waiting), "no waiting job is rewritten for its reason alone"

    shown = waiting[-1].message
    waiting[-1].not_before = sim.now + 5  # a change of its own: written, with the reason it shows now
    doc = json.loads(writer.collect(sim.c.changes).writes[("job", waiting[-1].id)].body)
    assert doc["message"] == shown and "no node left for worker:1" in shown
