"""The tf.data service as roles: the spec's rules, the launch order and environment, and what a failure of a
dispatcher or data worker restarts (nothing of training, and nothing charged), driven through the core with
fake time."""

from __future__ import annotations

import json

import pytest
from coresim import Sim, info, keys, launches, make_spec, stops

from tfcluster.daemon.coordinator.core.lifecycle import restart
from tfcluster.model import DATA_SERVICE_TYPES
from tfcluster.roles.tfconfig import build_tf_configs
from tfcluster.spec import SpecError
from tfcluster.states import JobState, TaskState

DATA_ROLES = {"dispatcher": {"count": 1, "nodes": ["n5"]}, "data_worker": {"count": 2, "nodes": ["n3", "n4"]}}
NODES = ("n1", "n2", "n3", "n4", "n5")


def spec(strategy="multi_worker_mirrored", **kw):
    roles = {"worker": {"count": 2, "nodes": ["n1", "n2"]}, **DATA_ROLES, **kw.pop("roles", {})}
    return make_spec(strategy, **kw, **roles)


def started(s=None):
    """A job whose dispatcher, data workers and workers all run, on five nodes without GPUs."""
    sim = Sim(*map(info, NODES))
    job, actions = sim.submit(s or spec())
    while launches(actions):
        actions = sim.running(job, actions)
    assert job.state == JobState.RUNNING
    return sim, job


# ---- the spec -----------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["mirrored", "central_storage", "multi_worker_mirrored", "auto"])
def test_every_strategy_that_reads_input_takes_the_data_service(strategy):
    roles = {"worker": {"count": 1}} if strategy in ("mirrored", "central_storage") else {}
    s = make_spec(strategy, **{**{"worker": 2}, **roles, **DATA_ROLES})
    assert s.count("dispatcher") == 1 and s.count("data_worker") == 2


def test_parameter_server_takes_the_data_service():
    s = make_spec("parameter_server", chief=1, worker=2, ps=1, **DATA_ROLES)
    assert s.command_for("dispatcher") == () and s.command_for("chief") == ("python", "train.py")


@pytest.mark.parametrize("roles, key, words", [
    ({"dispatcher": 2, "data_worker": 1}, "roles.dispatcher.count", "exactly one dispatcher, got 2"),
    ({"dispatcher": 0, "data_worker": 1}, "roles.dispatcher.count", "exactly one dispatcher, got 0"),
    ({"data_worker": 2}, "roles.dispatcher", "data workers need a dispatcher"),
    ({"dispatcher": 1}, "roles.data_worker", "a dispatcher needs data workers"),
    ({"dispatcher": 1, "data_worker": {"count": 1, "entrypoint": "m:f"}}, "roles.data_worker.entrypoint",
     "only the evaluator"),
    ({"dispatcher": {"count": "1..2"}, "data_worker": 1}, "roles.dispatcher.count", "only the worker role"),
])
def test_a_data_service_that_cannot_work_is_refused_naming_the_key(roles, key, words):
    with pytest.raises(SpecError) as e:
        make_spec(worker=2, **roles)
    assert e.value.key == key and words in e.value.message


def test_data_service_roles_take_no_gpus_unless_asked_and_never_the_jobs_command():
    s = make_spec(gpus=2, worker=2, dispatcher=1, data_worker={"count": 1, "command": ["python", "worker.py"]})
    assert (s.gpus_for("worker"), s.gpus_for("dispatcher"), s.gpus_for("data_worker")) == (2, 0, 0)
    assert s.command_for("dispatcher") == () and s.command_for("data_worker") == ("python", "worker.py")
    asked = make_spec(gpus=2, worker=2, dispatcher=1, data_worker={"count": 1, "gpus": 1})
    assert asked.gpus_for("data_worker") == 1


# ---- launch order and environment ---------------------------------------------------------------

def test_the_dispatcher_starts_first_then_the_data_workers_then_training():
    sim = Sim(*map(info, NODES))
    job, actions = sim.submit(spec())
    order = []
    while launches(actions):
        order.append(keys(actions))
        assert all(a.report_listening for a in launches(actions) if a.attempt.type in DATA_SERVICE_TYPES)
        actions = sim.running(job, actions)
    assert order == [["dispatcher:0"], ["data_worker:0", "data_worker:1"], ["worker:0", "worker:1"]]


def test_data_workers_wait_until_the_dispatcher_listens():
    sim = Sim(*map(info, NODES))
    job, actions = sim.submit(spec())
    assert sim.report(job, "dispatcher", 0, "RUNNING", listening=False) == []
    assert keys(sim.report(job, "dispatcher", 0, "RUNNING", listening=True)) == ["data_worker:0", "data_worker:1"]


def test_every_task_gets_the_dispatchers_address_and_only_training_gets_a_tf_config():
    sim = Sim(*map(info, NODES))
    job, actions = sim.submit(spec(roles={"evaluator": {"count": 1, "nodes": ["n5"]}}))
    seen = {}
    while launches(actions):
        seen.update({a.attempt.task_key: a for a in launches(actions)})
        actions = sim.running(job, actions)
    dispatcher = job.task("dispatcher", 0)
    address = f"grpc://{dispatcher.host}:{dispatcher.port}"
    assert {a.env["TFCLUSTER_DATA_SERVICE"] for a in seen.values()} == {address}
    for key in ("dispatcher:0", "data_worker:0", "data_worker:1"):
        kind = key.split(":")[0]
        assert "TF_CONFIG" not in seen[key].env
        assert seen[key].command[1:] == ("-m", "tfcluster.roles.data_service", kind)
        task = job.task(kind, int(key[-1]))
        assert seen[key].env["TFCLUSTER_ADDRESS"] == f"{task.host}:{task.port}"
    cluster = json.loads(seen["worker:0"].env["TF_CONFIG"])["cluster"]
    assert set(cluster) == {"worker"}, "TensorFlow refuses unknown job names in the cluster"
    assert "TF_CONFIG" in seen["evaluator:0"].env


def test_status_shows_no_tf_config_for_the_data_service():
    configs = build_tf_configs([("worker", 0, "h:1"), ("dispatcher", 0, "h:2"), ("data_worker", 0, "h:3")])
    assert list(configs) == [("worker", 0)]


# ---- failures -----------------------------------------------------------------------------------

def test_a_data_worker_that_fails_restarts_alone_and_uncharged_after_a_pause():
    sim, job = started()
    workers = {t.key: t.attempt for t in job.training_tasks()}
    assert sim.exit(job, "data_worker:1", None, signal=9) == []
    assert job.state == JobState.RUNNING and "restarted alone" in job.message
    assert sim.c.tick(sim.now + 0.5) == [], "a crashing server does not spin"
    sim.now += restart.DATA_SERVICE_BACKOFF_SECONDS
    again = sim.c.tick(sim.now)
    assert keys(again) == ["data_worker:1"] and job.task("data_worker", 1).attempt == 2
    assert (job.restarts, job.evaluator_restarts) == (0, 0)
    assert {t.key: t.attempt for t in job.training_tasks()} == workers


def test_a_data_worker_restarts_as_often_as_it_fails_without_spending_trainings_budget():
    sim, job = started(spec(restart={"max_restarts": 1}))
    for attempt in (2, 3, 4):
        sim.exit(job, "data_worker:0", 1)
        sim.now += restart.DATA_SERVICE_BACKOFF_SECONDS
        sim.running(job, sim.c.tick(sim.now))
        assert job.task("data_worker", 0).attempt == attempt
    assert job.restarts == 0
    sim.exit(job, "worker:1", 1)
    assert "restarting the training group" in job.message, "training still has its whole budget"


def test_the_dispatcher_restarts_in_place_on_its_port():
    sim, job = started()
    dispatcher = job.task("dispatcher", 0)
    where = (dispatcher.node, dispatcher.port)
    sim.exit(job, "dispatcher:0", None, signal=9)
    assert "journal" in job.message
    sim.now += restart.DATA_SERVICE_BACKOFF_SECONDS
    again = sim.c.tick(sim.now)
    assert keys(again) == ["dispatcher:0"] and (again[0].node, again[0].port) == where
    assert job.state == JobState.RUNNING and job.restarts == 0


def test_a_lost_data_worker_is_placed_again_without_touching_training():
    sim, job = started()
    lost = job.task("data_worker", 0).node
    workers = {t.key: (t.attempt, t.node) for t in job.training_tasks()}
    sim.now += 4
    sim.heartbeat_all(lost)
    sim.c.tick(sim.now)
    assert job.task("data_worker", 0).state == TaskState.PENDING and job.state == JobState.RUNNING
    sim.now += restart.DATA_SERVICE_BACKOFF_SECONDS
    sim.heartbeat_all(lost)
    again = sim.c.tick(sim.now)
    assert keys(again) == ["data_worker:0"] and again[0].node != lost
    assert {t.key: (t.attempt, t.node) for t in job.training_tasks()} == workers and job.restarts == 0


def test_a_lost_dispatcher_restarts_the_group_uncharged_so_training_learns_its_new_address():
    sim, job = started()
    lost = job.task("dispatcher", 0).node
    sim.now += 4
    sim.heartbeat_all(lost)
    sim.c.tick(sim.now)
    assert job.state == JobState.STOPPING and "new one" in job.message and job.restarts == 0


def test_a_data_service_task_that_cannot_start_fails_the_job():
    sim, job = started(spec(restart={"permanent_exit_codes": [7]}))
    sim.exit(job, "data_worker:0", 7)
    assert job.state == JobState.STOPPING and "cannot read its input" in job.message


def test_training_decides_the_outcome_and_the_data_service_is_stopped_not_failed():
    sim, job = started()
    sim.exit(job, "worker:1", 0)
    done = sim.exit(job, "worker:0", 0)
    assert keys(stops(done)) == ["data_worker:0", "data_worker:1", "dispatcher:0"]
    sim.exit_stopped(job, done)
    assert job.state == JobState.SUCCEEDED
    assert {t.state for t in job.tasks if t.type in DATA_SERVICE_TYPES} == {TaskState.STOPPED}
    assert job.restarts == 0
