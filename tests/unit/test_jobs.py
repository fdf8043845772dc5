"""The job state machine on its own: environment, commands, stop, failure text and persistence."""

from __future__ import annotations

import json

from tfcluster.daemon.coordinator import jobs as J
from tfcluster.daemon.coordinator.cluster import Cluster, NodeInfo, Report
from tfcluster.daemon.coordinator.scheduler import Gpu, NodeCapacity, place, task_list
from tfcluster.spec import parse_spec, resolve_strategy


def make_spec(**data):
    base = {"name": "job", "strategy": "multi_worker_mirrored", "command": ["python", "train.py"],
            "roles": {"worker": {"count": 2}}}
    base.update(data)
    return parse_spec(base, "test")


def nodes(n=3, gpus=2):
    return [NodeCapacity(f"n{i}", f"10.0.0.{i}", tuple(Gpu(g, uuid=f"GPU-{i}-{g}") for g in range(gpus)),
                         (20000, 20010)) for i in range(1, n + 1)]


def new_job(spec, job_id="j1", now=0.0):
    job = J.Job(id=job_id, spec=spec, strategy=resolve_strategy(spec), created=now,
                tasks=[J.Task(type=t, index=i) for t, i in task_list(spec)])
    placement = place(spec, nodes())
    actions = job.place(placement, {f"n{i}": f"/state/n{i}" for i in range(1, 4)}, now)
    return job, actions


def run_all(job):
    """Reports RUNNING for every launched task until the job settles (handles waves)."""
    for _ in range(3):
        for t in job.tasks:
            if t.state == J.T_LAUNCHING:
                job.on_running(t, 100 + t.index)
    return job


def ps_spec(**extra):
    return make_spec(strategy="parameter_server", roles={
        "chief": {}, "worker": {"count": 2}, "ps": {"count": 1, "gpus": 0}, "evaluator": {"gpus": 0}}, **extra)


# ---- environment and commands -----------------------------------------------------------------

def test_task_env_contents():
    spec = make_spec(env={"A": "job", "B": "job"}, gpus=1, model_dir="/models/m",
                     roles={"worker": {"count": 2, "env": {"B": "worker"}}})
    job, actions = new_job(spec)
    a = actions[1]
    env = a.env
    assert env["A"] == "job" and env["B"] == "worker"  # role env over job env
    assert env["TFCLUSTER_JOB_NAME"] == "job"
    assert env["TFCLUSTER_STRATEGY"] == "multi_worker_mirrored"
    assert env["TFCLUSTER_NUM_WORKERS"] == "2"
    assert env["TFCLUSTER_PORT"] == str(a.task.port)
    assert env["TFCLUSTER_MODEL_DIR"] == "/models/m"
    assert env["TFCLUSTER_CHECKPOINT_DIR"] == f"/state/{a.node}/jobs/j1/checkpoints"
    assert env["CUDA_VISIBLE_DEVICES"] == a.task.gpus[0].uuid
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}


def test_gpu_without_uuid_is_named_by_index():
    spec = make_spec(strategy="mirrored", gpus=2, roles={"worker": {}})
    job = J.Job(id="j", spec=spec, strategy="mirrored", tasks=[J.Task("worker", 0)])
    cap = [NodeCapacity("n1", "10.0.0.1", (Gpu(0), Gpu(1), Gpu(2)), (1, 2), used_gpus=frozenset({0}))]
    (a,) = job.place(place(spec, cap), {}, 0.0)
    assert a.env["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert a.env["TFCLUSTER_CHECKPOINT_DIR"] == "/tmp/tfcluster/jobs/j/checkpoints"


def test_parameter_server_commands():
    job, actions = new_job(ps_spec(command=["/opt/venv/bin/python3.11", "train.py"]))
    cmds = {a.task.key: a.command for a in actions}
    assert cmds["ps:0"] == cmds["worker:1"] == ["/opt/venv/bin/python3.11", "-m", "tfcluster.roles.server"]
    assert cmds["evaluator:0"] == ["/opt/venv/bin/python3.11", "train.py"]
    assert "chief:0" not in cmds
    # A job program that is not python: the built-in servers run under python3.
    job, actions = new_job(ps_spec(command=["./train.sh"]))
    assert {a.task.key: a.command for a in actions}["ps:0"] == ["python3", "-m", "tfcluster.roles.server"]
    # A role command replaces the built-in server.
    spec = parse_spec({"name": "job", "strategy": "parameter_server", "command": ["python", "train.py"],
                       "roles": {"chief": {}, "worker": {"count": 1}, "ps": {"command": ["my-ps"]}}})
    job, actions = new_job(spec)
    assert {a.task.key: a.command for a in actions}["ps:0"] == ["my-ps"]


def test_launch_resend_is_identical():
    job, actions = new_job(make_spec())
    task = actions[0].task
    assert job.launch_action(task) == actions[0]


# ---- transitions ------------------------------------------------------------------------------

def test_duplicate_exit_is_ignored():
    job, _ = new_job(make_spec(restart={"max_restarts": 5}))
    run_all(job)
    w1 = job.task("worker", 1)
    first = job.on_exit(w1, 1, None, "", [], 1.0)
    assert len(first) == 1 and job.state == J.STOPPING
    assert job.on_exit(w1, 1, None, "", [], 2.0) == []
    assert w1.state == J.T_FAILED and job.restarts == 0


def test_log_tail_is_capped():
    job, _ = new_job(make_spec())
    run_all(job)
    job.on_exit(job.task("worker", 0), 1, None, "", [f"line {i}" for i in range(100)], 1.0)
    assert job.task("worker", 0).log_tail == [f"line {i}" for i in range(80, 100)]
    assert job.last_failure.log_tail == job.task("worker", 0).log_tail


def test_user_stop_while_running():
    job, _ = new_job(make_spec(stop_grace_seconds=7))
    run_all(job)
    actions = job.stop(5.0)
    assert [(a.task_type, a.task_index, a.grace_seconds, a.attempt) for a in actions] == [
        ("worker", 0, 7.0, 1), ("worker", 1, 7.0, 1)]
    assert job.state == J.STOPPING
    # A task that exits 0 when stopped still leaves the job STOPPED, not SUCCEEDED.
    job.on_exit(job.task("worker", 0), 0, None, "", [], 6.0)
    assert job.state == J.STOPPING
    job.on_exit(job.task("worker", 1), None, 15, "", [], 7.0)
    assert job.state == J.STOPPED and job.finished == 7.0 and job.message == "stopped by user"
    assert job.restarts == 0 and job.last_failure is None
    assert job.stop(8.0) == []  # already over


def test_forced_stop_has_no_grace():
    job, _ = new_job(make_spec())
    run_all(job)
    assert {a.grace_seconds for a in job.stop(1.0, graceful=False)} == {0.0}


def test_stop_of_a_pending_job_is_immediate():
    spec = make_spec()
    job = J.Job(id="j", spec=spec, strategy=spec.strategy, tasks=[J.Task(t, i) for t, i in task_list(spec)])
    assert job.stop(3.0) == []
    assert job.state == J.STOPPED and job.finished == 3.0


def test_stop_while_starting_parameter_server_drops_the_unlaunched_chief():
    job, actions = new_job(ps_spec())
    assert job.task("chief", 0).state == J.T_PENDING
    stops = job.stop(1.0)
    assert sorted(f"{s.task_type}:{s.task_index}" for s in stops) == [
        "evaluator:0", "ps:0", "worker:0", "worker:1"]
    assert job.task("chief", 0).state == J.T_STOPPED
    for s in stops:
        job.on_exit(job.task(s.task_type, s.task_index), None, 15, "", [], 2.0)
    assert job.state == J.STOPPED


def test_user_stop_wins_over_a_pending_restart():
    job, _ = new_job(make_spec())
    run_all(job)
    job.on_exit(job.task("worker", 1), 1, None, "", [], 1.0)
    assert job.state == J.STOPPING and job.outcome == J.RESTART
    job.stop(2.0)
    job.on_exit(job.task("worker", 0), None, 15, "", [], 3.0)
    assert job.state == J.STOPPED and job.restarts == 0


def test_cannot_ever_be_placed():
    spec = make_spec()
    job = J.Job(id="j", spec=spec, strategy=spec.strategy)
    job.on_unplaceable("no GPUs", never=True, now=4.0)
    assert job.state == J.FAILED and job.terminal and "cannot ever be placed: no GPUs" in job.message
    job = J.Job(id="j", spec=spec, strategy=spec.strategy)
    job.on_unplaceable("busy", never=False, now=4.0)
    assert job.state == J.PENDING and job.message == "waiting for resources: busy"


def test_failure_describe():
    f = J.Failure("worker:1", "n2", None, 9, "", [], 0.0)
    assert f.describe() == "worker:1 on n2 killed by SIGKILL"
    f = J.Failure("worker:1", "n2", None, 99, "", [], 0.0)
    assert f.describe() == "worker:1 on n2 killed by signal 99"
    f = J.Failure("chief:0", "n1", 3, None, "OOM", [], 0.0)
    assert f.describe() == "chief:0 on n1 exited with code 3 (OOM)"
    f = J.Failure("ps:0", "n1", None, None, "node n1 lost", [], 0.0)
    assert f.describe() == "ps:0 on n1 node n1 lost"
    f = J.Failure("ps:0", "n1", None, None, "", [], 0.0)
    assert f.describe() == "ps:0 on n1 failed"


# ---- persistence ------------------------------------------------------------------------------

def test_to_json_from_json_round_trip_fresh_and_after_a_failure():
    spec = parse_spec({
        "name": "rt", "strategy": "parameter_server", "command": ["python", "t.py"], "gpus": 1,
        "env": {"A": "1"}, "checkpoint_dir": "/ck", "stop_grace_seconds": 3,
        "roles": {"chief": {"env": {"C": "2"}}, "worker": {"count": 2, "nodes": ["n1", "n2"]},
                  "ps": {"count": 1, "gpus": 0, "command": ["ps-prog", "--x"]},
                  "evaluator": {"gpus": 0, "entrypoint": "pkg.mod:fn"}},
        "restart": {"max_restarts": 4, "permanent_exit_codes": [3, 9], "backoff_seconds": 2.5},
    }, "rt.toml")
    job, _ = new_job(spec, now=10.0)
    for j in (job, J.Job.from_json(job.to_json())):
        assert j == job
    run_all(job)
    job.evaluations.append({"step": 10, "metrics": {"loss": 0.5}})
    job.on_exit(job.task("worker", 1), 1, None, "boom", ["tail 1", "tail 2"], 12.0)
    assert job.last_failure is not None and job.state == J.STOPPING
    back = J.Job.from_json(job.to_json())
    assert back == job
    assert isinstance(back.spec.roles["worker"].nodes, tuple)
    assert back.task("chief", 0).gpus and all(isinstance(g, Gpu) for t in back.tasks for g in t.gpus)
    assert back.last_failure == job.last_failure and back.last_failure.log_tail == ["tail 1", "tail 2"]
    assert back.to_json() == job.to_json()
    # It keeps working after being read back.
    for t in back.tasks:
        if t.live:
            back.on_exit(t, None, 15, "", [], 13.0)
    assert back.state == J.PENDING and back.restarts == 1


def test_round_trip_through_a_cluster_job():
    c = Cluster()
    c.register(NodeInfo("n1", "10.0.0.1", (1, 9), gpus=(Gpu(0, "GPU-a", "T4", 15000),)), [], "s", 0.0)
    job, _ = c.submit("j9", make_spec(gpus=1, strategy="mirrored", roles={"worker": {}}), 0.0)
    c.report("n1", Report("j9", "worker", 0, 1, "RUNNING", pid=5), 0.5)
    back = J.Job.from_json(job.to_json())
    assert back == job and back.tasks[0].gpus == [Gpu(0, "GPU-a", "T4", 15000)]
    assert back.tasks[0].state == J.T_RUNNING and back.state == J.RUNNING
