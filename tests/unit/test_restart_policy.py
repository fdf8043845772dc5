"""The restart policy on its own: one failure in, one decision out (restart.decide), over every strategy,
failing role, job phase and kind of exit that can occur."""

from __future__ import annotations

import pytest

from tfcluster.daemon.coordinator.core.lifecycle import restart as R
from tfcluster.daemon.coordinator.core.lifecycle.restart import RESTART
from tfcluster.daemon.coordinator.core.model.job import Failure, Job, Task
from tfcluster.model import CONFIG_EXIT_CODE, TaskExit
from tfcluster.specfile import parse_spec
from tfcluster.states import JobState, TaskState

MAX_RESTARTS, BACKOFF, PERMANENT = 3, 10.0, 7
ONE_TASK = ("mirrored", "central_storage")
MWMS = ("multi_worker_mirrored",)
PS = ("parameter_server",)
PARTIAL = "during a restart of ps and chief in place"
FINAL = "final evaluation"
WATCHDOG = "watchdog"
EXITS = ("exit 1", "permanent", "exit 42", "port taken", "node lost", "budget spent", "cannot start", "exit 78")

# One row per strategy x failing role x job phase; one column per kind of exit (EXITS). A cell reads
# "scope charge delay": delay "wait" is restart.backoff_seconds, "now" none; "fail", "given up" and "nothing"
# restart nothing and charge nothing. "-": cannot happen (a task being stopped for a restart in place ends
# STOPPED, not FAILED; the watchdog has no exit code). "budget spent" is exit 1 with the budget (the
# evaluator's own, for the evaluator) spent. "cannot start": a start no restart would mend (TaskExit.permanent).
# "exit 78": the program says no restart would mend it (model.CONFIG_EXIT_CODE, the Keras 3 guard), in no spec's
# permanent_exit_codes.
GROUP = ("group budget wait", "fail", "group preemption now", "group nothing now", "group budget wait", "fail", "fail",
         "fail")
EVALUATOR = ("evaluator evaluator-budget wait", "evaluator evaluator-budget wait", "evaluator evaluator-budget now",
             "anew evaluator-budget now", "anew evaluator-budget wait", "given up", "given up", "given up")
NOTHING = ("nothing",) * 8
HUNG = ("group budget wait", "-", "-", "-", "-", "fail", "-", "-")
PS_AND_CHIEF = ("ps+chief budget wait", "fail", "ps+chief preemption now", "group nothing now", "group budget wait",
                "fail", "fail", "fail")
WORKER_ALONE = ("worker:1 budget wait", "fail", "worker:1 preemption now", "group nothing now", "group budget wait",
                "fail", "fail", "fail")
LOST_ONLY = ("-", "-", "-", "-", "group nothing wait", "-", "-", "-")

TABLE = [
    # strategies            role         phase      exit 1 | permanent | 42 | port taken | node lost | budget spent | cannot start | 78
    (ONE_TASK + MWMS,       "chief",     JobState.STARTING,  GROUP),
    (ONE_TASK + MWMS,       "chief",     JobState.RUNNING,   GROUP),
    (ONE_TASK + MWMS,       "worker",    JobState.STARTING,  GROUP),
    (ONE_TASK + MWMS,       "worker",    JobState.RUNNING,   GROUP),
    (ONE_TASK + MWMS,       "evaluator", JobState.STARTING,  EVALUATOR),
    (ONE_TASK + MWMS,       "evaluator", JobState.RUNNING,   EVALUATOR),
    (ONE_TASK + MWMS,       "evaluator", FINAL,     NOTHING),
    (ONE_TASK + MWMS,       WATCHDOG,    JobState.RUNNING,   HUNG),
    (PS,                    "chief",     JobState.STARTING,  GROUP),
    (PS,                    "chief",     JobState.RUNNING,   PS_AND_CHIEF),
    (PS,                    "chief",     PARTIAL,   LOST_ONLY),
    (PS,                    "ps",        JobState.STARTING,  GROUP),
    (PS,                    "ps",        JobState.RUNNING,   PS_AND_CHIEF),
    (PS,                    "ps",        PARTIAL,   LOST_ONLY),
    (PS,                    "ps",        FINAL,     NOTHING),
    (PS,                    "worker",    JobState.STARTING,  GROUP),
    (PS,                    "worker",    JobState.RUNNING,   WORKER_ALONE),
    (PS,                    "worker",    PARTIAL,   GROUP),
    (PS,                    "worker",    FINAL,     NOTHING),
    (PS,                    "evaluator", JobState.STARTING,  EVALUATOR),
    (PS,                    "evaluator", JobState.RUNNING,   EVALUATOR),
    (PS,                    "evaluator", PARTIAL,   EVALUATOR),
    (PS,                    "evaluator", FINAL,     NOTHING),
    (PS,                    WATCHDOG,    JobState.RUNNING,   HUNG),
]

CASES = [pytest.param(strategy, role, phase, exit, cell, id=f"{strategy}-{role}-{phase}-{exit}")
         for strategies, role, phase, cells in TABLE for strategy in strategies
         for exit, cell in zip(EXITS, cells) if cell != "-"]


def roles_of(strategy: str, role: str) -> dict:
    if strategy in ONE_TASK:  # one training task: a chief or a worker
        return {"chief" if role == "chief" else "worker": {"count": 1}, "evaluator": {}}
    if strategy == "parameter_server":
        return {"chief": {}, "worker": {"count": 2}, "ps": {"count": 2}, "evaluator": {}}
    return {"chief": {}, "worker": {"count": 2}, "evaluator": {}}


def job_in(strategy: str, role: str, phase: str) -> Job:
    spec = parse_spec({"name": "j", "strategy": strategy, "command": ["p"], "roles": roles_of(strategy, role),
                       "restart": {"max_restarts": MAX_RESTARTS, "backoff_seconds": BACKOFF,
                                   "permanent_exit_codes": [PERMANENT]}})
    tasks = [Task(t, i, node=f"n{i}", state=TaskState.RUNNING) for t in ("chief", "worker", "ps", "evaluator")
             for i in range(spec.count(t))]
    job = Job(id="j-1", spec=spec, state=JobState.STARTING if phase == JobState.STARTING else JobState.RUNNING,
              tasks=tasks)
    if phase == PARTIAL:  # ps:0 failed; ps and chief are being stopped to restart in place
        job.state, job.outcome, job.restarts = JobState.STOPPING, RESTART, 1
        job.restarting = tuple(t.key for t in tasks if t.type in ("ps", "chief"))
        job.task("ps", 0).state = TaskState.STOPPED
    if phase == FINAL:  # the chief finished; the evaluator evaluates the final checkpoint
        for task in job.training_tasks():
            if task.type not in ("ps", "worker") or strategy != "parameter_server":
                task.state = TaskState.SUCCEEDED
        job.final_evaluation_until = 1000.0
    return job


def failure_of(job: Job, role: str, exit: str) -> tuple[Failure, str]:
    """The failure of the role's last task (or the watchdog's), and the task type it is decided under."""
    if role == WATCHDOG:
        key, task_type = R.WATCHDOG, R.WATCHDOG
    else:
        key, task_type = [t.key for t in job.tasks if t.type == role][-1], role
    if exit == "budget spent":
        job.restarts = job.evaluator_restarts = MAX_RESTARTS
    how = {"exit 1": {"exit_code": 1}, "budget spent": {"exit_code": 1}, "permanent": {"exit_code": PERMANENT},
           "exit 42": {"exit_code": 42}, "port taken": {"message": "port 20001 in use", "busy_port": 20001},
           "node lost": {"message": "node n1 lost"},
           "cannot start": {"message": "cannot enter the workdir /w", "permanent": True},
           "exit 78": {"exit_code": CONFIG_EXIT_CODE}}[exit]
    if role == WATCHDOG:
        how = {"message": "hung: no task wrote output"}
    return Failure(key, "n1", TaskExit(**how), 0.0, lost=exit == "node lost"), task_type


def expected(job: Job, cell: str) -> tuple:
    """(scope, charge, delay, tasks, place_anew) that a cell says."""
    if cell in ("fail", "given up", "nothing"):
        scope = {"fail": R.FAIL, "given up": R.EVALUATOR_GIVEN_UP, "nothing": R.NOTHING}[cell]
        return scope, R.NO_CHARGE, 0.0, (), False
    what, charge, delay = cell.split()
    charge = {"budget": R.BUDGET, "preemption": R.PREEMPTION, "nothing": R.NO_CHARGE,
              "evaluator-budget": R.EVALUATOR_BUDGET}[charge]
    delay = BACKOFF if delay == "wait" else 0.0
    if what == "group":
        return R.GROUP, charge, delay, (), False
    if what in ("evaluator", "anew"):
        return R.EVALUATOR, charge, delay, ("evaluator:0",), what == "anew"
    if what == "ps+chief":
        return R.TASKS, charge, delay, ("chief:0", "ps:0", "ps:1"), False
    return R.TASKS, charge, delay, (what,), False


@pytest.mark.parametrize("strategy, role, phase, exit, cell", CASES)
def test_the_policy_table(strategy, role, phase, exit, cell):
    job = job_in(strategy, role, phase)
    failure, task_type = failure_of(job, role, exit)
    d = R.decide(job, failure, task_type)
    assert (d.scope, d.charge, d.delay, tuple(sorted(d.tasks)), d.place_anew) == expected(job, cell)


def test_the_table_covers_every_strategy_role_phase_and_exit():
    strategies = {s for s, *_ in [c.values for c in CASES]}
    assert strategies == {"mirrored", "central_storage", "multi_worker_mirrored", "parameter_server"}
    assert {c.values[1] for c in CASES} == {"chief", "worker", "ps", "evaluator", WATCHDOG}
    assert {c.values[2] for c in CASES} == {JobState.STARTING, JobState.RUNNING, PARTIAL, FINAL}
    assert {c.values[3] for c in CASES} == set(EXITS)


# ---- what the job's message says -----------------------------------------------------------------------

def decide(job, key, **exit):
    lost = exit.pop("lost", False)
    return R.decide(job, Failure(key, "n1", TaskExit(**exit), 0.0, lost=lost), key.split(":")[0])


def test_reasons_name_what_restarts_and_the_backoff():
    job = job_in("parameter_server", "chief", JobState.RUNNING)
    assert decide(job, "ps:1", exit_code=1).reason == "restarting ps and chief, in 10 s (backoff_seconds)"
    assert decide(job, "worker:1", exit_code=1).reason == "restarting worker:1 alone, in 10 s (backoff_seconds)"
    assert decide(job, "worker:1", exit_code=42).reason == "restarting worker:1 alone", "for free: no backoff"
    assert decide(job_in("multi_worker_mirrored", "worker", JobState.RUNNING), "worker:1", exit_code=42).reason == \
        "preemption checkpoint saved"
    assert decide(job, "worker:1", busy_port=20001).reason == "placing the group again"
    assert decide(job, "evaluator:0", exit_code=1).reason == "evaluator restarted, in 10 s (backoff_seconds)"
    assert decide(job, "evaluator:0", lost=True).reason.startswith("evaluator to be placed again")
    assert decide(job, "chief:0", exit_code=PERMANENT).reason == "a permanent exit code, not restarted"
    job.restarts = job.evaluator_restarts = 3
    assert decide(job, "chief:0", exit_code=1).reason == "restart budget spent (3 of 3)"
    assert decide(job, "evaluator:0", exit_code=1).reason == \
        "evaluator not restarted (its 3 restarts are spent); training goes on"


def test_a_failure_during_a_restart_in_place_says_what_was_restarting():
    job = job_in("parameter_server", "worker", PARTIAL)
    assert decide(job, "worker:1", exit_code=1).reason == \
        "restarting the training group (it was restarting chief:0, ps:0, ps:1 in place), in 10 s (backoff_seconds)"
    assert decide(job, "chief:0", lost=True).reason.startswith("it cannot restart in place")


def test_free_restarts_ignore_a_spent_budget():
    job = job_in("multi_worker_mirrored", "worker", JobState.RUNNING)
    job.restarts = MAX_RESTARTS
    assert decide(job, "worker:1", exit_code=42).scope == R.GROUP
    assert decide(job, "worker:1", busy_port=20001).scope == R.GROUP


def test_a_ps_on_a_lost_node_turns_a_restart_in_place_into_the_groups():
    job = job_in("parameter_server", "chief", JobState.RUNNING)
    job.task("ps", 1).state = TaskState.LOST
    assert decide(job, "chief:0", exit_code=1).scope == R.GROUP


def test_no_backoff_means_no_delay():
    spec = parse_spec({"name": "j", "strategy": "mirrored", "command": ["p"], "roles": {"worker": {}}})
    job = Job(id="j-2", spec=spec, state=JobState.RUNNING,
              tasks=[Task("worker", 0, node="n1", state=TaskState.RUNNING)])
    d = decide(job, "worker:0", exit_code=1)
    assert (d.scope, d.delay, d.reason) == (R.GROUP, 0.0, "restarting the training group")


def test_book_charges_the_counter_and_sets_when_the_restart_may_launch():
    job = job_in("parameter_server", "chief", JobState.RUNNING)
    failure = Failure("worker:1", "n1", TaskExit(exit_code=1), 50.0)
    R.book(job, R.decide(job, failure, "worker"), failure, now=50.0)
    assert (job.restarts, job.preemptions, job.not_before) == (1, 0, 60.0)
    assert job.seen.restart_causes == ["failure"]
    preempted = Failure("worker:0", "n1", TaskExit(exit_code=42), 55.0)
    R.book(job, R.decide(job, preempted, "worker"), preempted, now=55.0)
    assert (job.restarts, job.preemptions, job.not_before) == (1, 1, 60.0), "a free restart never shortens a wait"
    evaluator = Failure("evaluator:0", "n3", TaskExit(exit_code=1), 70.0)
    R.book(job, R.decide(job, evaluator, "evaluator"), evaluator, now=70.0)
    assert (job.restarts, job.evaluator_restarts, job.not_before) == (1, 1, 80.0)
    job.restarts = MAX_RESTARTS
    R.book(job, R.decide(job, failure, "worker"), failure, now=90.0)
    assert (job.restarts, job.not_before) == (MAX_RESTARTS, 80.0), "failing charges nothing and waits for nothing"


@pytest.mark.parametrize("phase", [JobState.STARTING, JobState.RUNNING, JobState.STOPPING, FINAL])
def test_a_preemption_by_a_higher_class_restarts_the_group_at_once_charging_only_preemptions(phase):
    job = job_in("multi_worker_mirrored", "worker", phase)
    if phase == JobState.STOPPING:
        job.state = JobState.STOPPING
    job.restarts = MAX_RESTARTS  # a spent budget changes nothing: the job did not fail
    decision = R.preempted(job, "preempted by job y-7 at 14:03")
    if phase in (JobState.STOPPING, FINAL):  # stopping already, or only the final evaluation is left
        assert decision.scope == R.NOTHING
        return
    assert (decision.scope, decision.charge, decision.delay) == (R.GROUP, R.PREEMPTION, 0.0)
    assert decision.reason == "preempted by job y-7 at 14:03"
    R.book(job, decision, None, now=50.0)
    assert (job.restarts, job.preemptions, job.not_before) == (MAX_RESTARTS, 1, 50.0)
    assert job.seen.restart_causes == [R.PREEMPTED] and R.PREEMPTED in R.CAUSES
