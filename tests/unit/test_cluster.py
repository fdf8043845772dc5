"""The coordinator's pure model driven end to end with fake time: nodes, jobs, reports, restarts, loss."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from coresim import PORTS, Sim, gpus, info, keys, launches, make_spec, report, stops, task_of

from tfcluster import __version__
from tfcluster.commands import ExpectFiles, FinishTraining, Launch, ShipCheckpoints, Stop, SyncCheckpoints
from tfcluster.daemon.coordinator.core.cluster import Unplaceable
from tfcluster.daemon.coordinator.core.model.observer import Observer
from tfcluster.daemon.coordinator.core.lifecycle.checkpoint_copies import SYNC_DEADLINE_SECONDS
from tfcluster.model import Attempt, NodeInfo, TaskProgress
from tfcluster.states import JobState, NodeState, TaskState

def three_nodes():
    return Sim(info("n1", 2), info("n2", 2), info("n3", 0))


def mwms(**kw):
    roles = kw.pop("roles", None) or {"worker": {"count": 2}, "evaluator": {"count": 1, "gpus": 0}}
    return make_spec(gpus=kw.pop("gpus", 1), env=kw.pop("env", {"EPOCHS": "5"}), **kw, **roles)


def start(sim, spec, name="job"):
    job, actions = sim.submit(spec, name)
    assert sim.running(job, actions) == []
    return job, actions


# ---- launch -----------------------------------------------------------------------------------

def test_submit_launches_every_task_with_its_environment():
    sim = three_nodes()
    job, actions = sim.submit(mwms())
    assert job.state == JobState.STARTING and job.strategy == "multi_worker_mirrored"
    assert keys(actions) == ["evaluator:0", "worker:0", "worker:1"]
    assert all(isinstance(a, Launch) for a in actions)
    by_key = {f"{task_of(a).type}:{task_of(a).index}": a for a in actions}
    cluster = {"worker": [job.task("worker", 0).address, job.task("worker", 1).address]}
    for key, a in by_key.items():
        task = task_of(a)
        assert a.node == task.node and a.attempt.job_id == job.id == "job-1"
        assert a.command == ("python", "train.py") and a.workdir == "/work/job"
        assert task.attempt == 1 and task.state == TaskState.LAUNCHING
        env = a.env
        tf_config = json.loads(env["TF_CONFIG"])
        assert tf_config == {"cluster": cluster, "task": {"type": task.type, "index": task.index}}
        assert env["TF_USE_LEGACY_KERAS"] == "1"
        assert env["EPOCHS"] == "5"
        assert env["TFCLUSTER_JOB_ID"] == "job-1"
        assert env["TFCLUSTER_TASK_TYPE"] == task.type
        assert env["TFCLUSTER_TASK_INDEX"] == str(task.index)
        assert env["TFCLUSTER_ATTEMPT"] == "1"
        assert env["TFCLUSTER_CHECKPOINT_DIR"] == f"/state/{task.node}/jobs/job-1/checkpoints"
        assert env["TFCLUSTER_MODEL_DIR"] == env["TFCLUSTER_CHECKPOINT_DIR"]
        assert "GRPC_FAIL_FAST" not in env
    # Workers each have one GPU, named by UUID; the GPU-less evaluator sees none.
    w0, w1 = task_of(by_key["worker:0"]), task_of(by_key["worker:1"])
    assert {w0.node, w1.node} == {"n1", "n2"}  # spread
    for w in (w0, w1):
        assert len(w.gpus) == 1
        assert by_key[w.key].env["CUDA_VISIBLE_DEVICES"] == f"GPU-{w.node}-{w.gpus[0].index}"
    assert by_key["evaluator:0"].env["CUDA_VISIBLE_DEVICES"] == "-1"


def test_spec_env_overrides_legacy_keras_and_checkpoint_dir_is_shared():
    sim = three_nodes()
    spec = make_spec(env={"TF_USE_LEGACY_KERAS": "true"}, worker=2)
    spec = type(spec)(**{**spec.__dict__, "checkpoint_dir": "/shared/ckpt"})
    job, actions = sim.submit(spec)
    for a in actions:
        assert a.env["TF_USE_LEGACY_KERAS"] == "true"
        assert a.env["TFCLUSTER_CHECKPOINT_DIR"] == "/shared/ckpt"
        assert a.env["TFCLUSTER_MODEL_DIR"] == "/shared/ckpt"


def test_gpu_uuids_listed_for_multi_gpu_tasks():
    sim = Sim(info("n1", 4))
    job, actions = sim.submit(make_spec(strategy="mirrored", gpus=3, worker=1))
    (a,) = actions
    assert a.env["CUDA_VISIBLE_DEVICES"] == "GPU-n1-0,GPU-n1-1,GPU-n1-2"


def test_running_only_when_every_task_runs():
    sim = three_nodes()
    job, actions = sim.submit(mwms())
    for a in actions[:-1]:
        assert sim.report(job, task_of(a).type, task_of(a).index, "RUNNING") == []
        assert job.state == JobState.STARTING
    sim.report(job, task_of(actions[-1]).type, task_of(actions[-1]).index, "RUNNING", pid=4242)
    assert job.state == JobState.RUNNING
    assert task_of(actions[-1]).pid == 4242 and task_of(actions[-1]).state == TaskState.RUNNING
    # A repeated report changes nothing.
    assert sim.report(job, task_of(actions[-1]).type, task_of(actions[-1]).index, "RUNNING") == []
    assert job.state == JobState.RUNNING


def test_capacity_accounts_for_running_jobs():
    sim = three_nodes()
    job, _ = start(sim, mwms())
    free = sim.free()
    assert len(free["n1"][0]) == 1 and len(free["n2"][0]) == 1  # one of two GPUs taken on each
    assert all(len(ports) == 1 for _, ports in free.values())


# ---- success ----------------------------------------------------------------------------------

def test_all_exit_zero_succeeds_and_frees_resources():
    sim = three_nodes()
    job, _ = start(sim, mwms(roles={"worker": {"count": 2}}))
    assert sim.exit(job, "worker:1", 0) == []
    assert job.state == JobState.RUNNING  # worker 0 still training
    assert sim.exit(job, "worker:0", 0) == []
    assert job.state == JobState.SUCCEEDED and job.finished == sim.now
    assert all(t.state == TaskState.SUCCEEDED for t in job.tasks)
    assert sim.free() == {"n1": ([0, 1], []), "n2": ([0, 1], []), "n3": ([], [])}


def test_a_task_reported_once_by_an_exit_that_carries_its_pid_ran_then_ended():
    # An agent reports a task that ended within moments of its start once: by its exit, with the pid it ran as.
    started = []

    class Watching(Observer):
        def started(self, job, waited_seconds):
            started.append(job.id)

    sim = three_nodes()
    sim.c.observer = Watching()
    job, _ = sim.submit(mwms(roles={"worker": {"count": 2}}))
    assert sim.exit(job, "worker:0", 0, pid=4242) == []
    w0 = job.task("worker", 0)
    assert w0.state == TaskState.SUCCEEDED and w0.pid == 4242
    assert job.state == JobState.STARTING and started == []  # worker 1 is still launching
    sim.exit(job, "worker:1", 0, pid=4243)
    assert job.state == JobState.SUCCEEDED and started == [job.id], "it ran: every task came up"
    assert sim.free() == {"n1": ([0, 1], []), "n2": ([0, 1], []), "n3": ([], [])}


def test_an_exit_without_a_pid_of_a_launching_task_never_ran():
    sim = three_nodes()
    job, _ = sim.submit(mwms(roles={"worker": {"count": 2}}))
    sim.exit(job, "worker:0", None, message="cannot start: no such file")
    assert job.task("worker", 0).pid == 0 and job.task("worker", 0).running_since == 0.0
    assert job.state != JobState.RUNNING


@pytest.mark.parametrize("roles, order", [
    ({"worker": {"count": 2}}, ["worker:0", "worker:1"]),
    ({"chief": {"count": 1}, "worker": {"count": 2}}, ["chief:0", "worker:1", "worker:0"]),
])
def test_success_needs_every_training_task_whatever_the_exit_order(roles, order):
    sim = three_nodes()
    job, _ = start(sim, mwms(roles=roles))
    for key in order[:-1]:
        assert sim.exit(job, key, 0) == []
        assert job.state == JobState.RUNNING, f"done after only {key}"
    sim.exit(job, order[-1], 0)
    assert job.state == JobState.SUCCEEDED


def test_training_done_tells_the_evaluator_the_final_checkpoint_then_succeeds():
    sim = three_nodes()
    job, _ = start(sim, mwms())
    sim.exit(job, "worker:1", 0)
    actions = sim.exit(job, "worker:0", 0, final_checkpoint="ckpt-7")
    assert len(actions) == 1 and isinstance(actions[0], FinishTraining)
    assert (actions[0].attempt.type, actions[0].final_checkpoint) == ("evaluator", "ckpt-7")
    assert actions[0].attempt.number == job.task("evaluator", 0).attempt
    assert job.state == JobState.RUNNING and "ckpt-7" in job.message
    assert sim.exit(job, "evaluator:0", 0) == []
    assert job.state == JobState.SUCCEEDED
    assert sim.free() == {"n1": ([0, 1], []), "n2": ([0, 1], []), "n3": ([], [])}


def test_final_evaluation_is_bounded_by_its_deadline():
    sim = three_nodes()
    job, _ = start(sim, mwms())
    sim.exit(job, "worker:1", 0)
    sim.exit(job, "worker:0", 0, final_checkpoint="ckpt-2")
    sim.now += job.spec.evaluator_deadline_seconds - 1
    sim.heartbeat_all()
    assert stops(sim.c.tick(sim.now)) == []
    sim.now += 2
    sim.heartbeat_all()
    actions = sim.c.tick(sim.now)
    assert keys(actions) == ["evaluator:0"] and job.state == JobState.STOPPING
    sim.exit_stopped(job, actions)
    assert job.state == JobState.SUCCEEDED
    assert job.message == ("the evaluator did not evaluate the final checkpoint ckpt-2 within "
                           "evaluator_deadline_seconds = 600; stopped it")


# ---- restarts ---------------------------------------------------------------------------------

def test_worker_failure_restarts_the_whole_group_on_the_same_addresses():
    sim = three_nodes()
    job, first = start(sim, mwms())
    before = {task_of(a).key: (a.node, task_of(a).address, a.env["TF_CONFIG"], a.env["CUDA_VISIBLE_DEVICES"])
              for a in first}
    actions = sim.exit(job, "worker:1", 1, log_tail=["Traceback", "RuntimeError: boom"])
    assert job.state == JobState.STOPPING
    assert keys(actions) == ["evaluator:0", "worker:0"]
    assert all(isinstance(a, Stop) and a.attempt.number == 1 and a.grace_seconds == 30.0 for a in actions)
    assert job.last_failure.task == "worker:1" and job.last_failure.exit.exit_code == 1
    assert job.last_failure.exit.log_tail == ("Traceback", "RuntimeError: boom")
    assert "worker:1" in job.message and "exited with code 1" in job.message

    assert sim.exit_stopped(job, actions[:1]) == []
    assert job.state == JobState.STOPPING  # one survivor left
    relaunch = sim.exit_stopped(job, actions[1:])
    assert job.state == JobState.STARTING and job.restarts == 1
    assert keys(relaunch) == ["evaluator:0", "worker:0", "worker:1"]
    after = {task_of(a).key: (a.node, task_of(a).address, a.env["TF_CONFIG"], a.env["CUDA_VISIBLE_DEVICES"])
             for a in relaunch}
    assert after == before
    for a in relaunch:
        assert task_of(a).attempt == 2 and a.env["TFCLUSTER_ATTEMPT"] == "2"
    assert sim.running(job, relaunch) == []
    assert job.state == JobState.RUNNING


def test_restart_budget_spent_fails_naming_task_and_exit_code():
    sim = three_nodes()
    job, actions = start(sim, mwms(roles={"worker": {"count": 2}}, restart={"max_restarts": 1}))
    relaunch = sim.exit_stopped(job, sim.exit(job, "worker:0", 3))
    assert job.restarts == 1 and job.state == JobState.STARTING
    sim.running(job, relaunch)
    stop = sim.exit(job, "worker:1", 5)
    assert job.state == JobState.STOPPING and keys(stop) == ["worker:0"]
    assert sim.exit_stopped(job, stop) == []
    assert job.state == JobState.FAILED
    assert job.restarts == 1
    assert "worker:1" in job.message and "exited with code 5" in job.message and "budget spent" in job.message
    assert job.last_failure.describe().startswith("worker:1 on n")


def test_no_restarts_allowed_fails_at_first_failure():
    sim = three_nodes()
    job, _ = start(sim, mwms(roles={"worker": {"count": 1}}, strategy="mirrored", restart={"max_restarts": 0}))
    assert sim.exit(job, "worker:0", None, signal=9) == []
    assert job.state == JobState.FAILED
    assert "worker:0" in job.message and "SIGKILL" in job.message


def test_preemption_exit_42_restarts_without_using_the_budget():
    sim = three_nodes()
    job, _ = start(sim, mwms(roles={"worker": {"count": 2}}, restart={"max_restarts": 0}))
    for attempt in (2, 3):
        stop = sim.exit(job, "worker:0", 42)
        assert job.state == JobState.STOPPING
        assert "preemption" in job.message and job.last_failure.exit.exit_code == 42
        # Under MWMS every worker saves and exits 42 itself.
        relaunch = sim.exit(job, "worker:1", 42)
        assert job.state == JobState.STARTING
        assert keys(relaunch) == ["worker:0", "worker:1"] and keys(stop) == ["worker:1"]
        assert all(task_of(a).attempt == attempt for a in relaunch)
        sim.running(job, relaunch)
    assert job.restarts == 0 and job.preemptions == 2


def test_permanent_exit_code_fails_at_once():
    sim = three_nodes()
    job, _ = start(sim, mwms(restart={"max_restarts": 5, "permanent_exit_codes": [7]}))
    stop = sim.exit(job, "worker:0", 7)
    assert keys(stop) == ["evaluator:0", "worker:1"]
    sim.exit_stopped(job, stop)
    assert job.state == JobState.FAILED and job.restarts == 0
    assert "worker:0" in job.message and "code 7" in job.message and "permanent" in job.message


def test_failure_while_starting_restarts_too():
    sim = three_nodes()
    job, actions = sim.submit(mwms(roles={"worker": {"count": 2}}))
    sim.report(job, "worker", 0, "RUNNING")
    stop = sim.report(job, "worker", 1, "FAILED_TO_START", message="python: not found")
    assert job.state == JobState.STOPPING and keys(stop) == ["worker:0"]
    assert "python: not found" in job.message
    relaunch = sim.exit_stopped(job, stop)
    assert keys(relaunch) == ["worker:0", "worker:1"] and job.restarts == 1


def test_restart_backoff_waits_for_tick():
    sim = three_nodes()
    job, _ = start(sim, mwms(roles={"worker": {"count": 1}}, strategy="mirrored",
                             restart={"backoff_seconds": 10}))
    assert sim.exit(job, "worker:0", 1) == []
    assert job.state == JobState.PENDING and job.not_before == sim.now + 10
    sim.now += 5
    sim.heartbeat_all()
    assert sim.c.tick(sim.now) == []
    sim.now += 6
    sim.heartbeat_all()
    relaunch = sim.c.tick(sim.now)
    assert keys(relaunch) == ["worker:0"] and task_of(relaunch[0]).attempt == 2


def test_evaluator_failure_restarts_only_the_evaluator():
    sim = three_nodes()
    job, _ = start(sim, mwms())
    workers = [(t.state, t.attempt, t.pid) for t in job.training_tasks()]
    actions = sim.exit(job, "evaluator:0", 1)
    assert keys(actions) == ["evaluator:0"] and isinstance(actions[0], Launch)
    assert task_of(actions[0]).attempt == 2 and actions[0].env["TFCLUSTER_ATTEMPT"] == "2"
    assert job.state == JobState.RUNNING
    assert [(t.state, t.attempt, t.pid) for t in job.training_tasks()] == workers
    assert "evaluator restarted" in job.message
    assert sim.report(job, "evaluator", 0, "RUNNING") == []
    assert job.state == JobState.RUNNING
    # Training still ends normally, with the restarted evaluator's final evaluation.
    sim.exit(job, "worker:1", 0)
    finish = sim.exit(job, "worker:0", 0)
    assert [a.attempt.number for a in finish if isinstance(a, FinishTraining)] == [2]
    sim.exit(job, "evaluator:0", 0)
    assert job.state == JobState.SUCCEEDED


def test_evaluator_failures_never_fail_the_job():
    sim = three_nodes()
    job, _ = start(sim, mwms(restart={"max_restarts": 0}))
    assert sim.exit(job, "evaluator:0", 1) == []  # budget spent: not restarted, but training goes on
    assert job.state == JobState.RUNNING and "evaluator not restarted" in job.message
    sim.exit(job, "worker:1", 0)
    assert sim.exit(job, "worker:0", 0) == []
    assert job.state == JobState.SUCCEEDED


# ---- parameter server -------------------------------------------------------------------------

def ps_spec(**kw):
    return make_spec(strategy="parameter_server", chief=1, worker=2, ps={"count": 2, "gpus": 0},
                     evaluator={"count": 1, "gpus": 0}, **kw)


def test_parameter_server_chief_starts_after_ps_and_workers_and_success_stops_the_rest():
    sim = Sim(info("n1"), info("n2"), info("n3"))
    job, actions = sim.submit(ps_spec())
    assert keys(actions) == ["evaluator:0", "ps:0", "ps:1", "worker:0", "worker:1"]
    assert job.task("chief", 0).state == TaskState.PENDING
    for a in actions:
        assert a.env["GRPC_FAIL_FAST"] == "use_caller"
        if task_of(a).type in ("worker", "ps"):
            assert a.command == ("python", "-m", "tfcluster.roles.server")
        else:
            assert a.command == ("python", "train.py")
        tf_config = json.loads(a.env["TF_CONFIG"])
        assert sorted(tf_config["cluster"]) == ["chief", "ps", "worker"]
    assert {task_of(a).key: a.report_listening for a in actions} == {
        "evaluator:0": False, "ps:0": True, "ps:1": True, "worker:0": True, "worker:1": True}
    out = []
    for a in actions:
        out += sim.report(job, task_of(a).type, task_of(a).index, "RUNNING", listening=False)
    assert out == [] and job.state == JobState.STARTING, "running is not enough: ps and workers must listen"
    servers = [a for a in actions if a.report_listening]
    for a in servers[:-1]:
        out += sim.report(job, task_of(a).type, task_of(a).index, "RUNNING", listening=True)
    assert out == [] and job.state == JobState.STARTING
    chief = sim.report(job, task_of(servers[-1]).type, task_of(servers[-1]).index, "RUNNING", listening=True)
    assert keys(chief) == ["chief:0"] and task_of(chief[0]).attempt == 1
    assert chief[0].command == ("python", "train.py") and not chief[0].report_listening
    assert job.state == JobState.STARTING
    sim.report(job, "chief", 0, "RUNNING")
    assert job.state == JobState.RUNNING

    finish = sim.exit(job, "chief:0", 0, final_checkpoint="ckpt-4")
    assert [(type(a), a.final_checkpoint) for a in finish] == [(FinishTraining, "ckpt-4")]
    assert job.state == JobState.RUNNING, "ps and workers serve on while the final evaluation runs"
    stop = sim.exit(job, "evaluator:0", 0)
    assert keys(stop) == ["ps:0", "ps:1", "worker:0", "worker:1"]
    assert all(isinstance(s, Stop) for s in stop)
    assert job.state == JobState.STOPPING
    # The servers die of the SIGTERM (or exit non-zero on it): that is no failure.
    for s in stop[:2]:
        sim.report(job, s.attempt.type, s.attempt.index, "EXITED", exit_code=None, signal=15)
    for s in stop[2:]:
        sim.report(job, s.attempt.type, s.attempt.index, "EXITED", exit_code=1)
    assert job.state == JobState.SUCCEEDED and job.restarts == 0 and job.last_failure is None
    assert job.task("evaluator", 0).state == TaskState.SUCCEEDED


def test_parameter_server_chief_failure_restarts_ps_and_chief_while_workers_stay():
    sim = Sim(info("n1"), info("n2"), info("n3"))
    job, actions = sim.submit(ps_spec())
    sim.running(job, sim.running(job, actions))
    assert job.state == JobState.RUNNING
    workers = [(t.attempt, t.pid) for t in job.tasks if t.type == "worker"]
    addresses = {t.key: t.address for t in job.tasks}
    stop = sim.exit(job, "chief:0", 1)
    assert keys(stop) == ["ps:0", "ps:1"] and job.state == JobState.STOPPING
    relaunch = sim.exit_stopped(job, stop)
    assert job.restarts == 1 and job.state == JobState.STARTING
    assert keys(relaunch) == ["ps:0", "ps:1"], "ps first; the chief waits until they listen"
    chief = sim.running(job, relaunch)
    assert keys(chief) == ["chief:0"] and task_of(chief[0]).attempt == 2
    sim.running(job, chief)
    assert job.state == JobState.RUNNING
    assert [(t.attempt, t.pid) for t in job.tasks if t.type == "worker"] == workers, "workers were not touched"
    assert {t.key: t.address for t in job.tasks} == addresses, "same addresses: TF_CONFIGs stay valid"


def test_parameter_server_ps_failure_restarts_ps_and_chief():
    sim = Sim(info("n1"), info("n2"), info("n3"))
    job, actions = sim.submit(ps_spec())
    sim.running(job, sim.running(job, actions))
    stop = sim.exit(job, "ps:1", None, signal=9)
    assert keys(stop) == ["chief:0", "ps:0"]
    assert "ps:1" in job.message and "SIGKILL" in job.message
    relaunch = sim.exit_stopped(job, stop)
    assert keys(relaunch) == ["ps:0", "ps:1"] and job.restarts == 1


def test_parameter_server_worker_failure_restarts_that_worker_alone():
    sim = Sim(info("n1"), info("n2"), info("n3"))
    job, actions = sim.submit(ps_spec())
    sim.running(job, sim.running(job, actions))
    others = {t.key: (t.attempt, t.state) for t in job.tasks if t.key != "worker:1"}
    address = job.task("worker", 1).address
    again = sim.exit(job, "worker:1", None, signal=9)
    assert keys(again) == ["worker:1"] and isinstance(again[0], Launch)
    assert task_of(again[0]).attempt == 2 and task_of(again[0]).address == address
    assert job.state == JobState.RUNNING and job.restarts == 1
    assert {t.key: (t.attempt, t.state) for t in job.tasks if t.key != "worker:1"} == others
    sim.running(job, again)
    assert job.task("worker", 1).state == TaskState.RUNNING


def test_parameter_server_task_on_a_lost_node_restarts_the_whole_group_elsewhere():
    sim = Sim(info("n1"), info("n2"), info("n3"), info("n4"))
    job, actions = sim.submit(ps_spec())
    sim.running(job, sim.running(job, actions))
    lost_node = job.task("worker", 1).node
    sim.now += 4
    sim.heartbeat_all(lost_node)
    stop = sim.c.tick(sim.now)
    assert job.state == JobState.STOPPING and "lost" in job.message
    sim.exit_stopped(job, stop)
    assert job.state == JobState.STARTING, "re-placed on the remaining nodes at once"
    assert all(t.node != lost_node for t in job.tasks)


def test_a_failure_outside_a_partial_restart_escalates_to_the_whole_group():
    sim = Sim(info("n1"), info("n2"), info("n3"))
    job, actions = sim.submit(ps_spec())
    sim.running(job, sim.running(job, actions))
    stop = sim.exit(job, "chief:0", 1)
    assert keys(stop) == ["ps:0", "ps:1"]
    more = sim.exit(job, "worker:0", 1)
    assert keys(more) == ["evaluator:0", "worker:1"]
    sim.exit_stopped(job, stop + more)
    assert job.state == JobState.STARTING
    assert {t.attempt for t in job.tasks if t.type != "chief"} == {2}


def test_evaluator_has_a_budget_of_its_own():
    sim = three_nodes()
    job, _ = start(sim, mwms(restart={"max_restarts": 1}))
    relaunch = sim.exit(job, "evaluator:0", 1)
    assert keys(relaunch) == ["evaluator:0"] and job.evaluator_restarts == 1 and job.restarts == 0
    sim.running(job, relaunch)
    assert sim.exit(job, "evaluator:0", 1) == [], "its restarts are spent"
    assert "training goes on" in job.message and job.state == JobState.RUNNING
    sim.exit(job, "worker:1", 1)  # training still has its whole budget
    assert job.state == JobState.STOPPING and "restarting the training group" in job.message


def test_evaluator_on_a_lost_node_is_placed_again_without_touching_training():
    sim = Sim(info("n1"), info("n2"), info("n3"), info("n4"))
    job, actions = sim.submit(make_spec(worker=2, evaluator={"count": 1, "nodes": ["n3", "n4"]}))
    sim.running(job, actions)
    evaluator = job.task("evaluator", 0)
    lost = evaluator.node
    workers = {t.key: (t.attempt, t.node) for t in job.training_tasks()}
    sim.now += 4
    sim.heartbeat_all(lost)
    relaunch = sim.c.tick(sim.now)
    assert keys(relaunch) == ["evaluator:0"]
    assert relaunch[0].node in ("n3", "n4") and relaunch[0].node != lost
    assert task_of(relaunch[0]).attempt == 2
    tf_config = json.loads(relaunch[0].env["TF_CONFIG"])
    assert tf_config["task"] == {"type": "evaluator", "index": 0} and "evaluator" not in tf_config["cluster"]
    assert {t.key: (t.attempt, t.node) for t in job.training_tasks()} == workers
    assert job.state == JobState.RUNNING


def test_hang_watchdog_restarts_a_job_whose_tasks_make_no_progress():
    sim = three_nodes()
    job, _ = start(sim, mwms(restart={"hang_seconds": 30}))
    worker = job.task("worker", 0)
    for _ in range(5):  # output keeps growing: not hung
        sim.now += 20
        progress = [TaskProgress(Attempt(job.id, "worker", 0, worker.attempt), output_bytes=int(sim.now))]
        for name in sim.c.nodes:
            sim.c.heartbeat(name, f"session-{name}", sim.now, progress if name == worker.node else [])
        assert stops(sim.c.tick(sim.now)) == []
    sim.now += 31
    sim.heartbeat_all()
    stop = sim.c.tick(sim.now)
    assert job.state == JobState.STOPPING and len(stops(stop)) == 3
    assert "hung" in job.message and "hang_seconds = 30" in job.message


def test_restarted_group_gets_the_same_addresses():
    sim = three_nodes()
    job, first = start(sim, mwms(roles={"worker": {"count": 2}}))
    before = {t.key: t.address for t in job.tasks}
    relaunch = sim.exit_stopped(job, sim.exit(job, "worker:1", 1))
    assert {task_of(a).key: task_of(a).address for a in launches(relaunch)} == before


# ---- placement over time ----------------------------------------------------------------------

def test_job_that_can_never_fit_is_refused():
    sim = three_nodes()
    with pytest.raises(Unplaceable, match="GPU"):
        sim.submit(make_spec(gpus=4, worker=2))
    with pytest.raises(Unplaceable, match="GPU"):
        sim.submit(make_spec(gpus=2, worker=3))  # 6 GPUs; the cluster has 4
    assert sim.c.jobs == {}


def test_pending_job_waits_then_starts_when_another_finishes():
    sim = three_nodes()
    a, _ = start(sim, make_spec(gpus=2, worker=1, strategy="mirrored"), "a")
    b, _ = start(sim, make_spec(gpus=2, worker=1, strategy="mirrored"), "b")
    assert {a.task("worker", 0).node, b.task("worker", 0).node} == {"n1", "n2"}
    c, actions = sim.submit(make_spec(gpus=1, worker=2), "c")
    assert actions == [] and c.state == JobState.PENDING
    assert c.message.startswith("waiting for resources:") and "GPU" in c.message
    assert sim.c.tick(sim.now) == [] and c.state == JobState.PENDING
    launched = sim.exit(a, "worker:0", 0)
    assert a.state == JobState.SUCCEEDED
    # The freed node has 2 GPUs: both 1-GPU workers land there, on different GPUs.
    assert keys(launched) == ["worker:0", "worker:1"] and c.state == JobState.STARTING
    assert {x.node for x in launched} == {a.task("worker", 0).node}
    assert len({g.index for x in launched for g in task_of(x).gpus}) == 2


def test_pending_jobs_start_oldest_first():
    sim = Sim(info("n1", 1))
    a, _ = start(sim, make_spec(gpus=1, worker=1, strategy="mirrored"), "a")
    sim.now += 1
    b, _ = sim.submit(make_spec(gpus=1, worker=1, strategy="mirrored"), "b")
    sim.now += 1
    c, _ = sim.submit(make_spec(gpus=1, worker=1, strategy="mirrored"), "c")
    assert b.state == c.state == JobState.PENDING
    launched = sim.exit(a, "worker:0", 0)
    assert [x.attempt.job_id for x in launched] == [b.id] and c.state == JobState.PENDING


def test_plan_changes_nothing():
    sim = three_nodes()
    plan = sim.c.plan(mwms(), sim.now)
    assert plan.strategy == "multi_worker_mirrored" and plan.reason == ""
    assert len(plan.placement) == 3 and set(plan.tf_configs) == {("worker", 0), ("worker", 1), ("evaluator", 0)}
    assert sim.c.jobs == {}
    assert sim.free() == {"n1": ([0, 1], []), "n2": ([0, 1], []), "n3": ([], [])}
    bad = sim.c.plan(make_spec(gpus=8, worker=1, strategy="mirrored"), sim.now)
    assert bad.placement is None and "GPU" in bad.reason


# ---- nodes ------------------------------------------------------------------------------------

def test_heartbeat_needs_the_current_session():
    sim = three_nodes()
    assert sim.c.heartbeat("n1", "session-n1", sim.now + 1) == []
    assert sim.c.heartbeat("n1", "old-session", sim.now + 1) is None
    assert sim.c.heartbeat("nope", "session-n1", sim.now + 1) is None


def test_a_node_below_its_disk_floor_gets_no_new_tasks_until_it_recovers():
    sim = Sim(info("n1", 2), info("n2", 2))
    low = "free disk under /state/n1 is 0.4 GiB, below the floor of 1 GiB (--min-free-disk)"
    assert sim.c.heartbeat("n1", "session-n1", sim.now, condition=low) == []
    a, _ = start(sim, make_spec(gpus=2, worker=1, strategy="mirrored"), "a")
    assert a.task("worker", 0).node == "n2"  # placed where new tasks are taken
    b, actions = sim.submit(make_spec(gpus=1, worker=1, strategy="mirrored"), "b")  # fits on n1 alone, by GPUs
    assert actions == [] and b.state == JobState.PENDING
    assert b.message.endswith(f"n1 takes no new tasks: {low}")
    assert sim.c.plan(make_spec(gpus=1, worker=1, strategy="mirrored"), sim.now).placement is None
    # Disk freed: the next heartbeat says so, and the waiting job goes there.
    launched = sim.c.heartbeat("n1", "session-n1", sim.now + 1, condition="") + sim.c.tick(sim.now + 1)
    assert keys(launched) == ["worker:0"] and launched[0].node == "n1" and b.state == JobState.STARTING


def test_silent_node_is_lost_and_its_job_restarts_elsewhere():
    sim = Sim(info("n1", 1), info("n2", 1), info("n3", 1))
    job, _ = start(sim, mwms(roles={"worker": {"count": 2}}))
    nodes = {t.key: t.node for t in job.tasks}
    assert sorted(nodes.values()) == ["n1", "n2"]
    lost_key = next(k for k, n in nodes.items() if n == "n1")
    survivor_key = next(k for k, n in nodes.items() if n == "n2")

    sim.now += 2.0
    sim.heartbeat_all("n1")
    assert sim.c.tick(sim.now) == []
    assert sim.c.nodes["n1"].state == NodeState.READY  # 2 s silent: not yet
    sim.now += 2.0
    sim.heartbeat_all("n1")
    stop = sim.c.tick(sim.now)
    assert sim.c.nodes["n1"].state == NodeState.LOST
    assert sim.c.heartbeat("n1", "session-n1", sim.now) is None  # it must register again
    lost = next(t for t in job.tasks if t.key == lost_key)
    assert lost.state == TaskState.LOST and "n1 lost" in lost.message
    assert keys(stop) == [survivor_key] and stop[0].node == "n2"
    assert job.state == JobState.STOPPING
    assert "n1" not in [n.name for n in sim.c.capacity(sim.now)]

    relaunch = sim.exit_stopped(job, stop)
    assert keys(relaunch) == ["worker:0", "worker:1"]
    placed = {task_of(a).key: a.node for a in relaunch}
    assert placed[survivor_key] == "n2"  # kept where it was
    assert placed[lost_key] == "n3"      # moved off the lost node
    assert job.restarts == 1 and all(task_of(a).attempt == 2 for a in relaunch)


def test_most_of_a_large_cluster_falling_silent_at_once_waits_before_anything_is_lost():
    from tfcluster.daemon.coordinator.core.model.node_table import MASS_SILENCE_PATIENCE_SECONDS
    sim = Sim(*(replace(info(f"n{i:02d}", 1), address=f"10.0.1.{i}") for i in range(20)))
    job, _ = start(sim, make_spec(strategy="mirrored", gpus=1, worker=1))
    sim.now += 5  # a stall of the coordinator: 17 of 20 nodes' heartbeats wait unprocessed in its queues
    sim.heartbeat_all(*(f"n{i:02d}" for i in range(17)))
    assert sim.c.tick(sim.now) == [] and all(n.state == NodeState.READY for n in sim.c.nodes.values())
    sim.now += 1  # heartbeats are processed again: the nodes come back and never were lost
    sim.heartbeat_all()
    assert sim.c.tick(sim.now) == [] and job.restarts == 0
    assert all(n.state == NodeState.READY for n in sim.c.nodes.values())
    silent = [n for n in sim.c.nodes if n != job.task("worker", 0).node][:15]
    sim.now += 5  # 15 of 20 really gone: they are lost once the patience is over, and not before
    sim.heartbeat_all(*silent)
    assert sim.c.tick(sim.now) == [] and sim.c.nodes[silent[0]].state == NodeState.READY
    sim.now += MASS_SILENCE_PATIENCE_SECONDS
    sim.heartbeat_all(*silent)
    sim.c.tick(sim.now)
    assert [n for n in silent if sim.c.nodes[n].state == NodeState.LOST] == silent
    assert job.restarts == 0  # its own node kept beating


def test_after_a_takeover_nodes_still_queued_to_come_back_are_not_lost_while_the_others_keep_coming():
    # A new leader loaded 40 READY nodes from the store. Their agents come back two a second, as a storm of
    # registrations queued on a busy coordinator does, well past the reconnect grace (10 s) and the timeout (3 s).
    from tfcluster.daemon.coordinator.core.model.node_table import RETURN_PATIENCE_CAP_SECONDS
    nodes = [replace(info(f"n{i:02d}", 1), address=f"10.0.1.{i}") for i in range(40)]
    sim = Sim(*nodes)
    job, _ = start(sim, make_spec(strategy="mirrored", gpus=1, worker=1))
    late = job.task("worker", 0).node  # the node running the job comes back among the last
    order = [n for n in nodes if n.name != late][:30] + [next(n for n in nodes if n.name == late)]
    sim.c.nodes.await_return(sim.now, 10.0)
    task = job.task("worker", 0)
    running = [report(job.id, "worker", 0, task.attempt, "RUNNING", pid=task.pid)]
    for second in range(16):  # two a second: the 31st, the job's node, is back after 15.5 s
        sim.now += 0.5
        for n in order[2 * second:2 * second + 2]:
            sim.c.register(n, running if n.name == late else [], f"again-{n.name}", sim.now)
        sim.now += 0.5
        waiting = [n.name for n in nodes if n not in order[:2 * second + 2]]
        sim.heartbeat_all(*waiting)  # those back beat on
        assert sim.c.tick(sim.now) == [], f"{second + 1} s after the takeover"
        assert all(sim.c.nodes[n].state == NodeState.READY for n in waiting), f"{second + 1} s after the takeover"
    assert job.restarts == 0 and sim.c.nodes[late].state == NodeState.READY
    # The returns stopped: the 9 nodes never heard from are lost once the timeout passed since the last return.
    gone = [n.name for n in nodes if n not in order]
    sim.now += 2.0
    sim.heartbeat_all(*gone)
    sim.c.tick(sim.now)
    assert all(sim.c.nodes[n].state == NodeState.READY for n in gone)
    sim.now += 1.5
    sim.heartbeat_all(*gone)
    sim.c.tick(sim.now)
    assert [n for n in gone if sim.c.nodes[n].state == NodeState.LOST] == gone
    assert job.restarts == 0

    # Returns that trickle on for ever hold off the rest no longer than the cap after the takeover.
    sim = Sim(*nodes)
    sim.c.nodes.await_return(sim.now, 10.0)
    began, i = sim.now, 0
    while sim.now - began < RETURN_PATIENCE_CAP_SECONDS + 1:
        sim.now += 1.0
        if i < 30:
            sim.c.register(nodes[i], [], f"again-{i}", sim.now)
            i += 1
        sim.heartbeat_all(*(n.name for n in nodes[i:]))  # those back keep beating; the others stay silent
        sim.c.tick(sim.now)
        if sim.now - began < 32:  # still returning one a second
            assert all(sim.c.nodes[n.name].state == NodeState.READY for n in nodes)
    assert [n.name for n in nodes if sim.c.nodes[n.name].state == NodeState.LOST] == [n.name for n in nodes[30:]]


def test_a_cluster_past_its_heartbeat_bound_beats_less_often_and_waits_as_much_longer_before_a_node_is_lost():
    from tfcluster.daemon.coordinator.core.cluster import Cluster
    c = Cluster(lost_after_seconds=3.0, heartbeat_interval_seconds=1.0, max_heartbeats_per_second=10)
    nodes = [replace(info(f"n{i:02d}", 1), address=f"10.0.1.{i}") for i in range(30)]
    now = 100.0

    def beat_all_but(*silent: str) -> None:
        for n in c.nodes.values():
            if n.name not in silent:
                c.heartbeat(n.name, n.seen.session_id, now)

    for n in nodes[:10]:
        c.register(n, [], f"s-{n.name}", now)
    assert (c.nodes.pace.interval, c.nodes.lost_after) == (1.0, 3.0)  # 10 nodes at 1 Hz: within the bound
    for n in nodes[10:25]:
        c.register(n, [], f"s-{n.name}", now)
    assert (c.nodes.pace.interval, c.nodes.lost_after) == (2.5, 7.5)  # 25 nodes: 10 heartbeats a second
    # The agents registered before are told, once.
    pace = c.nodes.pace
    assert pace.to_tell() == 2.5 and pace.to_tell() is None
    # One more node outgrows the step: the next one, 3 s, told at once; the nodes that join within it change nothing.
    c.register(nodes[25], [], "s-n25", now)
    assert (pace.interval, c.nodes.lost_after, pace.to_tell()) == (3.0, 9.0, 3.0)
    for n in nodes[26:]:
        c.register(n, [], f"s-{n.name}", now)
    assert (pace.interval, pace.to_tell()) == (3.0, None)
    for n in nodes[25:]:
        c.remove_node(n.name, now)
    now += 6.0  # two of the longer intervals without a word from n00: not lost
    beat_all_but("n00")
    c.tick(now)
    assert c.nodes["n00"].state == NodeState.READY
    now += 3.5  # 9.5 s
    beat_all_but("n00")
    c.tick(now)
    assert c.nodes["n00"].state == NodeState.LOST
    # Fewer nodes do not shorten it again: the agents told 3 s keep that interval until they register again.
    for n in nodes[:20]:
        c.remove_node(n.name, now)
    now += 8.0
    beat_all_but(*(n.name for n in nodes[20:22]))
    c.tick(now)
    assert c.nodes.lost_after == 9.0 and c.nodes["n20"].state == NodeState.READY


def test_the_pace_keeps_under_its_bound_at_every_size_and_is_told_only_when_the_cluster_outgrows_a_step():
    from tfcluster.daemon.coordinator.core.model.pace import Pace
    pace, told = Pace(interval=1.0, lost_after=3.0, max_per_second=1000), []
    for nodes in range(1, 20_001):
        pace.fit(nodes)
        assert nodes / pace.interval <= 1000, f"{nodes} nodes every {pace.interval} s: over the bound"
        assert pace.interval <= max(1.0, nodes / 1000) * 4 / 3, f"{nodes} nodes: {pace.interval} s is a step too far"
        if pace.to_tell() is not None:
            told.append((nodes, pace.interval))
    assert told == [(1001, 1.25), (1251, 1.5), (1501, 2.0), (2001, 2.5), (2501, 3.0), (3001, 4.0), (4001, 5.0),
                    (5001, 6.0), (6001, 8.0), (8001, 10.0), (10001, 12.5), (12501, 15.0), (15001, 20.0)]
    assert (pace.interval, pace.lost_after) == (20.0, 60.0)


def test_silence_while_the_coordinator_could_not_listen_does_not_count():
    sim = Sim(info("n1", 1), info("n2", 1))
    heard = {name: node.seen.last_seen for name, node in sim.c.nodes.items()}
    sim.now += 2.5
    sim.c.nodes.forgive_silence(2.0)  # its loop was blocked for 2 s: the heartbeats of that time wait unread
    sim.now += 1.5
    sim.c.tick(sim.now)
    assert all(n.state == NodeState.READY for n in sim.c.nodes.values())  # 4 s since heard, 2 s of them deaf
    sim.now += 1.1
    sim.c.tick(sim.now)
    assert all(n.state == NodeState.LOST for n in sim.c.nodes.values())
    # A lost node keeps what it was forgiven: its tasks' grace counts from there too (node_events.py's _orphans).
    assert {name: node.seen.last_seen for name, node in sim.c.nodes.items()} == \
        {name: at + 2.0 for name, at in heard.items()}


def test_lost_node_with_the_whole_job_restarts_on_tick():
    sim = Sim(info("n1", 2), info("n2", 2))
    job, _ = start(sim, make_spec(strategy="mirrored", gpus=2, worker=1))
    node = job.task("worker", 0).node
    other = "n2" if node == "n1" else "n1"
    sim.now += 5
    sim.heartbeat_all(node)
    relaunch = sim.c.tick(sim.now)
    assert keys(relaunch) == ["worker:0"] and relaunch[0].node == other
    assert task_of(relaunch[0]).attempt == 2 and job.restarts == 1


def test_lost_node_and_no_room_waits_pending():
    sim = Sim(info("n1"), info("n2"))
    job, _ = start(sim, make_spec(worker={"count": 1, "nodes": ["n1"]}, strategy="mirrored"))
    sim.now += 5
    sim.heartbeat_all("n1")
    assert sim.c.tick(sim.now) == []
    assert job.state == JobState.PENDING and "n1" in job.message


# ---- reports and re-registration --------------------------------------------------------------

def test_stale_attempt_running_report_is_told_to_stop():
    sim = three_nodes()
    job, _ = start(sim, mwms(roles={"worker": {"count": 2}}))
    relaunch = sim.exit_stopped(job, sim.exit(job, "worker:0", 1))
    sim.running(job, relaunch)
    w1 = job.task("worker", 1)
    actions = sim.report(job, "worker", 1, "RUNNING", attempt=1)
    assert actions == [Stop(node=w1.node, attempt=Attempt(job.id, "worker", 1, 1),
                              grace_seconds=30.0)]
    assert w1.state == TaskState.RUNNING and w1.attempt == 2 and job.state == JobState.RUNNING
    # A stale exit changes nothing either.
    assert sim.report(job, "worker", 1, "EXITED", attempt=1, exit_code=1) == []
    assert w1.state == TaskState.RUNNING and job.state == JobState.RUNNING


def test_running_report_from_the_wrong_node_is_told_to_stop():
    sim = three_nodes()
    job, _ = start(sim, mwms(roles={"worker": {"count": 2}}))
    actions = sim.report(job, "worker", 0, "RUNNING", node="n3")
    assert keys(actions) == ["worker:0"] and actions[0].node == "n3"
    assert job.state == JobState.RUNNING


def test_unknown_job_running_report_is_told_to_stop():
    sim = three_nodes()
    r = report("gone", "worker", 0, 3, "RUNNING", pid=9)
    assert sim.c.report("n1", r, sim.now) == [Stop(node="n1", attempt=Attempt("gone", "worker", 0, 3),
                                                      grace_seconds=0.0)]
    r = report("gone", "worker", 0, 3, "EXITED", exit_code=0)
    assert sim.c.report("n1", r, sim.now) == []


def test_register_reconciles_with_the_agents_reports():
    sim = Sim(info("n1"), info("n2"))
    job, actions = sim.submit(mwms(roles={"worker": {"count": 2}}, gpus=0))
    w_n1 = next(t for t in job.tasks if t.node == "n1")
    w_n2 = next(t for t in job.tasks if t.node == "n2")
    sim.report(job, w_n1.type, w_n1.index, "RUNNING", pid=77)
    assert w_n1.state == TaskState.RUNNING and w_n2.state == TaskState.LAUNCHING

    # n1's agent reconnects: still runs its task, plus a task of a job the coordinator does not know.
    sim.now += 1
    reports = [report(job.id, w_n1.type, w_n1.index, w_n1.attempt, "RUNNING", pid=77),
               report("old-job", "worker", 0, 1, "RUNNING", pid=55)]
    actions = sim.c.register(info("n1"), reports, "session-n1-b", sim.now)
    assert actions == [Stop(node="n1", attempt=Attempt("old-job", "worker", 0, 1),
                              grace_seconds=0.0)]
    assert w_n1.state == TaskState.RUNNING and w_n1.pid == 77 and w_n1.attempt == 1
    assert sim.c.heartbeat("n1", "session-n1-b", sim.now) is not None
    assert sim.c.heartbeat("n1", "session-n1", sim.now) is None

    # n2's agent reconnects without the task it was told to launch: the same launch is sent again.
    actions = sim.c.register(info("n2"), [], "session-n2-b", sim.now)
    assert len(actions) == 1 and isinstance(actions[0], Launch)
    assert actions[0].node == "n2" and task_of(actions[0]) is w_n2 and w_n2.attempt == 1
    assert actions[0].env["TFCLUSTER_ATTEMPT"] == "1"
    assert w_n2.state == TaskState.LAUNCHING and job.state == JobState.STARTING
    sim.report(job, w_n2.type, w_n2.index, "RUNNING")
    assert job.state == JobState.RUNNING


def test_register_without_a_running_task_counts_it_lost():
    sim = Sim(info("n1"), info("n2"))
    job, _ = start(sim, mwms(roles={"worker": {"count": 2}}, gpus=0))
    w_n1 = next(t for t in job.tasks if t.node == "n1")
    w_n2 = next(t for t in job.tasks if t.node == "n2")
    actions = sim.c.register(info("n1"), [], "session-n1-b", sim.now)
    assert w_n1.state == TaskState.LOST and "no longer has this task" in w_n1.message
    assert keys(actions) == [w_n2.key] and isinstance(actions[0], Stop)
    relaunch = sim.exit_stopped(job, actions)
    assert keys(relaunch) == ["worker:0", "worker:1"] and job.restarts == 1


def test_register_reports_an_exit_that_happened_while_away():
    sim = Sim(info("n1"), info("n2"))
    job, _ = start(sim, mwms(roles={"worker": {"count": 2}}, gpus=0))
    w_n1 = next(t for t in job.tasks if t.node == "n1")
    sim.c.register(info("n1"), [report(job.id, w_n1.type, w_n1.index, w_n1.attempt, "EXITED", exit_code=0)],
                   "session-n1-b", sim.now)
    assert w_n1.state == TaskState.SUCCEEDED and w_n1.exit.exit_code == 0


def test_task_of_a_lost_node_still_running_when_it_returns_is_stopped():
    # n1 is lost and the job cannot fit without it, so it waits. n1 comes back and its agent still runs the
    # old process: that process must be told to stop, not adopted silently nor left beside the new attempt.
    sim = Sim(info("n1", 1), info("n2", 1))
    job, _ = start(sim, mwms(roles={"worker": {"count": 2}}))
    w_n1 = next(t for t in job.tasks if t.node == "n1")
    key, old_attempt = (w_n1.type, w_n1.index), w_n1.attempt
    sim.now += 5
    sim.heartbeat_all("n1")
    sim.exit_stopped(job, sim.c.tick(sim.now))
    assert job.state == JobState.PENDING and "waiting for resources" in job.message

    actions = sim.c.register(info("n1", 1), [report(job.id, *key, old_attempt, "RUNNING", pid=31)], "s-b", sim.now)
    old_stop = [a for a in actions if isinstance(a, Stop)]
    assert old_stop == [Stop(node="n1", attempt=Attempt(job.id, *key, old_attempt),
                               grace_seconds=30.0)]
    # The job is placed again with n1 back; the stop is sent before the new launch.
    assert keys(launches(actions)) == ["worker:0", "worker:1"]
    assert actions.index(old_stop[0]) < actions.index(launches(actions)[0])
    assert all(task_of(a).attempt == old_attempt + 1 for a in launches(actions))


def test_running_report_for_a_task_already_given_up_is_told_to_stop():
    # The agent restarted and lost track of its task (LOST), the job failed (no restarts left); then the
    # process turns up again with the current attempt. Nothing may keep running for a finished job.
    sim = three_nodes()
    job, _ = start(sim, mwms(roles={"worker": {"count": 1}}, strategy="mirrored", restart={"max_restarts": 0}))
    w = job.task("worker", 0)
    assert sim.c.register(info(w.node, 2), [], "s-b", sim.now) == []
    assert w.state == TaskState.LOST and job.state == JobState.FAILED
    actions = sim.report(job, "worker", 0, "RUNNING")
    assert actions == [Stop(node=w.node, attempt=Attempt(job.id, "worker", 0, w.attempt),
                              grace_seconds=30.0)]
    assert job.state == JobState.FAILED and w.state == TaskState.LOST


@pytest.mark.parametrize("evaluator_end", [{"code": 1}, {"code": 0}])
def test_parameter_server_chief_still_starts_when_the_evaluator_ends_while_starting(evaluator_end):
    # The evaluator is in the first wave with ps and workers. If it ends for good (no restarts left, or it
    # simply exits) after the others already run, the chief must still be launched: nothing else will.
    sim = Sim(info("n1"), info("n2"), info("n3"))
    job, actions = sim.submit(ps_spec(restart={"max_restarts": 0}))
    for a in actions:
        if task_of(a).type != "evaluator":
            assert sim.report(job, task_of(a).type, task_of(a).index, "RUNNING") == []
    chief = sim.exit(job, "evaluator:0", evaluator_end["code"])
    assert keys(chief) == ["chief:0"] and isinstance(chief[0], Launch)
    sim.report(job, "chief", 0, "RUNNING")
    assert job.state == JobState.RUNNING


def test_job_becomes_running_when_the_evaluator_gives_up_while_starting():
    sim = three_nodes()
    job, actions = sim.submit(mwms(restart={"max_restarts": 0}))
    for a in actions:
        if task_of(a).type != "evaluator":
            sim.report(job, task_of(a).type, task_of(a).index, "RUNNING")
    assert job.state == JobState.STARTING
    assert sim.report(job, "evaluator", 0, "FAILED_TO_START", message="no such module") == []
    assert job.state == JobState.RUNNING and "evaluator not restarted" in job.message


def test_user_stop_through_the_cluster_frees_everything():
    sim = three_nodes()
    job, _ = start(sim, mwms())
    job.saved()
    stop = sim.c.stop(job.id, sim.now)
    assert keys(stop) == ["evaluator:0", "worker:0", "worker:1"] and job.state == JobState.STOPPING
    assert job.unsaved, "the store writes the change"
    sim.exit_stopped(job, stop)
    assert job.state == JobState.STOPPED and job.restarts == 0
    assert sim.free() == {"n1": ([0, 1], []), "n2": ([0, 1], []), "n3": ([], [])}


def test_stopping_a_pending_job_is_immediate_and_it_never_starts():
    sim = Sim(info("n1", 1))
    a, _ = start(sim, make_spec(gpus=1, worker=1, strategy="mirrored"), "a")
    b, _ = sim.submit(make_spec(gpus=1, worker=1, strategy="mirrored"), "b")
    assert b.state == JobState.PENDING
    assert sim.c.stop(b.id, sim.now) == []
    assert b.state == JobState.STOPPED and b.finished == sim.now
    assert sim.exit(a, "worker:0", 0) == []  # resources free: b stays stopped
    assert b.state == JobState.STOPPED and all(t.state == TaskState.PENDING for t in b.tasks)


def test_busy_port_replaces_the_group_on_other_ports_without_using_the_budget():
    sim = Sim(info("a"), info("b"))
    job, actions = sim.submit(make_spec(worker=2, restart={"max_restarts": 0}))
    sim.running(job, [a for a in launches(actions) if task_of(a).index == 0])
    taken = job.task("worker", 1)
    port, node = taken.port, taken.node
    actions = sim.report(job, "worker", 1, "FAILED_TO_START", message=f"port {port} is already in use",
                         busy_port=port)
    actions += sim.exit_stopped(job, actions)
    assert job.state == JobState.STARTING, job.message
    assert job.restarts == 0, "a port conflict is not the job's fault"
    again = job.task("worker", 1)
    assert again.attempt == 2
    assert (again.node, again.port) != (node, port)
    assert "already in use" in job.last_failure.describe()


def test_lost_node_that_returns_gets_one_restart_not_two():
    sim = Sim(info("a"))
    job, actions = sim.submit(make_spec(worker=2, restart={"max_restarts": 5}))
    sim.running(job, actions)
    sim.now += 4.0
    sim.c.tick(sim.now)
    assert sim.c.nodes["a"].state == NodeState.LOST
    assert job.state == JobState.PENDING and job.restarts == 1
    old = [report(job.id, "worker", i, 1, "RUNNING", pid=10 + i) for i in range(2)]
    actions = sim.c.register(info("a"), old, "session-2", sim.now)
    stale = stops(actions)
    assert {(s.attempt.index, s.attempt.number) for s in stale} == {(0, 1), (1, 1)}
    relaunched = launches(actions)
    assert sorted((task_of(a).index, task_of(a).attempt) for a in relaunched) == [(0, 2), (1, 2)]
    assert job.restarts == 1


# ---- host-local checkpoints: shipping and copies -----------------------------------------------

def peer_info(name: str) -> NodeInfo:
    return NodeInfo(name=name, address=f"10.0.0.{name[-1]}", port_range=PORTS, state_dir=f"/state/{name}",
                    peer_port=19999, agent_version=__version__)


def local_spec(**kw):
    spec = make_spec(worker=2, evaluator={"count": 1, "nodes": ["n3"]}, **kw)
    return replace(spec, checkpoint_dir="")


def of_type(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


def test_chief_checkpoints_are_shipped_to_the_evaluators_node():
    sim = Sim(peer_info("n1"), peer_info("n2"), peer_info("n3"))
    job, actions = sim.submit(local_spec())
    ships = of_type(actions, ShipCheckpoints)
    chief = job.task("worker", 0)
    assert len(ships) == 1 and ships[0].node == chief.node
    assert (ships[0].attempt.type, ships[0].attempt.index, ships[0].attempt.number) == ("worker", 0, 1)
    assert ships[0].targets == ("10.0.0.3:19999",)
    env = {task_of(a).key: a.env for a in launches(actions)}
    assert env["worker:0"]["TFCLUSTER_CHECKPOINT_DIR"] == f"/state/{chief.node}/jobs/job-1/checkpoints"
    assert env["evaluator:0"]["TFCLUSTER_CHECKPOINT_DIR"] == "/state/n3/jobs/job-1/checkpoints"


def test_shared_checkpoint_dir_ships_and_copies_nothing():
    sim = Sim(peer_info("n1"), peer_info("n2"), peer_info("n3"))
    spec = replace(local_spec(restart={"max_restarts": 2}), checkpoint_dir="/shared/ckpt")
    job, actions = sim.submit(spec)
    assert of_type(actions, ShipCheckpoints) == []
    assert all(a.env["TFCLUSTER_CHECKPOINT_DIR"] == "/shared/ckpt" for a in launches(actions))
    sim.running(job, actions)
    after = sim.exit_stopped(job, sim.exit(job, "worker:1", 1))
    assert of_type(after, SyncCheckpoints) == [] and len(launches(after)) == 3


def test_restarted_group_waits_for_the_chiefs_dir_to_be_copied_to_its_nodes():
    sim = Sim(peer_info("n1"), peer_info("n2"), peer_info("n3"))
    job, actions = sim.submit(local_spec(restart={"max_restarts": 2}))
    sim.running(job, actions)
    chief_node = job.task("worker", 0).node
    after = sim.exit_stopped(job, sim.exit(job, "worker:1", 1))
    syncs = of_type(after, SyncCheckpoints)
    assert len(syncs) == 1 and syncs[0].node == chief_node
    others = sorted({t.node for t in job.tasks} - {chief_node})
    assert sorted((e.node, e.sender) for e in of_type(after, ExpectFiles)) == [(n, chief_node) for n in others]
    assert syncs[0].targets == tuple(f"10.0.0.{n[-1]}:19999" for n in others)
    assert launches(after) == [] and job.state == JobState.STARTING and "copying checkpoints" in job.message
    assert sim.c.sync_done(syncs[0].node, job.id, syncs[0].sync_id + 1, True, "", sim.now) == [], "another copy's answer"
    assert sim.c.sync_done("n9", job.id, syncs[0].sync_id, True, "", sim.now) == [], "another node's answer"
    relaunch = sim.c.sync_done(syncs[0].node, job.id, syncs[0].sync_id, True, "", sim.now)
    assert sorted(task_of(a).key for a in launches(relaunch)) == ["evaluator:0", "worker:0", "worker:1"]
    assert job.message == ""


def test_a_failed_copy_lets_the_group_start_without_it():
    sim = Sim(peer_info("n1"), peer_info("n2"), peer_info("n3"))
    job, actions = sim.submit(local_spec(restart={"max_restarts": 2}))
    sim.running(job, actions)
    sync = of_type(sim.exit_stopped(job, sim.exit(job, "worker:1", 1)), SyncCheckpoints)[0]
    relaunch = sim.c.sync_done(sync.node, job.id, sync.sync_id, False, "10.0.0.2:19999: unreachable", sim.now)
    assert len(launches(relaunch)) == 3 and "copying the checkpoints failed" in job.message


def test_a_copy_that_never_answers_times_out():
    sim = Sim(peer_info("n1"), peer_info("n2"), peer_info("n3"))
    job, actions = sim.submit(local_spec(restart={"max_restarts": 2}))
    sim.running(job, actions)
    sim.exit_stopped(job, sim.exit(job, "worker:1", 1))
    assert job.syncing
    sim.now += SYNC_DEADLINE_SECONDS + 1
    sim.heartbeat_all()
    assert len(launches(sim.c.tick(sim.now))) == 3 and "no answer within" in job.message


def test_when_the_chiefs_node_is_lost_the_group_starts_over_and_says_so():
    sim = Sim(peer_info("n1"), peer_info("n2"), peer_info("n3"), peer_info("n4"))
    job, actions = sim.submit(local_spec(restart={"max_restarts": 2}))
    sim.running(job, actions)
    chief_node = job.task("worker", 0).node
    sim.now += 4
    sim.heartbeat_all(chief_node)
    stop = sim.c.tick(sim.now)
    after = sim.exit_stopped(job, stop)
    assert of_type(after, SyncCheckpoints) == []
    assert f"the checkpoints were on {chief_node}, which is gone" in job.message
    assert launches(after), "it starts at once"
    new_chief = job.task("worker", 0).node
    assert new_chief != chief_node
    assert [(e.node, e.sender) for e in of_type(after, ExpectFiles)] == [("n3", new_chief)], \
        "the evaluator's node takes checkpoints from the chief's new node alone"


def test_a_restarted_chief_agent_is_told_again_where_to_ship():
    sim = Sim(peer_info("n1"), peer_info("n2"), peer_info("n3"))
    job, actions = sim.submit(local_spec())
    sim.running(job, actions)
    chief = job.task("worker", 0)
    running = report(job.id, "worker", 0, chief.attempt, "RUNNING", pid=chief.pid)
    again = sim.c.register(peer_info(chief.node), [running], "session-new", sim.now)
    ships = of_type(again, ShipCheckpoints)
    assert len(ships) == 1 and ships[0].node == chief.node and ships[0].targets == ("10.0.0.3:19999",)


def test_a_restarted_evaluator_agent_is_told_again_which_node_sends_it_checkpoints():
    sim = Sim(peer_info("n1"), peer_info("n2"), peer_info("n3"))
    job, actions = sim.submit(local_spec())
    assert [(e.node, e.sender) for e in of_type(actions, ExpectFiles)] == [("n3", job.task("worker", 0).node)]
    sim.running(job, actions)
    evaluator = job.task("evaluator", 0)
    running = report(job.id, "evaluator", 0, evaluator.attempt, "RUNNING", pid=evaluator.pid)
    again = sim.c.register(peer_info("n3"), [running], "session-new", sim.now)
    assert [(e.node, e.job_id, e.sender) for e in of_type(again, ExpectFiles)] == \
        [("n3", job.id, job.task("worker", 0).node)]


def test_an_evaluator_moved_to_a_node_that_joined_later_gets_its_dir_and_the_checkpoints():
    def gpu_node(name):  # one GPU each: the evaluator needs one, so only a new node can take it
        return replace(peer_info(name), gpus=gpus(name, 1))
    sim = Sim(gpu_node("n1"), gpu_node("n2"), gpu_node("n3"))
    job, actions = sim.submit(make_spec(gpus=1, worker=2, evaluator={"count": 1}))
    sim.running(job, actions)
    assert job.task("evaluator", 0).node == "n3"
    sim.c.register(gpu_node("n4"), [], "session-n4", sim.now)
    sim.now += 4
    sim.heartbeat_all("n3")
    out = sim.c.tick(sim.now)
    launch = [a for a in launches(out) if task_of(a).type == "evaluator"]
    assert launch and launch[0].node == "n4"
    assert launch[0].env["TFCLUSTER_CHECKPOINT_DIR"] == "/state/n4/jobs/job-1/checkpoints"
    assert [s.targets for s in of_type(out, ShipCheckpoints)] == [("10.0.0.4:19999",)]


def test_two_agents_on_one_address_with_overlapping_ports_are_refused():
    sim = Sim(info("n1"))
    twin = replace(info("n1"), name="n1b", port_range=(20050, 20150))
    with pytest.raises(ValueError, match="overlap n1's on the same address 10.0.0.1"):
        sim.c.register(twin, [], "s", sim.now)
    clash_on_peer_port = replace(info("n1"), name="n1c", port_range=(21000, 21099), peer_port=20000)
    with pytest.raises(ValueError, match="overlap"):
        sim.c.register(clash_on_peer_port, [], "s", sim.now)
    apart = replace(info("n1"), name="n1d", port_range=(21000, 21099), peer_port=20999 + 200)
    sim.c.register(apart, [], "s", sim.now)
    assert sim.c.nodes["n1d"].state == NodeState.READY
    sim.c.register(info("n1"), [], "again", sim.now)  # the same node registering again is no clash


# ---- nodes lost while tasks wait, and failures during a partial restart --------------------------------

def test_a_chief_waiting_for_its_wave_on_a_node_that_is_lost_is_not_launched_there():
    sim = Sim(info("n1"), info("n2"), info("n3"), info("n4"))
    job, actions = sim.submit(ps_spec())
    chief_node = job.task("chief", 0).node
    assert job.task("chief", 0).state == TaskState.PENDING
    sim.now += 4
    sim.heartbeat_all(chief_node)
    stop = sim.c.tick(sim.now)
    assert job.task("chief", 0).state == TaskState.LOST and job.state == JobState.STOPPING
    assert "lost" in job.message
    relaunch = sim.exit_stopped(job, stop)
    assert job.state == JobState.STARTING and all(t.node != chief_node for t in job.tasks)
    assert all(a.node != chief_node for a in launches(relaunch))


def test_a_task_left_on_a_node_that_is_not_ready_is_counted_lost_on_the_next_tick():
    sim = Sim(info("n1"), info("n2"), info("n3"))
    job, actions = sim.submit(ps_spec())
    sim.running(job, sim.running(job, actions))
    chief = job.task("chief", 0)
    stop = sim.exit(job, "ps:0", 1)  # ps + chief restart in place ...
    sim.exit_stopped(job, [s for s in stop if s.attempt.type == "ps"])
    sim.c.nodes[chief.node].state = NodeState.LOST  # ... and the chief's node goes away without a word
    out = sim.c.tick(sim.now)
    assert chief.state == TaskState.LOST
    assert job.message.startswith("chief:0") and "cannot restart in place: restarting the training group" in \
        job.message, "it cannot come back in place: the whole group restarts"
    assert job.last_failure.task == "chief:0" and job.restarts == 1, "the restart under way widens, at no extra cost"
    sim.exit_stopped(job, out)
    assert job.state in (JobState.STARTING, JobState.PENDING)
    assert all(a.node != chief.node for a in launches(out))


def test_an_evaluator_failing_during_a_partial_restart_restarts_alone():
    sim = Sim(info("n1"), info("n2"), info("n3"))
    job, actions = sim.submit(ps_spec())
    sim.running(job, sim.running(job, actions))
    stop = sim.exit(job, "chief:0", 1)
    assert job.restarting and job.restarts == 1
    again = sim.exit(job, "evaluator:0", 1)
    assert keys(again) == ["evaluator:0"] and isinstance(again[0], Launch)
    assert job.restarts == 1 and job.evaluator_restarts == 1 and job.restarting, "training's restart goes on"
    sim.running(job, again)
    relaunch = sim.exit_stopped(job, stop)
    assert keys(relaunch) == ["ps:0", "ps:1"] and job.state == JobState.STARTING


def test_a_chief_that_finishes_during_a_partial_restart_ends_training():
    sim = Sim(info("n1"), info("n2"), info("n3"))
    job, actions = sim.submit(ps_spec())
    sim.running(job, sim.running(job, actions))
    stop = sim.exit(job, "ps:1", 1)  # ps + chief restart; the chief was about to finish and does
    assert keys(stop) == ["chief:0", "ps:0"]
    sim.report(job, "chief", 0, "EXITED", exit_code=0, final_checkpoint="ckpt-9")
    out = sim.exit_stopped(job, [s for s in stop if s.attempt.type == "ps"])
    finish = [a for a in out if isinstance(a, FinishTraining)]
    assert finish and finish[0].final_checkpoint == "ckpt-9", "the evaluator is told, nothing is relaunched"
    assert not launches(out) and job.state == JobState.RUNNING
    assert keys(sim.exit(job, "evaluator:0", 0)) == ["worker:0", "worker:1"] and job.state == JobState.STOPPING


def test_a_task_placed_but_waiting_for_its_wave_keeps_its_gpu_and_port_from_the_next_job():
    sim = Sim(info("n1", 2), info("n2", 2), info("n3", 2))
    spec = make_spec(strategy="parameter_server", gpus=1, chief=1, worker=2, ps={"count": 1, "gpus": 0})
    first, _ = sim.submit(spec)
    chief = first.task("chief", 0)
    assert chief.state == TaskState.PENDING and chief.node, "the chief waits for the second wave"
    second, _ = sim.submit(spec, name="second")
    held = [(t.node, g.index) for j in (first, second) for t in j.tasks if j.holds(t) for g in t.gpus]
    ports = [(t.node, t.port) for j in (first, second) for t in j.tasks if j.holds(t)]
    assert len(held) == len(set(held)) == 6 and len(ports) == len(set(ports))
