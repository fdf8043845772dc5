"""The restart policy: what a job does about one failure, in one place. Pure; transitions.py carries it out.

Every failure of a task (or the hang watchdog's verdict) comes here, whatever the job is doing: starting,
running, in the middle of restarting some of its tasks, or waiting for the evaluator's final evaluation. One
Decision comes back, like a restart tracker's answer: what restarts (the scope), what that costs (the
charge), and how long to wait first (the delay).

The rules, in order:
1. Once the job is stopping for good or for a whole-group restart, or once training is over, nothing more
   restarts: a task ending then is no failure of the job.
2. The evaluator is never part of training: it restarts alone on a budget of its own (placed anew when its
   node or port is gone), and when that is spent training goes on without it. It never fails the job.
2b. The tf.data service's tasks are not training either and cost training nothing: a data worker restarts alone
   (placed anew when its node or port is gone; readers go on with the other workers meanwhile), the dispatcher
   in place, on its port and with its journal, so readers reconnect to the address they were given. A
   dispatcher that cannot come back there (its node lost, its port taken) restarts the whole group uncharged:
   training must be told the new address. Each restart waits the backoff (at least DATA_SERVICE_BACKOFF_SECONDS,
   so a crashing server does not spin); one that no restart would change fails the job, which cannot read.
3. A training task exiting with a permanent exit code fails the job, and so does one that cannot start for a
   reason no restart would change (its program or a dir it needs out of its user's reach: TaskExit.permanent)
   or exits with code 78 (the program is set up wrong, e.g. Keras 3 under multi_worker_mirrored:
   TaskExit.unrecoverable); such an evaluator is given up at once.
4. A preemption save (exit 42) or a port taken on the node restarts without using the budget; any other
   failure costs one restart, and fails the job once the budget is spent.
5. What restarts is the strategy's restart scope (strategies.py): the whole group, or (parameter_server) a
   worker alone or ps + chief in place. In place needs a RUNNING job, the task's node and port still good,
   and every task of the scope on a live node; otherwise the whole group restarts, on new addresses where
   needed. A failure during a restart in place is decided like any other, so it may fail the job; one of
   the tasks being restarted in place that loses its node cannot come back in place: the whole group
   restarts instead, at no extra cost.
6. Every restart waits `restart.backoff_seconds` from the failure, except one for free: a preemption save
   or a port taken is not the program's fault, and waiting makes neither less likely to happen again (the
   program saved before it went; the taken port is avoided from now on).
7. A job of a higher class taking the job's resources (preemption.py) is no failure either: the whole group
   stops gracefully (its programs save on SIGTERM) and waits in the queue again, at once, its restart
   budget untouched; it counts as a preemption, like a preemption save. So does a job on a node an admin
   drains with --requeue.
8. An elastic job (core/model/elastic.py) above its smallest size absorbs a lost node: the group restarts at
   no cost and is placed again at the size that fits, smaller if need be; so does a failure of its tasks
   while one of its nodes is lost (peers of a vanished worker fail their collectives first). Growing is
   no failure either: the group stops with its preemption signal and is placed again larger, uncharged.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfcluster import strategies
from tfcluster.daemon.coordinator.core.model.job import Failure, Job
from tfcluster.model import DATA_SERVICE_TYPES, DATA_WORKER, WORKER, is_training
from tfcluster.states import JobState, TaskState

# What restarts (Decision.scope).
FAIL = "fail"                              # the job fails
GROUP = "group"                            # every task of the job stops; the job is placed again as a whole
TASKS = "tasks"                            # `tasks` restart in place while the others run on
EVALUATOR = "evaluator"                    # the evaluator alone restarts
EVALUATOR_GIVEN_UP = "evaluator given up"  # the evaluator stays ended; training goes on
DATA_SERVICE = "data service"              # a tf.data service task alone restarts (rule 2b)
NOTHING = "nothing"                        # not a failure of the job (rule 1): nothing changes
RESTARTS = (GROUP, TASKS, EVALUATOR, DATA_SERVICE)
DATA_SERVICE_BACKOFF_SECONDS = 1.0  # the least wait before a tf.data service task restarts

# What a decision costs (Decision.charge): one of the job's counters, or nothing.
BUDGET, PREEMPTION, EVALUATOR_BUDGET, NO_CHARGE = "budget", "preemption", "evaluator budget", "nothing"

# Why something restarted, as operators count it (the metrics' `cause` label).
# "preempted": stopped for a job of a higher class; "preemption": the program's own preemption save (exit 42).
# "drained": requeued off a node an admin drained (`node drain --requeue`).
# "resized": an elastic job stopped to grow (rule 8).
CAUSES = ("failure", "preemption", "port_conflict", "node_lost", "hang", "preempted", "drained", "resized")
PREEMPTED, DRAINED, RESIZED = "preempted", "drained", "resized"

WATCHDOG = "job"  # the task type the hang watchdog's failures are decided under

# A stopping job's outcome (Job.outcome) when it restarts rather than ends: no state of its own, since the job
# goes on to PENDING (the whole group is placed again) or STARTING (tasks restarted in place) once its tasks
# are gone. The value is kept in the store.
RESTART = "RESTART"


@dataclass(frozen=True)
class Decision:
    scope: str                   # FAIL, GROUP, TASKS, EVALUATOR, EVALUATOR_GIVEN_UP or NOTHING
    charge: str                  # BUDGET, PREEMPTION, EVALUATOR_BUDGET or NO_CHARGE
    delay: float                 # seconds from the failure before anything of the restart is launched
    reason: str                  # said after the failure in the job's message
    tasks: tuple[str, ...] = ()  # TASKS, EVALUATOR: the keys of the tasks that restart
    place_anew: bool = False     # EVALUATOR: placed again (its node is gone or its port taken), not in place


def decide(job: Job, failure: Failure, task_type: str) -> Decision:
    """What to do about a failed task of task_type (WATCHDOG for the hang watchdog)."""
    if job.state == JobState.STOPPING and not job.restarting:
        return Decision(NOTHING, NO_CHARGE, 0.0, "the job is stopping already")
    if job.final_evaluation_until:
        return Decision(NOTHING, NO_CHARGE, 0.0, "training is over; nothing restarts")
    if task_type in DATA_SERVICE_TYPES:
        return _data_service(job, failure, task_type)
    if not is_training(task_type):
        return _evaluator(job, failure)
    restart, exit = job.spec.restart, failure.exit
    if exit.exit_code in restart.permanent_exit_codes:
        return Decision(FAIL, NO_CHARGE, 0.0, "a permanent exit code, not restarted")
    if exit.unrecoverable:
        return Decision(FAIL, NO_CHARGE, 0.0, "not restarted: no restart would change that")
    if failure.lost and failure.task in job.restarting:
        return _restart(job, failure, GROUP, NO_CHARGE, "it cannot restart in place: restarting the training group")
    charge = PREEMPTION if exit.preempted else NO_CHARGE if exit.busy_port or _shrinks(job, failure) else BUDGET
    if charge == BUDGET and job.restarts >= restart.max_restarts:
        return Decision(FAIL, NO_CHARGE, 0.0, f"restart budget spent ({job.restarts} of {restart.max_restarts})")
    scope = _scope_in_place(job, failure, task_type)
    if scope == strategies.ALONE:
        return _restart(job, failure, TASKS, charge, f"restarting {failure.task} alone", (failure.task,))
    if scope:
        return _restart(job, failure, TASKS, charge, f"restarting {' and '.join(scope)}",
                        tuple(t.key for t in job.tasks if t.type in scope))
    saved = "preemption checkpoint saved" + ("" if exit.saved_step is None else f" at step {exit.saved_step}")
    free = "restarting the group at the size that fits, smaller if need be (uncharged: elastic)" \
        if _shrinks(job, failure) else "placing the group again"
    reason = {PREEMPTION: saved, NO_CHARGE: free}.get(charge, "restarting the training group")
    if job.restarting:
        reason += f" (it was restarting {', '.join(job.restarting)} in place)"
    return _restart(job, failure, GROUP, charge, reason)


def preempted(job: Job, note: str) -> Decision:
    """A job of a higher class takes this job's resources, or its node is drained with --requeue (rule 7); note
    says which, and when."""
    if job.state not in (JobState.STARTING, JobState.RUNNING):
        return Decision(NOTHING, NO_CHARGE, 0.0, f"not preempted while {job.state}")
    if job.final_evaluation_until:
        return Decision(NOTHING, NO_CHARGE, 0.0, "training is over; not preempted")
    return Decision(GROUP, PREEMPTION, 0.0, note)


def resized(job: Job, reason: str) -> Decision:
    """An elastic job grows (rule 8): the whole group stops, uncharged, and is placed again at once."""
    if job.state != JobState.RUNNING or job.final_evaluation_until:
        return Decision(NOTHING, NO_CHARGE, 0.0, f"not resized while {job.state}")
    return Decision(GROUP, NO_CHARGE, 0.0, reason)


def _shrinks(job: Job, failure: Failure) -> bool:
    """A node of the elastic job is lost (this task's, or another's within the task grace), and the job may
    run smaller (rule 8)."""
    role = job.spec.role(WORKER)
    if not role.elastic or role.count <= role.min_count:
        return False
    return failure.lost or any(t.seen.node_silent for t in job.tasks if t.live)


def book(job: Job, decision: Decision, failure: Failure | None, now: float, why: str = PREEMPTED) -> None:
    """Enters a decision on the job: the counter it charges, the time before which the restart launches
    nothing (a later free restart never shortens an earlier one's wait), and its cause for the metrics (no
    failure: `why`, a preemption by a job of a higher class or a drain)."""
    if decision.charge == BUDGET:
        job.restarts += 1
    elif decision.charge == PREEMPTION:
        job.preemptions += 1
    elif decision.charge == EVALUATOR_BUDGET:
        job.evaluator_restarts += 1
    if decision.scope in RESTARTS:
        job.not_before = max(job.not_before, now + decision.delay)
        job.seen.restart_causes.append(cause(failure) if failure else why)


def cause(failure: Failure) -> str:
    """The cause of a restart, one of CAUSES."""
    if failure.lost:
        return "node_lost"
    if failure.task == WATCHDOG:
        return "hang"
    return "preemption" if failure.exit.preempted else "port_conflict" if failure.exit.busy_port else "failure"


def _evaluator(job: Job, failure: Failure) -> Decision:
    if failure.exit.unrecoverable:
        return Decision(EVALUATOR_GIVEN_UP, NO_CHARGE, 0.0, "evaluator not restarted (no restart would change "
                                                            "that); training goes on")
    spent = job.evaluator_restarts
    if spent >= job.spec.restart.max_restarts:
        return Decision(EVALUATOR_GIVEN_UP, NO_CHARGE, 0.0,
                        f"evaluator not restarted (its {spent} restarts are spent); training goes on")
    anew = failure.lost or bool(failure.exit.busy_port)
    return _restart(job, failure, EVALUATOR, EVALUATOR_BUDGET,
                    "evaluator to be placed again" if anew else "evaluator restarted", (failure.task,), anew)


def _data_service(job: Job, failure: Failure, task_type: str) -> Decision:
    """Rule 2b: a tf.data service task restarts alone, uncharged; training runs on."""
    exit = failure.exit
    if exit.exit_code in job.spec.restart.permanent_exit_codes or exit.unrecoverable:
        return Decision(FAIL, NO_CHARGE, 0.0, f"the tf.data service's {task_type} cannot run, so training cannot "
                                              f"read its input; not restarted")
    moves = failure.lost or bool(exit.busy_port)
    if moves and task_type != DATA_WORKER:
        return Decision(GROUP, NO_CHARGE, 0.0, "the dispatcher cannot come back on its address: placing the job "
                                               "again, so training reads from the new one (uncharged)")
    delay = max(job.spec.restart.backoff_seconds, DATA_SERVICE_BACKOFF_SECONDS)
    where = "placed again" if moves else "restarted alone" if task_type == DATA_WORKER else \
        "restarted on its address with its journal"
    return Decision(DATA_SERVICE, NO_CHARGE, delay, f"{failure.task} {where} in {delay:g} s; training goes on "
                                                    f"(uncharged)", (failure.task,), moves)


def _restart(job: Job, failure: Failure, scope: str, charge: str, reason: str, tasks: tuple[str, ...] = (),
             place_anew: bool = False) -> Decision:
    """A restart, delayed by the backoff unless it is one for free (rule 6)."""
    free = failure.exit.preempted or bool(failure.exit.busy_port)
    delay = 0.0 if free else job.spec.restart.backoff_seconds
    if delay:
        reason += f", in {delay:g} s (backoff_seconds)"
    return Decision(scope, charge, delay, reason, tasks, place_anew)


def _scope_in_place(job: Job, failure: Failure, task_type: str) -> str | tuple[str, ...] | None:
    """The strategy's narrower scope when it applies now; None: the whole group restarts."""
    scope = strategies.GROUP if task_type == WATCHDOG else job.profile.restart_scope(task_type)
    if scope == strategies.GROUP or failure.lost or failure.exit.busy_port or job.state != JobState.RUNNING:
        return None
    if scope != strategies.ALONE and any(t.state == TaskState.LOST for t in job.tasks if t.type in scope):
        return None
    return scope
