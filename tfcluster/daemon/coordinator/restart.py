"""The restart policy: what a job does about one failure. Pure; lifecycle.py carries the decision out.

The coordinator owns one budget per job (LESSONS.md 3). A permanent exit code fails the job; a preemption
save (exit 42) or a port taken on the node restarts for free; otherwise a restart costs one from the budget
and the job fails once it is spent. What restarts is the strategy's restart scope (strategies.py): the whole
group on the same addresses, or (parameter_server) a worker alone or ps + chief, which needs the job
RUNNING and every task of the scope still on a live node. The evaluator is never part of it: it restarts
alone on a budget of its own, and when that is spent training goes on without it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfcluster import strategies
from tfcluster.daemon.coordinator.job import RUNNING, T_LOST, Failure, Job

FAIL = "fail"
RESTART_GROUP = "restart group"
RESTART_TASKS = "restart tasks"          # `tasks` restart in place while the others run on
RESTART_EVALUATOR = "restart evaluator"
EVALUATOR_GIVEN_UP = "evaluator given up"

# Which counter a decision charges.
BUDGET, PREEMPTION, FREE, EVALUATOR_BUDGET = "budget", "preemption", "free", "evaluator budget"
RESTARTS = (RESTART_GROUP, RESTART_TASKS, RESTART_EVALUATOR)

# Why something restarted, as operators count it (the metrics' `cause` label).
CAUSES = ("failure", "preemption", "port_conflict", "node_lost", "hang")


@dataclass(frozen=True)
class Decision:
    kind: str
    reason: str                 # said after the failure in the job's message
    charge: str = ""            # BUDGET, PREEMPTION, FREE, EVALUATOR_BUDGET, or "" (nothing restarts)
    tasks: tuple[str, ...] = ()  # RESTART_TASKS: the keys of the tasks that restart


def decide(job: Job, failure: Failure, task_type: str) -> Decision:
    """What to do about a failed task of task_type (or the hang watchdog's "job")."""
    restart = job.spec.restart
    if task_type == "evaluator":
        if job.evaluator_restarts >= restart.max_restarts:
            return Decision(EVALUATOR_GIVEN_UP, f"evaluator not restarted (its {job.evaluator_restarts} restarts "
                                                f"are spent); training goes on")
        return Decision(RESTART_EVALUATOR, "evaluator to be placed again" if failure.lost else "evaluator restarted",
                        EVALUATOR_BUDGET)
    exit = failure.exit
    if exit.exit_code in restart.permanent_exit_codes:
        return Decision(FAIL, "a permanent exit code, not restarted")
    charge = PREEMPTION if exit.preempted else FREE if exit.busy_port else BUDGET
    if charge == BUDGET and job.restarts >= restart.max_restarts:
        return Decision(FAIL, f"restart budget spent ({job.restarts} of {restart.max_restarts})")
    scope = _partial_scope(job, failure, task_type)
    if scope == strategies.ALONE:
        return Decision(RESTART_TASKS, f"restarting {failure.task} alone", charge, (failure.task,))
    if scope:
        names = " and ".join(scope)
        return Decision(RESTART_TASKS, f"restarting {names}", charge,
                        tuple(t.key for t in job.tasks if t.type in scope))
    reason = {PREEMPTION: "preemption checkpoint saved", FREE: "placing the group again"}.get(
        charge, "restarting the training group")
    return Decision(RESTART_GROUP, reason, charge)


def cause(failure: Failure) -> str:
    """The cause of a restart, one of CAUSES."""
    if failure.lost:
        return "node_lost"
    if failure.task == "job":
        return "hang"
    return "preemption" if failure.exit.preempted else "port_conflict" if failure.exit.busy_port else "failure"


def _partial_scope(job: Job, failure: Failure, task_type: str) -> str | tuple[str, ...] | None:
    """The strategy's narrower scope when it applies here; None: the whole group restarts."""
    scope = job.profile.restart_scope(task_type) if task_type != "job" else strategies.GROUP
    if scope == strategies.GROUP or failure.lost or failure.exit.busy_port or job.state != RUNNING:
        return None
    if scope != strategies.ALONE and any(t.state == T_LOST for t in job.tasks if t.type in scope):
        return None
    return scope
