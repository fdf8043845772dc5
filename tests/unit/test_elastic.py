"""Elastic multi_worker_mirrored jobs through the coordinator's core with fake time (coresim.Sim): the spec's range,
the size a job starts at, growing when capacity frees (once per resize interval, never past a waiting job of its
class or a higher one), shrinking when a node is lost or a preemptor takes workers, and what each costs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from coresim import Sim, info, launches, make_spec, stops

from tfcluster import layout, statuses, views, wire
from tfcluster.commands import SyncCheckpoints
from tfcluster.daemon.coordinator.core.model.elastic import at_size, resize
from tfcluster.daemon.coordinator.store import documents
from tfcluster.daemon.coordinator.store.records import Writer
from tfcluster.spec import DEFAULT_RESIZE_INTERVAL_SECONDS, SpecError
from tfcluster.specfile import parse_spec
from tfcluster.daemon.coordinator.core.scheduling.policy import parse as parse_policy
from tfcluster.states import JobState, TaskState

INTERVAL = 60.0
LOW, HIGH = 10, 100


def elastic_spec(count="2..3", interval=INTERVAL, name="el"):
    data = {"name": name, "strategy": "multi_worker_mirrored", "command": ["python", "train.py"], "gpus": 1,
            "workdir": "/work/job", "roles": {"worker": {"count": count}},
            "elastic": {"resize_interval_seconds": interval}}
    return parse_spec(data, "test")


def three_nodes():
    return Sim(info("n1", 1), info("n2", 1), info("n3", 1))


def busy(sim, node_count=1, name="busy", rank=0):
    """A one-GPU job per node (mirrored), RUNNING: it keeps that node's GPU."""
    jobs = []
    for i in range(node_count):
        job, commands = sim.submit(make_spec(strategy="mirrored", gpus=1, worker=1), f"{name}{i}")
        job.rank = rank
        sim.running(job, commands)
        jobs.append(job)
    return jobs


def start(sim, spec=None, rank=0):
    job, commands = sim.submit(spec or elastic_spec(), "el")
    job.rank = rank
    sim.running(job, commands)
    assert job.state == JobState.RUNNING, job.message
    return job, commands


def workers_in(launch) -> tuple[int, int]:
    """(workers in its TF_CONFIG, TFCLUSTER_NUM_WORKERS)."""
    cluster = json.loads(launch.env[layout.TF_CONFIG])["cluster"]
    return len(cluster["worker"]), int(launch.env[layout.NUM_WORKERS])


def later(sim, seconds):
    sim.now += seconds
    sim.heartbeat_all()
    return sim.c.tick(sim.now)


def regroup(sim, job, stop_commands):
    """Every task told to stop exits; returns the launches of the group placed again."""
    relaunched = sim.exit_stopped(job, stop_commands) + sim.c.schedule(sim.now)
    sim.running(job, relaunched)
    return launches(relaunched)


# ---- the spec -------------------------------------------------------------------------------------------------

def test_a_range_reads_as_the_largest_size_with_its_bounds_and_survives_the_wire_and_the_store():
    spec = elastic_spec("2..4")
    role = spec.role("worker")
    assert (role.count, role.min_count, role.max_count) == (4, 2, 4) and role.elastic
    assert spec.resize_interval_seconds == INTERVAL
    assert wire.spec_from_proto(wire.spec_to_proto(replace(spec, workdir="/work/job"))) == spec
    assert documents.spec_from_doc(json.loads(json.dumps(documents.plain(spec)))) == spec
    plain = parse_spec({"name": "p", "strategy": "multi_worker_mirrored", "roles": {"worker": {"count": 2}},
                        "command": ["x"]}, "test")
    assert not plain.role("worker").elastic and plain.resize_interval_seconds == DEFAULT_RESIZE_INTERVAL_SECONDS


@pytest.mark.parametrize("data, key, words", [
    ({"strategy": "parameter_server", "roles": {"worker": {"count": "1..2"}, "ps": {"count": 1},
                                                "chief": {"count": 1}}}, "roles.worker.count", "multi_worker_mirrored"),
    ({"strategy": "multi_worker_mirrored", "roles": {"chief": {"count": "1..2"}}}, "roles.chief.count", "only the worker"),
    ({"strategy": "multi_worker_mirrored", "roles": {"worker": {"count": "4..2"}}}, "roles.worker.count", "MIN <= MAX"),
    ({"strategy": "multi_worker_mirrored", "roles": {"worker": {"count": "0..2"}}}, "roles.worker.count", "1 <= MIN"),
    ({"strategy": "multi_worker_mirrored", "roles": {"worker": {"count": "two"}}}, "roles.worker.count", "MIN..MAX"),
    ({"strategy": "multi_worker_mirrored", "elastic": {"resize_interval_seconds": -1}},
     "elastic.resize_interval_seconds", ">= 0"),
    ({"strategy": "multi_worker_mirrored", "elastic": {"resize_interval": 5}}, "elastic.resize_interval", "unknown"),
])
def test_a_range_is_refused_where_it_cannot_work_with_an_error_naming_the_key(data, key, words):
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "e", "command": ["x"], **data}, "test")
    assert e.value.key == key and words in e.value.message, str(e.value)


# ---- placing and growing ----------------------------------------------------------------------------------------

def test_it_starts_once_its_smallest_size_fits_with_a_tf_config_of_that_size():
    sim = three_nodes()
    busy(sim)
    job, commands = start(sim)
    assert [workers_in(a) for a in launches(commands)] == [(2, 2), (2, 2)]
    assert [t.key for t in job.tasks] == ["worker:0", "worker:1"]
    assert job.message == "started with 2 workers (elastic 2..3)" and job.resizes == 0


def test_it_waits_while_even_its_smallest_size_does_not_fit():
    sim = three_nodes()
    busy(sim, 2)
    job, commands = sim.submit(elastic_spec(), "el")
    assert job.state == JobState.PENDING and launches(commands) == []
    assert "waiting for resources" in job.message


def test_it_grows_once_the_resize_interval_has_passed_saving_first_and_uncharged():
    sim = three_nodes()
    [other] = busy(sim)
    job, _ = start(sim)
    sim.exit(other, "worker:0", 0)
    assert [c for c in later(sim, INTERVAL - 5) if c.attempt.job_id == job.id] == []  # too soon after its start
    stop = later(sim, 5)
    assert sorted(s.attempt.task_key for s in stops(stop)) == ["worker:0", "worker:1"]
    assert all(s.grace_seconds == job.spec.stop_grace_seconds for s in stops(stop))  # its signal, then the grace
    assert job.state == JobState.STOPPING and job.message.startswith("growing 2 \u2192 3 workers")
    again = regroup(sim, job, stop)
    assert sorted(workers_in(a) for a in again) == [(3, 3)] * 3
    assert job.state == JobState.RUNNING and job.message == "resized 2 \u2192 3 workers, resuming from the checkpoint"
    assert (job.resizes, job.restarts, job.preemptions) == (1, 0, 0)
    assert later(sim, INTERVAL * 2) == []  # at its largest size: nothing more


def test_the_worker_a_grow_adds_is_written_with_each_later_change_of_its_own():
    """The store's writer looks only at the records that tell it they changed: the worker a grow adds is a new
    record, written with its job, and it too must tell of its changes, or a restart would miss them."""
    sim = three_nodes()
    [other] = busy(sim)
    job, _ = start(sim)
    writer = Writer()
    writer.collect(sim.c.changes)
    sim.exit(other, "worker:0", 0)
    regroup(sim, job, later(sim, INTERVAL))
    added = job.task("worker", 2)
    assert added is not None and added.state == TaskState.RUNNING
    assert ("task", f"{job.id}/worker:2") in writer.collect(sim.c.changes).writes
    added.pid += 1  # a change of the new worker's alone
    assert list(writer.collect(sim.c.changes).writes) == [("task", f"{job.id}/worker:2")]


def test_a_grow_that_copies_host_local_checkpoints_to_the_new_node_still_says_it_resized():
    sim = Sim(*(replace(info(n, 1), peer_port=19999) for n in ("n1", "n2", "n3")))  # agents that copy checkpoints
    [other] = busy(sim)
    job, _ = start(sim)
    sim.exit(other, "worker:0", 0)
    stop = later(sim, INTERVAL)
    copying = sim.exit_stopped(job, stop) + sim.c.schedule(sim.now)
    [sync] = [c for c in copying if isinstance(c, SyncCheckpoints)]
    assert job.message.startswith("resized 2 \u2192 3 workers, resuming from the checkpoint; copying checkpoints")
    relaunch = sim.c.sync_done(sync.node, job.id, sync.sync_id, True, "", sim.now)
    sim.running(job, relaunch)
    assert job.state == JobState.RUNNING and job.message == "resized 2 \u2192 3 workers, resuming from the checkpoint"


def test_it_does_not_grow_past_a_waiting_job_of_its_class_but_does_past_a_lower_one():
    sim = three_nodes()
    [other] = busy(sim)
    job, _ = start(sim, rank=LOW)
    waiting, _ = sim.submit(make_spec(strategy="multi_worker_mirrored", gpus=1, worker=2), "waiting")
    waiting.rank = LOW
    sim.exit(other, "worker:0", 0)  # one GPU frees: the waiting job needs two
    assert waiting.state == JobState.PENDING
    assert [c for c in later(sim, INTERVAL * 2) if c.attempt.job_id == job.id] == []
    waiting.rank = LOW - 1
    sim.c.nodes.resources_changed()
    assert sorted(s.attempt.task_key for s in stops(later(sim, 1))) == ["worker:0", "worker:1"]


# ---- shrinking --------------------------------------------------------------------------------------------------

def test_a_lost_node_shrinks_it_without_charging_its_restart_budget():
    sim = three_nodes()
    job, _ = start(sim, elastic_spec("2..3"))
    assert len(job.tasks) == 3
    gone = job.task("worker", 2).node
    sim.now += 4
    sim.heartbeat_all(gone)
    stop = sim.c.tick(sim.now)
    assert job.task("worker", 2).state == TaskState.LOST and job.state == JobState.STOPPING
    assert "smaller if need be" in job.message
    again = regroup(sim, job, stop)
    assert sorted(workers_in(a) for a in again) == [(2, 2)] * 2 and {a.node for a in again} != {gone}
    assert job.message == "resized 3 \u2192 2 workers, resuming from the checkpoint"
    assert (job.resizes, job.restarts) == (1, 0)


def test_at_its_smallest_size_a_lost_node_is_charged_like_any_failure():
    sim = Sim(info("n1", 1), info("n2", 1))
    job, _ = start(sim, elastic_spec("2..3"))
    sim.now += 4
    sim.heartbeat_all("n2")
    sim.c.tick(sim.now)
    assert job.restarts == 1 and job.state == JobState.STOPPING


def test_a_peer_failing_while_a_node_is_lost_within_the_task_grace_is_a_shrink_too():
    sim = Sim(info("n1", 1), info("n2", 1), info("n3", 1), task_grace=30.0)
    job, _ = start(sim)
    gone = job.task("worker", 2).node
    sim.now += 4
    sim.heartbeat_all(gone)
    sim.c.tick(sim.now)
    assert job.task("worker", 2).seen.node_silent  # lost node, its task not given up yet
    sim.exit(job, "worker:0", 1)  # its collective timed out
    assert job.restarts == 0 and job.state == JobState.STOPPING


def test_a_preemptor_taking_one_worker_leaves_it_running_smaller():
    sim = three_nodes()
    job, _ = start(sim, rank=LOW)
    sim.now += 10
    high, commands = sim.c.submit(replace(make_spec(strategy="mirrored", gpus=1, worker=1), name="high"), sim.now)
    high.rank = HIGH
    sim.c.nodes.resources_changed()
    stop = commands + sim.c.schedule(sim.now)
    assert len(stops(stop)) == 3 and job.held_for == high.id
    out = sim.exit_stopped(job, stop) + sim.c.schedule(sim.now)
    assert high.state == JobState.STARTING
    sim.running(job, out)
    assert job.state == JobState.RUNNING and len(job.tasks) == 2
    assert job.message == "resized 3 \u2192 2 workers, resuming from the checkpoint"
    assert (job.restarts, job.preemptions, job.resizes) == (0, 1, 1)


def test_resizing_keeps_attempt_numbers_rising_for_every_index():
    spec = elastic_spec("1..3")
    sim = three_nodes()
    job, _ = start(sim, spec)
    job.task("worker", 2).attempt = 7
    resize(job, 1)
    resize(job, 3)
    sim.c.settle(job, [])  # resized by hand, not through the cluster's events: settled as the core settles a change
    assert [t.attempt for t in job.tasks] == [1, 7, 7] and job.top_attempt == 7 and job.spec == at_size(spec, 3)


def test_its_sizes_are_in_status_and_json_and_a_fixed_job_has_none():
    sim = three_nodes()
    job, _ = start(sim, elastic_spec("1..4"))
    message = wire.job_status(job)
    assert (message.workers.min, message.workers.max, message.workers.current) == (1, 4, 3)
    assert views.job_doc(message)["workers"] == {"min": 1, "max": 4, "current": 3, "resizes": 0}
    assert statuses.read(statuses.JobStatus, message).workers == statuses.WorkerRange(1, 4, 3, 0)
    fixed, _ = sim.submit(make_spec(strategy="multi_worker_mirrored", worker=1), "fixed")
    assert not wire.job_status(fixed).HasField("workers") and views.job_doc(wire.job_status(fixed))["workers"] is None


# ---- within the owner's GPU quota ----------------------------------------------------------------------------

def quota_sim(gpus: int) -> Sim:
    sim = Sim(info("n1", 1), info("n2", 1), info("n3", 1), info("n4", 1))
    sim.c.set_policy(parse_policy(f"[users.alice]\ngpus = {gpus}\n", "policy.toml", sim.now))
    return sim


def start_as(sim, owner, spec):
    job, commands = sim.c.submit(spec, sim.now, owner=owner)
    sim.running(job, commands)
    return job


def test_it_starts_at_the_largest_size_its_owners_gpu_quota_allows_not_the_largest_that_fits():
    sim = quota_sim(3)
    job = start_as(sim, "alice", elastic_spec("2..4"))
    assert job.state == JobState.RUNNING and len(job.tasks) == 3, job.message  # 4 would fit: the quota says 3
    other = start_as(sim, "bob", replace(make_spec(strategy="mirrored", gpus=1, worker=1), name="bob"))
    assert other.state == JobState.RUNNING  # the fourth GPU stayed free for someone else


def test_it_grows_only_as_far_as_its_owners_gpu_quota_allows():
    sim = quota_sim(3)
    first = start_as(sim, "alice", replace(make_spec(strategy="mirrored", gpus=1, worker=1), name="first"))
    job = start_as(sim, "alice", elastic_spec("2..4"))
    assert len(job.tasks) == 2, job.message  # 1 + 2 GPUs: alice's quota of 3 is used
    assert not later(sim, INTERVAL + 1)  # two GPUs are free, none within the quota: it stays at 2
    sim.exit(first, "worker:0", 0)
    stop = later(sim, 1)
    assert len(stops(stop)) == 2, job.message  # one GPU of the quota is back: a grow to 3, not to 4
    assert [workers_in(launch) for launch in regroup(sim, job, stop)] == [(3, 3)] * 3
