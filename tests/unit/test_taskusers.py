"""The UID each job's tasks run as: chosen by the coordinator's core, kept with the job, never shared by two
live jobs; and nodes whose agents would run tasks as root get none."""

from __future__ import annotations

from dataclasses import replace

import pytest
from coresim import Sim, info, launches, make_spec

from tfcluster.daemon.coordinator.core.cluster import Cluster, Unplaceable
from tfcluster.daemon.coordinator.core.model import task_uids as taskusers
from tfcluster.daemon.coordinator.core.model.task_uids import UidRange, allocate, parse_range
from tfcluster.daemon.coordinator.store.documents import dumps, job_doc, job_from_docs, task_doc


def never(uid: int) -> bool:
    return False


def test_the_range_is_read_and_checked():
    assert parse_range("2100000000-2100999999") == UidRange()
    assert parse_range(" 5000-5009 ").size == 10
    for text in ("5000", "a-b", "5009-5000", "0-10", f"1-{2**31}", "-5-7"):
        with pytest.raises(ValueError):
            parse_range(text)


def test_a_jobs_uid_follows_from_its_number_and_skips_those_held():
    uids = UidRange(5000, 5009)
    assert allocate(1, uids, never, never) == 5000
    assert allocate(3, uids, never, never) == 5002
    assert allocate(13, uids, never, never) == 5002  # wraps around
    assert allocate(3, uids, lambda u: u in (5002, 5003), never) == 5004
    # An ended job's UID is taken only once every other one is held.
    assert allocate(3, uids, never, lambda u: u == 5002) == 5003
    assert allocate(3, uids, lambda u: u != 5002, lambda u: u == 5002) == 5002
    with pytest.raises(taskusers.RangeExhausted, match="--task-uid-range"):
        allocate(3, uids, lambda u: True, never)


def submit_and_end(sim: Sim, name: str):
    job, actions = sim.submit(make_spec(worker=1), name)
    sim.running(job, actions)
    sim.exit(job, "worker:0", 0)
    return job


def test_every_live_job_has_a_uid_of_its_own_that_its_launches_carry():
    sim = Sim(info("n1"), info("n2"))
    sim.c.jobs.task_uids = UidRange(7000, 7002)
    jobs = [sim.submit(make_spec(worker=2), f"j{i}") for i in range(3)]
    assert [job.uid for job, _ in jobs] == [7000, 7001, 7002]
    for job, actions in jobs:
        assert {(a.uid, a.gid) for a in launches(actions)} in ({(job.uid, job.uid)}, set())
    with pytest.raises(Unplaceable, match="every task UID of the range 7000-7002 is held by a live job"):
        sim.submit(make_spec(worker=1), "j3")


def test_an_ended_jobs_uid_is_given_again_only_when_the_range_has_no_other():
    sim = Sim(info("n1"))
    sim.c.jobs.task_uids = UidRange(7000, 7001)
    first = submit_and_end(sim, "a")
    second, _ = sim.submit(make_spec(worker=1), "b")
    assert (first.uid, second.uid) == (7000, 7001)
    third, _ = sim.submit(make_spec(worker=1), "c")  # 7001 is live: the ended job's 7000 is the only one left
    assert third.uid == 7000


def test_a_uid_taken_over_from_an_ended_job_is_held_by_the_live_one_before_and_after_retention():
    sim = Sim(info("n1"))
    sim.c.jobs.task_uids = UidRange(7000, 7001)
    first = submit_and_end(sim, "a")
    sim.submit(make_spec(worker=1), "b")
    third, _ = sim.submit(make_spec(worker=1), "c")
    assert third.uid == first.uid == 7000
    with pytest.raises(Unplaceable, match="every task UID of the range 7000-7001 is held by a live job"):
        sim.submit(make_spec(worker=1), "d")  # 7000 is the live job c's, though the ended a had it first
    sim.c.jobs.keep_finished_jobs = 0
    sim.c.prune(sim.now)
    assert first.id not in sim.c.jobs
    with pytest.raises(Unplaceable, match="every task UID of the range 7000-7001 is held by a live job"):
        sim.submit(make_spec(worker=1), "d")


def test_the_uid_is_saved_with_the_job_and_a_job_saved_without_one_gets_one_on_load():
    sim = Sim(info("n1"))
    job, _ = sim.submit(make_spec(worker=1), "a")
    texts = (dumps(job_doc(job)), [dumps(task_doc(t)) for t in job.tasks], [])
    assert job_from_docs(*texts).uid == job.uid
    old = job_doc(job)
    del old["uid"]  # written by a coordinator before 0.3
    loaded = job_from_docs(dumps(old), texts[1], [])
    assert loaded.uid == 0
    cluster = Cluster()
    cluster.add_job(loaded)
    loaded.saved()
    cluster.jobs.assign_missing_uids()
    assert loaded.uid in cluster.jobs.task_uids and loaded.unsaved


def test_an_agent_before_0_3_keeps_its_tasks_but_gets_no_new_ones():
    sim = Sim(info("n1"), replace(info("n2"), agent_version="0.2.0"))
    job, actions = sim.submit(make_spec(worker=1), "a")
    assert {a.node for a in launches(actions)} == {"n1"}
    unavailable = {n.name: n.unavailable for n in sim.c.capacity(sim.now)}
    assert unavailable == {"n1": "", "n2": "agent 0.2.0 runs tasks as root: upgrade it"}
    assert sim.c.nodes["n2"].condition == unavailable["n2"]
