"""Per-task features of the agent, as hooks on the life of each task attempt.

The agent itself only keeps the session with the coordinator (session.py) and runs each attempt under the
supervisor; everything else it does for a task (evaluation events, evaluator summaries, checkpoint
shipping, checkpoint copies) is a TaskHook, listed once in Agent.hooks. A new per-task feature is a new
module with a hook class added to that list.

A hook sends what it has for the coordinator through the function it was given (the stream's queue), and
is called:
- on_register: a session began; the coordinator may be new (restarted) and know nothing it was sent;
- on_poll: every POLL_SECONDS while connected, for each running attempt, and for each ended one until every hook
  is finished_with it (again after each registration, which may ask a hook to send it all again);
- on_exit: an attempt ended; called before its exit is reported, so what the hook sends arrives first;
- on_forget: the supervisor no longer keeps an ended attempt (nor its task, if no later attempt came): what the hook
  keeps for it goes too;
- handle: a coordinator command of one of the types in `commands`;
- jobs_in_use: jobs whose files retention must leave alone because of the hook's work.
Hooks run on the agent's threads, so each guards its own state; one hook's failure never reaches another's.
"""

from __future__ import annotations

from collections.abc import Callable

from tfcluster.api.v1 import agent_pb2
from tfcluster.model import Attempt

POLL_SECONDS = 0.2
ATTEMPTS_REMEMBERED = 4096  # per kind, the oldest forgotten first: a node's agent runs for months

Send = Callable[[agent_pb2.AgentMessage], None]  # queues a message for the coordinator's stream


class TaskHook:
    """Does nothing by default: a feature overrides what it needs."""
    commands: tuple[type, ...] = ()

    def on_register(self) -> None:
        """A session with the coordinator began."""

    def on_poll(self, record) -> None:
        """`record` is the supervisor's TaskRecord of one attempt."""

    def on_exit(self, record) -> None:
        """The attempt of `record` ended; its exit is reported next."""

    def finished_with(self, record) -> bool:
        """Whether this hook has nothing left to do for the ended attempt of `record` until the next registration:
        once every hook is, the attempt is not polled again. A node that ran thousands of short tasks in the last
        hour (the supervisor keeps them that long) would otherwise poll every one of them five times a second."""
        return True

    def on_forget(self, record) -> None:
        """The supervisor no longer keeps the ended attempt of `record`, the latest of its task on this node."""

    def handle(self, command) -> None:
        raise TypeError(f"{type(self).__name__} does not carry out {type(command).__name__}")

    def jobs_in_use(self) -> set[str]:
        return set()


def remember(attempts: dict[Attempt, None], attempt: Attempt) -> None:
    """Adds attempt to an insertion-ordered set of at most ATTEMPTS_REMEMBERED, forgetting the oldest."""
    attempts[attempt] = None
    if len(attempts) > ATTEMPTS_REMEMBERED:
        del attempts[next(iter(attempts))]
