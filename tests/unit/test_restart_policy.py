"""The restart policy on its own: one failure in, one decision out (restart.decide)."""

from __future__ import annotations

import pytest

from tfcluster.daemon.coordinator import restart as R
from tfcluster.daemon.coordinator.job import RUNNING, STARTING, T_LOST, T_RUNNING, Failure, Job, Task
from tfcluster.model import TaskExit
from tfcluster.spec import parse_spec


def job(strategy="multi_worker_mirrored", state=RUNNING, restarts=0, evaluator_restarts=0, **restart):
    roles = {"worker": {"count": 2}, "evaluator": {}}
    if strategy == "parameter_server":
        roles = {"chief": {}, "worker": {"count": 2}, "ps": {"count": 2}, "evaluator": {}}
    if strategy in ("mirrored", "central_storage"):
        roles = {"worker": {"count": 1}, "evaluator": {}}
    spec = parse_spec({"name": "j", "strategy": strategy, "command": ["p"], "roles": roles,
                       "restart": {"max_restarts": 3, **restart}})
    tasks = [Task(t, i, node=f"n{i}", state=T_RUNNING) for t in ("chief", "worker", "ps", "evaluator")
             for i in range(spec.count(t))]
    return Job(id="j-1", spec=spec, state=state, tasks=tasks, restarts=restarts, evaluator_restarts=evaluator_restarts)


def failure(task="worker:1", lost=False, **exit):
    return Failure(task=task, node="n1", exit=TaskExit(**exit), time=0.0, lost=lost)


def decide(j, f):
    return R.decide(j, f, f.task.split(":")[0])


@pytest.mark.parametrize("strategy", ["mirrored", "central_storage", "multi_worker_mirrored"])
def test_a_failed_training_task_restarts_the_group_on_the_budget(strategy):
    d = decide(job(strategy), failure("worker:0", exit_code=1))
    assert (d.kind, d.charge, d.tasks) == (R.RESTART_GROUP, R.BUDGET, ())
    assert d.reason == "restarting the training group"


def test_the_budget_spent_fails_the_job():
    d = decide(job(restarts=3), failure(exit_code=1))
    assert (d.kind, d.charge) == (R.FAIL, "")
    assert d.reason == "restart budget spent (3 of 3)"


def test_a_permanent_exit_code_fails_at_once_whatever_the_budget():
    d = decide(job(permanent_exit_codes=[7]), failure(exit_code=7))
    assert d.kind == R.FAIL and "permanent" in d.reason


@pytest.mark.parametrize("exit, charge, reason", [
    ({"exit_code": 42}, R.PREEMPTION, "preemption checkpoint saved"),
    ({"message": "port 20001 is already in use", "busy_port": 20001}, R.FREE, "placing the group again"),
])
def test_preemption_and_port_conflicts_restart_for_free_even_with_the_budget_spent(exit, charge, reason):
    d = decide(job(restarts=3), failure(**exit))
    assert (d.kind, d.charge, d.reason) == (R.RESTART_GROUP, charge, reason)


def test_a_lost_task_restarts_the_group():
    d = decide(job(), failure(lost=True, message="node n1 lost"))
    assert (d.kind, d.charge) == (R.RESTART_GROUP, R.BUDGET)


def test_parameter_server_worker_restarts_alone():
    d = decide(job("parameter_server"), failure("worker:1", signal=9))
    assert (d.kind, d.tasks, d.charge) == (R.RESTART_TASKS, ("worker:1",), R.BUDGET)
    assert d.reason == "restarting worker:1 alone"


@pytest.mark.parametrize("task", ["ps:1", "chief:0"])
def test_parameter_server_ps_or_chief_restarts_ps_and_chief(task):
    d = decide(job("parameter_server"), failure(task, exit_code=1))
    assert d.kind == R.RESTART_TASKS and d.reason == "restarting ps and chief"
    assert sorted(d.tasks) == ["chief:0", "ps:0", "ps:1"]


@pytest.mark.parametrize("change", ["lost", "busy port", "starting", "a ps lost"])
def test_parameter_server_falls_back_to_the_group(change):
    j = job("parameter_server", state=STARTING if change == "starting" else RUNNING)
    f = failure("chief:0", exit_code=1)
    if change == "lost":
        f = failure("worker:1", lost=True, message="node n1 lost")
    elif change == "busy port":
        f = failure("worker:1", message="port taken", busy_port=20001)
    elif change == "a ps lost":
        j.task("ps", 1).state = T_LOST
    assert decide(j, f).kind == R.RESTART_GROUP


def test_the_hang_watchdog_restarts_the_group():
    d = R.decide(job("parameter_server"), failure("job", message="hung"), "job")
    assert d.kind == R.RESTART_GROUP


def test_the_evaluator_restarts_alone_on_a_budget_of_its_own():
    d = decide(job(restarts=3), failure("evaluator:0", exit_code=1))
    assert (d.kind, d.charge, d.reason) == (R.RESTART_EVALUATOR, R.EVALUATOR_BUDGET, "evaluator restarted")
    d = decide(job(), failure("evaluator:0", lost=True, message="node n3 lost"))
    assert d.reason == "evaluator to be placed again"
    d = decide(job(evaluator_restarts=3), failure("evaluator:0", exit_code=1))
    assert (d.kind, d.charge) == (R.EVALUATOR_GIVEN_UP, "") and "training goes on" in d.reason
