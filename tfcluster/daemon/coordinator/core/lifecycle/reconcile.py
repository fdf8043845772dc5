"""Reconcile one node: what should run there against what its agent says runs there. Pure.

Every heartbeat lists the attempts the agent is running. Compared with the tasks placed on that node, any
lost message shows up as a difference, and the difference is what gets sent, at most once per
`resend_after` seconds per task:

- a launch not yet confirmed is sent again: an agent that already has the attempt answers with its
  current report, so a lost RUNNING (or listening) report heals the same way;
- a task the coordinator thinks is running but the agent no longer lists has ended and its exit report was
  lost: its launch is sent again, and the agent answers with the exit it recorded;
- a stop that did not take effect is sent again, with the (possibly shorter) grace asked for last; a task
  told to stop before its launch was confirmed, which the agent does not run, never started: it is over;
- an attempt the agent runs that the coordinator does not want there (an old attempt, a task of an ended
  or removed job, a task moved elsewhere) is told to stop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tfcluster.commands import Command, Stop
from tfcluster.daemon.coordinator.core.lifecycle import transitions as lifecycle
from tfcluster.daemon.coordinator.core.lifecycle.launch import launch_commands
from tfcluster.daemon.coordinator.core.model.job import Job, Task
from tfcluster.model import Attempt, TaskExit
from tfcluster.states import TaskState


def reconcile_node(node: str, placed: Iterable[tuple[Job, Task]], running: Iterable[Attempt],
                   jobs: Mapping[str, Job], stops_sent: dict[Attempt, float], now: float,
                   resend_after: float) -> list[Command]:
    """Commands that bring the node's agent in line. stops_sent (the node's record of stops sent for
    attempts nobody wants) is updated in place."""
    running = set(running)
    commands: list[Command] = []
    wanted = set()
    for job, task in placed:
        attempt = job.attempt_of(task)
        if task.live:
            wanted.add(attempt)
        commands += _heal(job, task, attempt in running, now, resend_after)
    for attempt in running - wanted:
        if now - stops_sent.get(attempt, float("-inf")) >= resend_after:
            stops_sent[attempt] = now
            job = jobs.get(attempt.job_id)
            commands.append(Stop(node=node, attempt=attempt,
                                 grace_seconds=job.spec.stop_grace_seconds if job else 0.0))
    for attempt in [a for a in stops_sent if a not in running]:
        del stops_sent[attempt]
    return commands


def _heal(job: Job, task: Task, running: bool, now: float, resend_after: float) -> list[Command]:
    seen = task.seen
    if task.state == TaskState.RUNNING:
        seen.missing_since = 0.0 if running else (seen.missing_since or now)
    if now - seen.sent_at < resend_after:
        return []
    if task.state == TaskState.LAUNCHING and task.stop_grace is not None and not running:
        return lifecycle.ended(job, task, TaskExit(message="stopped before it started"), now)
    if task.state == TaskState.LAUNCHING and task.stop_grace is not None:
        seen.sent_at = now
        return [Stop(node=task.node, attempt=job.attempt_of(task), grace_seconds=task.stop_grace)]
    if task.state == TaskState.LAUNCHING:
        resend = True
    elif task.state == TaskState.RUNNING and not running:
        resend = now - seen.missing_since >= resend_after
    elif task.state == TaskState.RUNNING and task.stop_grace is not None:
        seen.sent_at = now
        return [Stop(node=task.node, attempt=job.attempt_of(task), grace_seconds=task.stop_grace)]
    else:  # running; waiting for it to listen, that report may have been lost
        resend = task.state == TaskState.RUNNING and not task.ready and job.profile.must_listen(task.type)
    if not resend:
        return []
    seen.sent_at = now
    return launch_commands(job, task)
