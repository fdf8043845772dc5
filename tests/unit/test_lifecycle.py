"""The job state machine on its own (core/lifecycle/transitions.py, launch.py): environment, commands, stop, failure text."""

from __future__ import annotations

import json

from tfcluster import __version__
from tfcluster.daemon.coordinator.core.lifecycle import transitions as lifecycle
from tfcluster.daemon.coordinator.core.lifecycle.launch import launch
from tfcluster.daemon.coordinator.core.lifecycle.restart import RESTART
from tfcluster.daemon.coordinator.core.model import job as J
from tfcluster.daemon.coordinator.core.scheduling.placement import NodeCapacity, place, task_list
from tfcluster.model import Gpu, NodeInfo, TaskExit
from tfcluster.specfile import parse_spec
from tfcluster.states import JobState, TaskState


def make_spec(**data):
    base = {"name": "job", "strategy": "multi_worker_mirrored", "command": ["python", "train.py"],
            "roles": {"worker": {"count": 2}}}
    base.update(data)
    return parse_spec(base, "test")


def nodes(n=3, gpus=2):
    return [NodeCapacity(f"n{i}", f"10.0.0.{i}", tuple(Gpu(g, uuid=f"GPU-{i}-{g}") for g in range(gpus)),
                         (20000, 20010)) for i in range(1, n + 1)]


def info_of(name):
    return NodeInfo(name=name, address=f"10.0.0.{name[-1]}", port_range=(20000, 20010), state_dir=f"/state/{name}",
                    agent_version=__version__)


def new_job(spec, job_id="j-1", now=0.0, capacity=None):
    job = J.Job(id=job_id, spec=spec, created=now, tasks=[J.Task(type=t, index=i) for t, i in task_list(spec)])
    actions = lifecycle.place(job, place(spec, capacity or nodes()), info_of, now)
    return job, actions


def run_all(job):
    """Reports RUNNING for every launched task until the job settles (handles waves)."""
    for _ in range(3):
        for t in job.tasks:
            if t.state == TaskState.LAUNCHING:
                lifecycle.running(job, t, 100 + t.index, listening=True, now=0.0)
    return job


def end(job, key, now, code=None, signal=None, message="", log_tail=()):
    task_type, index = key.split(":")
    exit = TaskExit(exit_code=code, signal=signal, message=message, log_tail=tuple(log_tail))
    return lifecycle.ended(job, job.task(task_type, int(index)), exit, now)


def ps_spec(**extra):
    return make_spec(strategy="parameter_server", roles={
        "chief": {}, "worker": {"count": 2}, "ps": {"count": 1, "gpus": 0}, "evaluator": {"gpus": 0}}, **extra)


# ---- environment and commands -----------------------------------------------------------------

def test_task_env_contents():
    spec = make_spec(env={"A": "job", "B": "job"}, gpus=1, model_dir="/models/m",
                     roles={"worker": {"count": 2, "env": {"B": "worker"}}})
    job, actions = new_job(spec)
    a = actions[1]
    task = job.task(a.attempt.type, a.attempt.index)
    env = a.env
    assert env["A"] == "job" and env["B"] == "worker"  # role env over job env
    assert env["TFCLUSTER_JOB_NAME"] == "job"
    assert env["TFCLUSTER_STRATEGY"] == "multi_worker_mirrored"
    assert env["TFCLUSTER_NUM_WORKERS"] == "2"
    assert env["TFCLUSTER_PORT"] == str(task.port) == str(a.port)
    assert env["TFCLUSTER_MODEL_DIR"] == "/models/m"
    assert env["TFCLUSTER_CHECKPOINT_DIR"] == f"/state/{a.node}/jobs/j-1/checkpoints"
    assert env["CUDA_VISIBLE_DEVICES"] == task.gpus[0].uuid
    assert json.loads(env["TF_CONFIG"]) == {"cluster": {"worker": [job.task("worker", 0).address,
                                                                   job.task("worker", 1).address]},
                                            "task": {"type": "worker", "index": 1}}


def test_gpu_without_uuid_is_named_by_index():
    spec = make_spec(strategy="mirrored", gpus=2, roles={"worker": {}})
    cap = [NodeCapacity("n1", "10.0.0.1", (Gpu(0), Gpu(1), Gpu(2)), (1, 2), used_gpus=frozenset({0}))]
    job, (a,) = new_job(spec, capacity=cap)
    assert a.env["CUDA_VISIBLE_DEVICES"] == "1,2"


def test_parameter_server_commands():
    job, actions = new_job(ps_spec(command=["/opt/venv/bin/python3.11", "train.py"]))
    cmds = {a.attempt.task_key: a.command for a in actions}
    assert cmds["ps:0"] == cmds["worker:1"] == ("/opt/venv/bin/python3.11", "-m", "tfcluster.roles.server")
    assert cmds["evaluator:0"] == ("/opt/venv/bin/python3.11", "train.py")
    assert "chief:0" not in cmds
    # A job program that is not python: the built-in servers run under python3.
    job, actions = new_job(ps_spec(command=["./train.sh"]))
    assert {a.attempt.task_key: a.command for a in actions}["ps:0"] == ("python3", "-m", "tfcluster.roles.server")
    # A role command replaces the built-in server.
    spec = parse_spec({"name": "job", "strategy": "parameter_server", "command": ["python", "train.py"],
                       "roles": {"chief": {}, "worker": {"count": 1}, "ps": {"command": ["my-ps"]}}})
    job, actions = new_job(spec)
    assert {a.attempt.task_key: a.command for a in actions}["ps:0"] == ("my-ps",)


def test_evaluator_entrypoint_runs_the_built_in_evaluator():
    spec = make_spec(roles={"worker": {"count": 1}, "evaluator": {"entrypoint": "pkg.mod:build"}})
    job, actions = new_job(spec)
    cmds = {a.attempt.task_key: a.command for a in actions}
    assert cmds["evaluator:0"] == ("python", "-m", "tfcluster.roles.evaluator", "pkg.mod:build")


def test_launch_resend_is_identical():
    job, actions = new_job(make_spec())
    task = job.task(actions[0].attempt.type, actions[0].attempt.index)
    assert launch(job, task) == actions[0]


# ---- transitions ------------------------------------------------------------------------------

def test_duplicate_exit_is_ignored():
    job, _ = new_job(make_spec(restart={"max_restarts": 5}))
    run_all(job)
    first = end(job, "worker:1", 1.0, code=1)
    assert len(first) == 1 and job.state == JobState.STOPPING
    assert end(job, "worker:1", 2.0, code=1) == []
    assert job.task("worker", 1).state == TaskState.FAILED and job.restarts == 1


def test_log_tail_is_kept_on_the_task_and_the_failure():
    job, _ = new_job(make_spec())
    run_all(job)
    end(job, "worker:0", 1.0, code=1, log_tail=[f"line {i}" for i in range(20)])
    assert job.task("worker", 0).exit.log_tail == tuple(f"line {i}" for i in range(20))
    assert job.last_failure.exit.log_tail == job.task("worker", 0).exit.log_tail


def test_user_stop_while_running():
    job, _ = new_job(make_spec(stop_grace_seconds=7))
    run_all(job)
    actions = lifecycle.stop(job, 5.0)
    assert [(a.attempt.task_key, a.grace_seconds, a.attempt.number) for a in actions] == [
        ("worker:0", 7.0, 1), ("worker:1", 7.0, 1)]
    assert job.state == JobState.STOPPING
    # A task that exits 0 when stopped still leaves the job STOPPED, not SUCCEEDED.
    end(job, "worker:0", 6.0, code=0)
    assert job.state == JobState.STOPPING
    end(job, "worker:1", 7.0, signal=15)
    assert job.state == JobState.STOPPED and job.finished == 7.0 and job.message == "stopped by user"
    assert job.restarts == 0 and job.last_failure is None
    assert lifecycle.stop(job, 8.0) == []  # already over


def test_forced_stop_has_no_grace_and_escalates_a_graceful_one():
    job, _ = new_job(make_spec())
    run_all(job)
    assert {a.grace_seconds for a in lifecycle.stop(job, 1.0)} == {30.0}
    assert lifecycle.stop(job, 1.5) == [], "the same stop again sends nothing"
    now = lifecycle.stop(job, 2.0, graceful=False)
    assert sorted(a.attempt.task_key for a in now) == ["worker:0", "worker:1"]
    assert {a.grace_seconds for a in now} == {0.0}
    assert lifecycle.stop(job, 2.5, graceful=False) == []


def test_stop_of_a_pending_job_is_immediate():
    spec = make_spec()
    job = J.Job(id="j-1", spec=spec, tasks=[J.Task(t, i) for t, i in task_list(spec)])
    assert lifecycle.stop(job, 3.0) == []
    assert job.state == JobState.STOPPED and job.finished == 3.0


def test_stop_while_starting_parameter_server_drops_the_unlaunched_chief():
    job, actions = new_job(ps_spec())
    assert job.task("chief", 0).state == TaskState.PENDING
    stops = lifecycle.stop(job, 1.0)
    assert sorted(s.attempt.task_key for s in stops) == ["evaluator:0", "ps:0", "worker:0", "worker:1"]
    assert job.task("chief", 0).state == TaskState.STOPPED
    for s in stops:
        end(job, s.attempt.task_key, 2.0, signal=15)
    assert job.state == JobState.STOPPED


def test_user_stop_wins_over_a_pending_restart():
    job, _ = new_job(make_spec())
    run_all(job)
    end(job, "worker:1", 1.0, code=1)
    assert job.state == JobState.STOPPING and job.outcome == RESTART
    lifecycle.stop(job, 2.0)
    end(job, "worker:0", 3.0, signal=15)
    assert job.state == JobState.STOPPED


def test_failure_describe():
    def failure(**exit):
        return J.Failure(exit.pop("task", "worker:1"), exit.pop("node", "n2"), TaskExit(**exit), 0.0)
    assert failure(signal=9).describe() == "worker:1 on n2 killed by SIGKILL"
    assert failure(signal=99).describe() == "worker:1 on n2 killed by signal 99"
    assert failure(task="chief:0", node="n1", exit_code=3, message="OOM").describe() == \
        "chief:0 on n1 exited with code 3 (OOM)"
    assert failure(task="ps:0", node="n1", message="node n1 lost").describe() == "ps:0 on n1 node n1 lost"
    assert failure(task="ps:0", node="n1").describe() == "ps:0 on n1 failed"


def test_records_mark_themselves_unsaved_on_any_change():
    job, _ = new_job(make_spec())
    job.saved()
    for t in job.tasks:
        t.saved()
    assert not job.unsaved and not any(t.unsaved for t in job.tasks)
    task = job.task("worker", 1)
    task.seen.output_bytes = 100  # what is only observed is never saved
    assert not task.unsaved
    lifecycle.running(job, task, 42, listening=False, now=1.0)
    assert task.unsaved and not job.task("worker", 0).unsaved
