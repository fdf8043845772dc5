"""The states and their transition table (tfcluster/states.py): the values users and stores already hold, and a
table every state can be reached through and every job can end by."""

from __future__ import annotations

import pytest
from coresim import make_spec

from tfcluster import wire
from tfcluster.api.v1 import types_pb2 as pb
from tfcluster.daemon.coordinator.core.model.job import Job, Task
from tfcluster.model import TaskExit
from tfcluster.states import (ENDED_JOB_STATES, ENDED_PHASES, JOB_TRANSITIONS, PHASE_TRANSITIONS, TASK_TRANSITIONS,
                              IllegalTransition, JobState, NodeState, Phase, TaskState, TERM_TRANSITIONS, Term,
                              check_transition)


def test_values_stay_what_the_wire_the_store_and_status_json_hold():
    assert [s.value for s in JobState] == ["PENDING", "STARTING", "RUNNING", "STOPPING", "SUCCEEDED", "FAILED",
                                           "STOPPED"]
    assert [s.value for s in TaskState] == ["PENDING", "LAUNCHING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED",
                                            "LOST"]
    assert [s.value for s in NodeState] == ["READY", "LOST"]
    assert [s.value for s in Phase] == ["STARTING", "RUNNING", "EXITED", "FAILED_TO_START"]
    assert ENDED_JOB_STATES == {"SUCCEEDED", "FAILED", "STOPPED"} == {s for s in JobState if s.ended}


def reachable(table, start):
    seen, todo = {start}, [start]
    while todo:
        for nxt in table[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


@pytest.mark.parametrize("table, start, enum", [(JOB_TRANSITIONS, JobState.PENDING, JobState),
                                                (TASK_TRANSITIONS, TaskState.PENDING, TaskState)])
def test_every_state_is_in_the_table_and_reachable_from_pending(table, start, enum):
    assert set(table) == set(enum)
    assert reachable(table, start) == set(enum)


def test_an_ended_job_goes_nowhere_and_every_job_can_end_from_every_state():
    for state in JobState:
        assert (not JOB_TRANSITIONS[state]) == state.ended
        assert reachable(JOB_TRANSITIONS, state) & {s for s in JobState if s.ended}


def test_a_move_off_the_table_is_refused_and_changes_nothing():
    job = Job(id="j-1", spec=make_spec(worker=1), state=JobState.SUCCEEDED)
    with pytest.raises(IllegalTransition, match="j-1: SUCCEEDED -> RUNNING"):
        job.move(JobState.RUNNING)
    assert job.state == JobState.SUCCEEDED
    task = Task("worker", 0)
    with pytest.raises(IllegalTransition, match="worker:0: PENDING -> RUNNING"):
        task.move(TaskState.RUNNING)  # never reported running before it was launched
    task.move(TaskState.LAUNCHING)
    with pytest.raises(IllegalTransition, match="not a TaskState"):
        task.move(JobState.RUNNING)  # equal as strings, but a job's state
    assert task.state is TaskState.LAUNCHING


def test_states_read_back_from_the_store_become_members_and_unknown_ones_are_refused():
    job = Job(id="j-1", spec=make_spec(worker=1), state="RUNNING", tasks=[Task("worker", 0, state="LOST")])
    assert job.state is JobState.RUNNING and job.tasks[0].state is TaskState.LOST
    with pytest.raises(ValueError):
        Task("worker", 0, state="RESTART")


def test_a_task_starting_over_keeps_only_how_its_last_attempt_ended_until_the_next_launch():
    task = Task("worker", 0, node="n1", host="10.0.0.1", port=20000, state=TaskState.FAILED, attempt=2, pid=7,
                stop_grace=5.0, ready=True, exit=TaskExit(exit_code=1))
    task.start_over(TaskState.PENDING, unplace=True)
    assert (task.pid, task.stop_grace, task.ready, task.attempt, task.exit.exit_code) == (0, None, False, 2, 1)
    assert (task.node, task.host, task.port, task.address) == ("", "", 0, "")
    task.start_over(TaskState.LAUNCHING)
    assert task.attempt == 3 and task.exit is None


def test_every_reported_phase_has_its_wire_value():
    assert set(wire.PHASES) == {Phase.RUNNING, Phase.EXITED, Phase.FAILED_TO_START}  # STARTING stays on the agent
    assert wire.PHASES[Phase.RUNNING] == pb.TASK_PHASE_RUNNING


def test_an_attempt_starts_runs_and_ends_and_an_ended_one_goes_nowhere():
    assert set(PHASE_TRANSITIONS) == set(Phase)
    assert reachable(PHASE_TRANSITIONS, Phase.STARTING) == set(Phase)
    assert ENDED_PHASES == {Phase.EXITED, Phase.FAILED_TO_START}
    check_transition("worker:0", Phase.STARTING, Phase.EXITED)  # stopped before it started
    for old, new in ((Phase.RUNNING, Phase.FAILED_TO_START), (Phase.EXITED, Phase.RUNNING),
                     (Phase.FAILED_TO_START, Phase.EXITED)):
        with pytest.raises(IllegalTransition, match=f"worker:0: {old} -> {new} is not a transition"):
            check_transition("worker:0", old, new)


def test_a_coordinator_stands_by_before_it_leads_and_after():
    assert set(TERM_TRANSITIONS) == set(Term) and reachable(TERM_TRANSITIONS, Term.STARTING) == set(Term)
    check_transition("c", Term.LEADER, Term.STANDBY)
    with pytest.raises(IllegalTransition, match="c: starting -> leader is not a transition"):
        check_transition("c", Term.STARTING, Term.LEADER)
