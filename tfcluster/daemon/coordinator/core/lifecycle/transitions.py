"""The job state machine: PENDING -> STARTING -> RUNNING -> STOPPING -> SUCCEEDED | FAILED | STOPPED. Pure.

Each transition changes a Job (job.py) and returns the commands (commands.py) the agents must be sent. A job
that must end or restart first passes through STOPPING until every task has exited, so no state says
"done" while a process of the job is still alive. What a failure leads to is the restart policy's
decision (restart.py); completion is explicit (an evaluator or ps left running must never hang a finished
job): the chief finishes, the evaluator is told the final checkpoint and evaluates it within a deadline,
only then are ps and workers stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tfcluster import layout
from tfcluster.commands import Command, FinishTraining, Stop
from tfcluster.daemon.coordinator.core.lifecycle import checkpoint_copies
from tfcluster.daemon.coordinator.core.lifecycle import completion
from tfcluster.daemon.coordinator.core.lifecycle import restart
from tfcluster.daemon.coordinator.core.lifecycle.launch import launch_commands
from tfcluster.daemon.coordinator.core.model import accounting, elastic
from tfcluster.daemon.coordinator.core.model.capacity import TaskPlacement
from tfcluster.daemon.coordinator.core.model.job import Failure, Job, Task, describe_preemption, preemption_note
from tfcluster.daemon.logformat import fields
from tfcluster.model import EVALUATOR, WORKER, NodeInfo, TaskExit, is_training
from tfcluster.roles.tfconfig import cluster_json
from tfcluster.states import JobState, TaskState

log = logging.getLogger("tfcluster.coordinator")

NodeLookup = Callable[[str], "NodeInfo | None"]  # a READY node's description, None when it is not READY


# ---- placing and launching ----------------------------------------------------------------------

def place(job: Job, placement: list[TaskPlacement], info_of: NodeLookup, now: float) -> list[Command]:
    """PENDING -> STARTING: tasks get nodes, GPUs and ports; the first wave launches (after the chief's
    checkpoints were copied to the group's nodes, when they are host-local)."""
    assert job.state == JobState.PENDING, job.state
    resized = elastic.take_size(job, sum(1 for p in placement if p.type == WORKER))
    if resized:
        log.info("%s: %s", job.id, resized, extra=fields(job=job.id))
    job.cluster_json = cluster_json((p.type, p.index, p.address) for p in placement)
    for p in placement:
        _put(job, job.task(p.type, p.index), p, info_of(p.node))
    job.final_evaluation_until = 0.0
    job.move(JobState.STARTING)
    job.message, job.placed, job.held_for = resized, now, ""
    return checkpoint_copies.restore(job, info_of, now) + advance(job, now)


def place_again(job: Job, placement: list[TaskPlacement], info_of: NodeLookup, now: float) -> list[Command]:
    """Gives tasks that lost their node a new one and launches them (only the evaluator does this: it is not
    in the cluster, so no other task's TF_CONFIG changes)."""
    actions: list[Command] = []
    for p in placement:
        task = job.task(p.type, p.index)
        _put(job, task, p, info_of(p.node))
        actions += launch_tasks(job, [task], now)
    return actions


def _put(job: Job, task: Task, p: TaskPlacement, node: NodeInfo) -> None:
    task.node, task.host, task.port, task.gpus = p.node, p.host, p.port, p.gpus
    task.peer = node.peer_address
    task.checkpoint_dir = job.spec.checkpoint_dir or layout.host_checkpoint_dir(node.state_dir, job.id)
    task.start_over(TaskState.PENDING)


def unplaced_tasks(job: Job, now: float) -> list[Task]:
    """Tasks of a placed job that lost their node (or port) and wait for a new one (the evaluator), once
    their restart's backoff has passed."""
    return [] if now < job.not_before else job.lost_tasks()


def launch_tasks(job: Job, tasks: list[Task], now: float) -> list[Command]:
    actions: list[Command] = []
    for task in tasks:
        task.start_over(TaskState.LAUNCHING)
        task.seen.sent_at = now
        actions += launch_commands(job, task)
    if job.decisive_task() in tasks or job.evaluator() in tasks:
        actions += checkpoint_copies.shipping(job)
    return actions


def advance(job: Job, now: float) -> list[Command]:
    """While STARTING: launch the next wave once every earlier task is up (and a restart's backoff has passed);
    RUNNING once all are."""
    if job.state != JobState.STARTING or job.syncing or now < job.not_before:
        return []
    if any(t.state == TaskState.LAUNCHING or (t.state == TaskState.RUNNING and not t.ready) for t in job.tasks):
        return []
    pending = [t for t in job.tasks if t.state == TaskState.PENDING and t.node]
    if pending:
        first = min(job.profile.launch_wave(t.type) for t in pending)
        return launch_tasks(job, [t for t in pending if job.profile.launch_wave(t.type) == first], now)
    job.move(JobState.RUNNING)
    job.seen.last_progress = now
    return []


def sync_done(job: Job, sync_id: int, ok: bool, message: str, now: float) -> list[Command]:
    return advance(job, now) if checkpoint_copies.sync_finished(job, sync_id, ok, message) else []


# ---- what agents report -------------------------------------------------------------------------

def running(job: Job, task: Task, pid: int, listening: bool, now: float) -> list[Command]:
    if task.state == TaskState.RUNNING:
        task.pid = task.pid or pid
        task.ready = task.ready or listening
        return advance(job, now)
    if task.state != TaskState.LAUNCHING:
        return []
    task.move(TaskState.RUNNING)
    task.pid, task.running_since = pid, now
    task.ready = listening or not job.profile.must_listen(task.type)
    return advance(job, now)


def ended(job: Job, task: Task, exit: TaskExit, now: float) -> list[Command]:
    """A task exited, or never started (exit code and signal None)."""
    if not task.live:
        return []
    task.exit = exit
    _account(job, task, exit, now)
    if exit.succeeded:
        task.move(TaskState.SUCCEEDED)
    else:
        task.move(TaskState.FAILED if task.stop_grace is None else TaskState.STOPPED)
    if exit.succeeded or (task.state == TaskState.FAILED and not exit.preempted and not exit.busy_port):
        job.seen.task_ended(task.node, failed=not exit.succeeded)
    if task.state == TaskState.STOPPED and exit.saved_step is not None:
        _saved_on_stop(job, exit.saved_step)
    return _after_task_end(job, task, now)


def _saved_on_stop(job: Job, step: int) -> None:
    """A stopped task saved a preemption checkpoint: the job's message says at which step (once: every worker
    of the group saves at the same step)."""
    note = f"saved at step {step}"
    if note not in job.message:
        job.message = f"{job.message}; {note}" if job.message else note
        log.info("%s: preemption checkpoint %s", job.id, note, extra=fields(job=job.id))


def lost(job: Job, task: Task, why: str, now: float) -> list[Command]:
    """The task's node is gone (or its agent forgot the task): a live task, or one placed there that waits to
    be launched (a later wave, a restart in place, one waiting for its backoff), is lost."""
    if not job.holds(task):
        return []
    task.move(TaskState.LOST)
    task.exit = TaskExit(message=why)
    _account(job, task, task.exit, now)
    return _after_task_end(job, task, now)


def _account(job: Job, task: Task, exit: TaskExit, now: float) -> None:
    """The attempt is over: what it used joins the job's usage (a lost attempt's GPUs count until it was found
    lost; its CPU figures are the last its heartbeats carried, the agent never having measured its end)."""
    live = task.seen.live
    cpu = exit.cpu_seconds or live.cpu_seconds
    peak = max(exit.peak_rss_bytes, live.peak_rss_bytes)
    job.usage = job.usage + accounting.attempt_usage(len(task.gpus), task.running_since, cpu, peak, now)
    task.running_since, task.seen.live = 0.0, accounting.Usage()


def progress(job: Job, task: Task, output_bytes: int, checkpoint: str, now: float) -> None:
    """Output grew or the chief's checkpoint changed: the job is not hung."""
    seen = task.seen
    if seen.output_bytes != output_bytes or (checkpoint and seen.checkpoint != checkpoint):
        seen.output_bytes, seen.checkpoint = output_bytes, checkpoint or seen.checkpoint
        job.seen.last_progress = max(job.seen.last_progress, now)


def _after_task_end(job: Job, task: Task, now: float) -> list[Command]:
    if task.state in (TaskState.FAILED, TaskState.LOST):
        failure = Failure(task=task.key, node=task.node, exit=task.exit, time=now, lost=task.state == TaskState.LOST)
        decision = restart.decide(job, failure, task.type)
        if decision.scope != restart.NOTHING:
            return _carry_out(job, decision, failure, now)
    if job.state == JobState.STOPPING:
        if job.final_evaluation_until and task.type == EVALUATOR and task.state == TaskState.SUCCEEDED:
            job.message = "final evaluation done"  # it exited by itself as its stop was on the way: not stopped
        return _finish_if_quiet(job, now)
    if job.final_evaluation_until:
        if task.type != EVALUATOR:  # training is over: a ps, worker or tf.data service server ending changes nothing
            return []
        how = "done" if task.state == TaskState.SUCCEEDED or completion.final_evaluated(job) else f"ended {task.state}"
        return wind_down(job, JobState.SUCCEEDED, f"final evaluation {how}", now)
    if task.state == TaskState.SUCCEEDED and is_training(task.type):
        return _check_training_done(job, now)
    return advance(job, now)


# ---- failures -----------------------------------------------------------------------------------

def _carry_out(job: Job, decision: restart.Decision, failure: Failure, now: float) -> list[Command]:
    """Does what the restart policy decided about one failure."""
    job.last_failure = failure
    message = f"{failure.describe()}; {decision.reason}"
    log.warning("%s: %s", job.id, message, extra=fields(job=job.id, node=failure.node,
                                                         task="" if failure.task == restart.WATCHDOG else failure.task))
    restart.book(job, decision, failure, now)
    if decision.scope == restart.FAIL:
        return wind_down(job, JobState.FAILED, message, now)
    if decision.scope == restart.GROUP:
        return wind_down(job, restart.RESTART, message, now)
    tasks = [t for t in job.tasks if t.key in decision.tasks]
    if any(t.live for t in tasks):  # stopped first; relaunched in place, in waves, once all are gone
        return wind_down(job, restart.RESTART, message, now, only=decision.tasks)
    job.message = message
    for task in tasks:  # dead already: relaunched while the others run on (placed anew by Cluster.schedule)
        task.start_over(TaskState.PENDING, unplace=decision.place_anew)
    # An evaluator given up while STARTING must not hold back the chief's wave or RUNNING either.
    return _launch_due(job, now)


def _launch_due(job: Job, now: float) -> list[Command]:
    """Launches the tasks that wait on their node for a restart in place, once its backoff has passed (a worker
    still waiting when training finishes is not needed any more: it is stopped with the others)."""
    if now < job.not_before or job.final_evaluation_until:
        return []
    waiting = [t for t in job.tasks if t.state == TaskState.PENDING and t.node]
    if job.state == JobState.STARTING and job.syncing:  # all wait for the chief's checkpoints, the evaluator too
        return []
    if job.state == JobState.STARTING:
        # The evaluator is outside the training cluster: it never waits for a launch wave.
        return launch_tasks(job, [t for t in waiting if t.type == EVALUATOR], now) + advance(job, now)
    if job.state == JobState.RUNNING or (job.state == JobState.STOPPING and job.restarting):
        return launch_tasks(job, waiting, now)
    return []


def _training_finished(job: Job) -> bool:
    """The chief (or worker 0) and every training task that runs the user program exited 0 (servers under
    parameter_server never exit by themselves)."""
    return all(t.state == TaskState.SUCCEEDED for t in job.training_tasks()
               if t is job.decisive_task() or not job.profile.serves_until_stopped(t.type))


def _check_training_done(job: Job, now: float) -> list[Command]:
    if not _training_finished(job):
        return []
    evaluator = job.evaluator()
    if evaluator is None or not evaluator.live:
        return wind_down(job, JobState.SUCCEEDED, "", now)
    job.final_evaluation_until = now + job.spec.evaluator_deadline_seconds
    evaluated(job, now)  # it may have evaluated the final checkpoint already, as the newest one
    job.message = completion.waiting_message(job)
    return [finish_training(job, now)]


def evaluated(job: Job, now: float) -> list[Command]:
    """A result was reported. Once training is over and the final checkpoint is evaluated, the evaluator has a
    few seconds to exit by itself; then tick() stops it and the job succeeds."""
    training = job.state in (JobState.STARTING, JobState.RUNNING)
    if job.final_evaluation_until and training and completion.final_evaluated(job):
        job.final_evaluation_until = min(job.final_evaluation_until, now + completion.EVALUATOR_EXIT_SECONDS)
        job.message = completion.waiting_message(job)
    return []


def finish_training(job: Job, now: float) -> FinishTraining:
    """Tells the evaluator which checkpoint is final (again, until it has ended: writing it twice is harmless)."""
    decisive, evaluator = job.decisive_task(), job.evaluator()
    job.seen.finish_sent_at = now
    return FinishTraining(node=evaluator.node, attempt=job.attempt_of(evaluator),
                          final_checkpoint=decisive.exit.final_checkpoint if decisive.exit else "")


# ---- time ---------------------------------------------------------------------------------------

def tick(job: Job, now: float) -> list[Command]:
    """Deadlines: the checkpoint copy's, the final evaluation's, the hang watchdog's, and a restart's backoff."""
    if job.syncing and now > job.sync_until:
        return sync_done(job, job.syncing, False,
                         f"no answer within {checkpoint_copies.SYNC_DEADLINE_SECONDS:g} s", now)
    training = job.state in (JobState.STARTING, JobState.RUNNING)
    if job.final_evaluation_until and training and now > job.final_evaluation_until:
        return wind_down(job, JobState.SUCCEEDED, completion.deadline_message(job), now)
    hang = job.spec.restart.hang_seconds
    last = job.seen.last_progress
    if hang and job.state == JobState.RUNNING and not job.final_evaluation_until and last and now - last > hang:
        decisive = job.decisive_task()
        exit = TaskExit(message=f"hung: no task wrote output and the chief saved no checkpoint for "
                                f"{now - last:.0f} s (hang_seconds = {hang:g})")
        job.seen.last_progress = now
        failure = Failure(task=restart.WATCHDOG, node=decisive.node, exit=exit, time=now)
        return _carry_out(job, restart.decide(job, failure, restart.WATCHDOG), failure, now)
    return _launch_due(job, now)


# ---- stopping -----------------------------------------------------------------------------------

def stop(job: Job, now: float, graceful: bool = True) -> list[Command]:
    """The user's stop. Again with graceful=False while tasks are still stopping: SIGKILL at once."""
    if job.ended:
        return []
    if job.state == JobState.PENDING:
        job.move(JobState.STOPPED)
        job.message, job.finished = "stopped by user", now
        return []
    return wind_down(job, JobState.STOPPED, "stopped by user", now, grace=None if graceful else 0.0)


def wind_down(job: Job, outcome: str, message: str, now: float, grace: float | None = None,
              only: tuple[str, ...] = ()) -> list[Command]:
    """Stops every live task (or only those named, for a partial restart); outcome once they are gone."""
    job.move(JobState.STOPPING)
    job.outcome, job.message, job.restarting = outcome, message, tuple(only)
    actions: list[Command] = []
    for task in job.tasks:
        if only and task.key not in only:
            continue
        if task.state == TaskState.PENDING and not only:
            task.move(TaskState.STOPPED)
        elif task.live:
            actions += stop_task(job, task, job.spec.stop_grace_seconds if grace is None else grace, now)
    return actions + _finish_if_quiet(job, now)


def stop_task(job: Job, task: Task, grace: float, now: float) -> list[Command]:
    """A stop, unless one as short is already on its way (reconcile resends lost ones)."""
    if task.stop_grace is not None and task.stop_grace <= grace:
        return []
    task.stop_grace = grace
    task.seen.sent_at = now
    return [Stop(node=task.node, attempt=job.attempt_of(task), grace_seconds=grace)]


def _finish_if_quiet(job: Job, now: float) -> list[Command]:
    scope = [t for t in job.tasks if not job.restarting or t.key in job.restarting]
    if job.state != JobState.STOPPING or any(t.live for t in scope):
        return []
    if job.outcome != restart.RESTART:
        job.move(JobState(job.outcome))
        job.outcome, job.finished = "", now
        return []
    job.outcome = ""
    if job.restarting and _training_finished(job):  # the chief finished meanwhile: nothing to restart
        job.restarting = ()
        job.move(JobState.RUNNING)
        return _check_training_done(job, now)
    if job.restarting:  # relaunched in place, on the same addresses, in waves, once the backoff has passed
        for task in scope:
            task.start_over(TaskState.PENDING)
        job.restarting = ()
        job.move(JobState.STARTING)
        return advance(job, now)
    job.move(JobState.PENDING)  # placed again by the cluster once the backoff has passed (job.not_before)
    return []


def waits(job: Job, reason: str) -> None:
    """A PENDING job stays in the queue for this reason (queue.py words it), after when it was preempted until
    it is placed again (placing clears the message). Shown, not written by itself (Job.show_waiting)."""
    message = reason
    if job.preempted_by:  # asked of every waiting job on each pass: the common case skips the wording
        preempted = preemption_note(job)
        since = describe_preemption(job.preempted_by, job.preempted_by_owner, job.preempted_at)
        message = f"{preempted}; {reason}" if job.message.startswith(since) else reason
    if job.message != message:
        job.show_waiting(message)

