"""Every state a job, a task, a node, a task attempt or a coordinator's HA term can be in, and which state may follow
which.

The values are what users and other programs see: they go over the wire, into the store and into
`tfcluster status --json`, so a value never changes once released. Each enum is a `str`, so a value read
back from any of those places compares equal to its member.

A job goes PENDING -> STARTING -> RUNNING -> STOPPING -> SUCCEEDED | FAILED | STOPPED. A job that must
end or restart first passes through STOPPING until every task has exited, so no state says "done" while a
process of the job is still alive; from STOPPING a restart goes back to PENDING (placed again as a whole)
or to STARTING (some tasks relaunched in place). The coordinator changes a job's or a task's state only
through their `move` (tfcluster/daemon/coordinator/core/model/job.py), which calls `check_transition`, so the tables
below are the whole truth about what can happen.

This module imports nothing of tfcluster: the CLI, the agent and the dashboard all read it.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Mapping
from typing import Union

if sys.version_info >= (3, 11):
    StrEnum = enum.StrEnum
else:  # Python 3.10 (Ubuntu 22.04's): the same behaviour where it is relied on, str() and format() of the value
    class StrEnum(str, enum.Enum):
        def __str__(self) -> str:
            return self.value


class IllegalTransition(RuntimeError):
    """A state change the tables below do not allow: a bug in the coordinator, never a user's error."""


class JobState(StrEnum):
    PENDING = "PENDING"      # waiting to be placed (first, or again after a whole-group restart)
    STARTING = "STARTING"    # placed; its tasks are launched wave by wave
    RUNNING = "RUNNING"      # every task is up
    STOPPING = "STOPPING"    # ending or restarting: waiting for its tasks to exit
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"      # by its user

    @property
    def ended(self) -> bool:
        """Over for good: nothing of the job runs, and nothing will again."""
        return self in _JOB_ENDED


_JOB_ENDED = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED})

JOB_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    # Placed; stopped by its user before it ran; or it can never fit (the nodes it named are gone).
    JobState.PENDING: frozenset({JobState.STARTING, JobState.STOPPED, JobState.FAILED}),
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.STOPPING}),
    JobState.RUNNING: frozenset({JobState.STOPPING}),
    # Once its tasks are gone: its outcome; back to PENDING (a whole-group restart) or STARTING (tasks restarted in
    # place); or back to RUNNING when the chief finished while some tasks were being restarted in place.
    JobState.STOPPING: frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED, JobState.PENDING,
                                  JobState.STARTING, JobState.RUNNING}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.STOPPED: frozenset(),
}

# Job states as strings, for clients that hold a value from the wire (a newer coordinator's unknown state is
# then simply not ended, rather than an error).
ENDED_JOB_STATES = frozenset(s.value for s in _JOB_ENDED)


class TaskState(StrEnum):
    """A task as the coordinator keeps it (one task, through all its attempts)."""
    PENDING = "PENDING"      # not launched: waiting for its wave, its placement or a restart's backoff
    LAUNCHING = "LAUNCHING"  # its launch is sent; its agent has not reported it running yet
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"  # exited 0
    FAILED = "FAILED"        # exited otherwise, or never started, without being asked to stop
    STOPPED = "STOPPED"      # exited after it was asked to stop (or stopped before it was launched)
    LOST = "LOST"            # its node is gone, or its agent no longer has it

    @property
    def live(self) -> bool:
        """A process of this task may be running on its node."""
        return self in (TaskState.LAUNCHING, TaskState.RUNNING)

    @property
    def ended(self) -> bool:
        """Its last attempt is over (a restart may still launch another)."""
        return self in _TASK_ENDED


_TASK_ENDED = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED, TaskState.LOST})

TASK_TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = {
    # Launched; stopped with its job before it was launched; lost with the node it was placed on.
    TaskState.PENDING: frozenset({TaskState.LAUNCHING, TaskState.STOPPED, TaskState.LOST}),
    TaskState.LAUNCHING: frozenset({TaskState.RUNNING}) | _TASK_ENDED,  # an attempt can end before it runs
    TaskState.RUNNING: _TASK_ENDED,
    # An ended task waits again to be relaunched (restarted, or placed anew with its job).
    **{ended: frozenset({TaskState.PENDING}) for ended in _TASK_ENDED},
}


class SweepState(StrEnum):
    """A sweep (tfcluster/sweepspec.py): RUNNING while it submits trials or any runs, then how it ended. Its
    trials are jobs, each with its own JobState."""
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"  # every trial was submitted and has ended (whatever each trial's outcome)
    FAILED = "FAILED"        # a trial could not be submitted (it can never be placed, or its class was refused)
    STOPPED = "STOPPED"      # by its user: no more trials, and its live ones were stopped

    @property
    def ended(self) -> bool:
        return self != SweepState.RUNNING


class NodeState(StrEnum):
    READY = "READY"  # its agent is connected and heard from
    LOST = "LOST"    # not heard from for too long: its tasks count as lost after the task grace (cluster.py)


class DrainState(StrEnum):
    """A drained node (`tfcluster node drain`), whatever its agent's liveness: nothing new is placed there."""
    DRAINING = "DRAINING"  # tasks of jobs placed before the drain still run there
    DRAINED = "DRAINED"    # none do: it can be taken down


class Phase(StrEnum):
    """A task attempt as its agent sees it (what agents report, and what a task's status file says)."""
    STARTING = "STARTING"                # launched, its process not started yet (agent-side only)
    RUNNING = "RUNNING"
    EXITED = "EXITED"                    # exit code or signal known
    FAILED_TO_START = "FAILED_TO_START"  # never ran (missing program, port taken); the exit says why


class Term(StrEnum):
    """Where a coordinator that shares its etcd store with others stands (its status line says it)."""
    STARTING = "starting"  # not yet in the election
    STANDBY = "standby"    # refusing every call with where the leader is, its warm copy kept
    LEADER = "leader"      # serving, every write fenced on its term


# A coordinator stands by, wins and leads, and after a term stands by again; it never leads without standing by.
TERM_TRANSITIONS: Mapping[Term, frozenset[Term]] = {
    Term.STARTING: frozenset({Term.STANDBY}),
    Term.STANDBY: frozenset({Term.LEADER}),
    Term.LEADER: frozenset({Term.STANDBY}),
}


# An attempt starts (its dirs, code, environment, then its shim), runs, and ends: EXITED with an exit code or signal,
# or FAILED_TO_START when its process never ran. A stop that comes while it starts ends it EXITED, never run.
PHASE_TRANSITIONS: Mapping[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset({Phase.RUNNING, Phase.EXITED, Phase.FAILED_TO_START}),
    Phase.RUNNING: frozenset({Phase.EXITED}),
    Phase.EXITED: frozenset(),
    Phase.FAILED_TO_START: frozenset(),
}
ENDED_PHASES = frozenset(p for p, following in PHASE_TRANSITIONS.items() if not following)
_TABLES = {JobState: JOB_TRANSITIONS, TaskState: TASK_TRANSITIONS, Phase: PHASE_TRANSITIONS,
           Term: TERM_TRANSITIONS}


State = Union[JobState, TaskState, Phase, Term]


def check_transition(what: str, old: State, new: State) -> None:
    """Raises IllegalTransition unless `new` may follow `old` (staying in a state is no transition)."""
    if type(new) is not type(old):  # a job's RUNNING equals a task's RUNNING as a string, but is not one
        raise IllegalTransition(f"{what}: {new!r} is not a {type(old).__name__}")
    next_states = _TABLES[type(old)][old]
    if new != old and new not in next_states:
        allowed = ", ".join(sorted(next_states)) or "nothing: it has ended"
        raise IllegalTransition(f"{what}: {old} -> {new} is not a transition (from {old}: {allowed})")
