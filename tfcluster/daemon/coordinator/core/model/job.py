"""A job and its tasks as the coordinator keeps them: plain state records, changed by core/lifecycle/transitions.py.

Assigning any field of a Job or Task marks it unsaved, so the store writes exactly what changed at the end
of each tick without anyone having to remember to say so. What is only observed while running (a task's
output progress, when a command was last sent) lives in the `seen` parts, which are never written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from operator import attrgetter
from typing import ClassVar

from tfcluster import strategies
from tfcluster.daemon.coordinator.core.model.accounting import Usage
from tfcluster.model import CHIEF, EVALUATOR, WORKER, Attempt, Evaluation, Gpu, TaskExit, is_training
from tfcluster.spec import JobSpec
from tfcluster.states import JobState, TaskState, check_transition

MAX_EVALUATIONS_KEPT = 1000
_PLACED = (JobState.STARTING, JobState.RUNNING, JobState.STOPPING)  # a job's tasks have their nodes
_STARTED = (JobState.STARTING, JobState.RUNNING)
_NODE = attrgetter("node")


class Record:
    """A record the store saves: any assignment marks it unsaved until the store calls saved(). The store's writer
    tracks every record it stores (jobs and their tasks, nodes, trust records, sweeps): a record puts itself on the
    writer's list of changed records when it becomes unsaved, so a write looks at what changed, not at every record
    (thousands of nodes in a large cluster, thousands of jobs in a long queue)."""
    unsaved = True
    _tracker: tuple[list, str, str] | None = None  # (the writer's list of changed records, kind, key)

    def __setattr__(self, name: str, value) -> None:
        object.__setattr__(self, name, value)
        if not self.unsaved:
            self.mark_unsaved()

    def mark_unsaved(self) -> None:
        object.__setattr__(self, "unsaved", True)
        if self._tracker is not None:
            changed, kind, key = self._tracker
            changed.append((kind, key, self))

    def saved(self) -> None:
        object.__setattr__(self, "unsaved", False)

    def track(self, changed: list, kind: str, key: str) -> None:
        """From now on, becoming unsaved appends (kind, key, self) to changed; so does being unsaved now."""
        object.__setattr__(self, "_tracker", (changed, kind, key))
        if self.unsaved:
            changed.append((kind, key, self))

    def tracked_into(self, changed: list) -> bool:
        """Whether becoming unsaved appends to this list (a writer's: track)."""
        return self._tracker is not None and self._tracker[0] is changed


class StateRecord(Record):
    """A saved record whose state changes only along its transition table (states.py)."""
    States: ClassVar[type[JobState] | type[TaskState]]

    def __post_init__(self) -> None:
        self.state = self.States(self.state)  # a value read back from the store becomes a member (or is refused)

    def move(self, state: JobState | TaskState) -> None:
        """The one way the coordinator changes the state: raises IllegalTransition on a change the table does not
        allow."""
        check_transition(str(self), self.state, state)
        self.state = state


@dataclass
class TaskSeen:
    """What the coordinator observes about a task while it runs; never saved."""
    output_bytes: int = 0
    checkpoint: str = ""      # newest checkpoint in its dir, from heartbeats
    sent_at: float = 0.0      # when its last launch or stop went to the agent (reconcile resends)
    missing_since: float = 0.0  # when a heartbeat of its node first lacked it while RUNNING
    live: Usage = Usage()     # the running attempt's CPU-seconds and peak RSS so far, when heartbeats carry them
    detail: str = ""          # what it waits for while it starts, as its agent says ("building environment (12 s)")
    node_silent: str = ""     # while its node is LOST within the task grace: when it counts as lost (node_events.py)


@dataclass(eq=False)
class Task(StateRecord):
    States: ClassVar = TaskState

    type: str
    index: int
    node: str = ""
    host: str = ""
    port: int = 0
    gpus: tuple[Gpu, ...] = ()
    checkpoint_dir: str = ""  # TFCLUSTER_CHECKPOINT_DIR on its node
    peer: str = ""            # its node's agent-to-agent address (host-local checkpoints go there)
    state: TaskState = TaskState.PENDING
    attempt: int = 0
    pid: int = 0
    exit: TaskExit | None = None
    stop_grace: float | None = None  # a stop was sent with this grace period; None: not asked to stop
    ready: bool = False  # running, and listening on its port when the next launch wave needs that
    running_since: float = 0.0  # when the current attempt was reported running; 0: it is not (accounting.py)
    seen: TaskSeen = field(default_factory=TaskSeen, repr=False)

    def __str__(self) -> str:
        return f"task {self.key}"

    def start_over(self, state: TaskState, unplace: bool = False) -> None:
        """The one place a task starts again: LAUNCHING (a new attempt is sent) or PENDING (it waits to be
        launched again: placed anew, or restarted). Nothing of the attempt before carries over but how it ended,
        which a waiting task still shows until its next attempt launches. unplace: it gives up its node, port and
        GPUs, and the cluster places it anew."""
        self.move(state)
        self.pid, self.stop_grace, self.ready = 0, None, False
        if state == TaskState.LAUNCHING:
            self.attempt += 1
            self.exit = None
        if unplace:
            self.unplace()

    def unplace(self) -> None:
        """It gives up its node, port and GPUs."""
        self.node, self.host, self.port, self.gpus, self.peer = "", "", 0, (), ""

    @property
    def key(self) -> str:
        return f"{self.type}:{self.index}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}" if self.host else ""

    @property
    def live(self) -> bool:
        return self.state.live

    @property
    def current(self) -> Attempt:
        return Attempt("", self.type, self.index, self.attempt)

    @property
    def message(self) -> str:
        if self.live and self.seen.node_silent:
            return self.seen.node_silent
        if self.state == TaskState.LAUNCHING and self.seen.detail:
            return self.seen.detail
        return self.exit.message if self.exit else ""


@dataclass(frozen=True)
class Failure:
    """A job's last failure: which task, on which node, how it ended, and when."""
    task: str  # "worker:1", or "job" for the hang watchdog
    node: str
    exit: TaskExit
    time: float
    lost: bool = False  # the task's node was lost (or its agent forgot it)

    def describe(self) -> str:
        return f"{self.task} on {self.node} {self.exit.describe()}"


@dataclass
class JobSeen:
    """What the coordinator observes about a job while it runs; never saved."""
    last_progress: float = 0.0  # hang watchdog: when output or the chief's checkpoint last moved
    finish_sent_at: float = 0.0
    sync_sent_at: float = 0.0
    restart_causes: list[str] = field(default_factory=list)  # restarts decided, until the cluster counts them
    failures_on: dict[str, int] = field(default_factory=dict)  # node -> the job's task failures there in a row

    def task_ended(self, node: str, failed: bool) -> None:
        """A task of the job ended on node: a failure there counts (scheduling/avoidance.py), a success clears it."""
        if failed:
            self.failures_on[node] = self.failures_on.get(node, 0) + 1
        else:
            self.failures_on.pop(node, None)


@dataclass(eq=False)
class Job(StateRecord):
    States: ClassVar = JobState

    id: str
    spec: JobSpec             # `auto` already resolved
    number: int = 0           # the job number (its id's suffix): orders jobs and pages
    request_id: str = ""      # the client's id for the submission: a retry returns this job
    uid: int = 0              # its tasks' user and group on every node (core/model/task_uids.py); 0: saved before 0.3
    owner: str = ""           # the name in the submitter's certificate; "": submitted before 0.5 or insecure
    groups: tuple[str, ...] = ()  # the owner's groups, from the same certificate, when the job was submitted
    priority: str = ""        # its priority class, resolved at submission; "": no policy
    rank: int = 0             # the class's value when submitted: a higher one goes first and may preempt
    preemptible: bool = True  # whether a job of a higher class may take its resources
    state: JobState = JobState.PENDING
    tasks: list[Task] = field(default_factory=list)
    restarts: int = 0
    preemptions: int = 0      # preemption saves (exit 42) and stops for a job of a higher class
    resizes: int = 0          # elastic: placements at a size other than the one before (core/model/elastic.py)
    top_attempt: int = 0      # elastic: the highest attempt of a worker it dropped (a new one starts above it)
    placed: float = 0.0       # when it was last placed: the most recently started jobs are preempted first
    # Its last preemption by a job of a higher class (preemption.py): which job, whose, and when.
    preempted_by: str = ""
    preempted_by_owner: str = ""
    preempted_at: float = 0.0
    held_for: str = ""        # preempted: the resources it gave up are kept for this job until it is placed
    evaluator_restarts: int = 0
    usage: Usage = Usage()    # what its ended attempts used (accounting.py); running ones are added when asked
    message: str = ""
    created: float = 0.0
    finished: float = 0.0
    outcome: str = ""         # while STOPPING: the state to take once every task is gone, or restart.RESTART
    restarting: tuple[str, ...] = ()  # while STOPPING for a partial restart: the tasks being restarted
    not_before: float = 0.0   # restart backoff: not placed again before this time
    last_failure: Failure | None = None
    final_evaluation_until: float = 0.0  # training is over; the evaluator has until then
    cluster_json: str = ""    # the training tasks' cluster in TF_CONFIG, set when placed
    # Host-local checkpoints: the node holding the chief's newest ones, and a copy of its dir to a restarted
    # group's nodes before they start.
    checkpoint_node: str = ""
    syncing: int = 0          # id of the copy under way, 0 when none
    sync_source: str = ""
    sync_until: float = 0.0
    syncs: int = 0
    evaluations: list[Evaluation] = field(default_factory=list)
    sweep: str = ""           # the sweep it is a trial of; "": none
    sweep_parameters: dict[str, str] = field(default_factory=dict)  # the trial's parameters
    seen: JobSeen = field(default_factory=JobSeen, repr=False)

    def __str__(self) -> str:
        return f"job {self.id}"

    @property
    def strategy(self) -> str:
        return self.spec.strategy

    @property
    def profile(self) -> strategies.Strategy:
        return strategies.profile(self.spec.strategy)

    @property
    def ended(self) -> bool:
        return self.state.ended

    @property
    def host_local(self) -> bool:
        """No shared checkpoint_dir: each node keeps its own, and agents copy them where needed."""
        return not self.spec.checkpoint_dir

    def task(self, task_type: str, index: int) -> Task | None:
        """The task of that type and index (an index built once: a job's tasks never change, only their fields)."""
        cached = self.__dict__.get("_by_key")
        if cached is None or cached[0] is not self.tasks:
            cached = (self.tasks, {(t.type, t.index): t for t in self.tasks})
            object.__setattr__(self, "_by_key", cached)
        return cached[1].get((task_type, index))

    def holds(self, task: Task) -> bool:
        """The task holds its node's GPUs and port: it runs there, or it was placed there and waits to be
        launched (a later wave, a restart in place, a restart's backoff), so no other task may have them."""
        placed = task.state == TaskState.PENDING and task.node and self.state in _PLACED
        return task.live or bool(placed)

    def lost_tasks(self) -> list[Task]:
        """Tasks of a started job that lost their node (or port) and wait for a new one; placed again once the
        job's restart backoff has passed (transitions.unplaced_tasks)."""
        if self.state not in _STARTED:
            return []
        return [t for t in self.tasks if t.state == TaskState.PENDING and not t.node]

    def waits_for_placement(self) -> bool:
        """Whether a scheduling pass has something to place for it: it is PENDING (queued, or in a restart's
        backoff), or it lost a task's node (Jobs.to_place keeps the live ones that do)."""
        return self.state == JobState.PENDING or bool(self.lost_tasks())

    def waits_in_queue(self) -> bool:
        """PENDING and nowhere yet: no task on a node, no checkpoint copy or final evaluation under way. Time alone
        changes nothing for such a job (when its restart's backoff has passed is the scheduling pass's to see), so
        the coordinator's tick passes it by (Jobs.ticking)."""
        return self.state == JobState.PENDING and not self.syncing and not self.final_evaluation_until and \
            not any(map(_NODE, self.tasks))

    def training_tasks(self) -> list[Task]:
        return [t for t in self.tasks if is_training(t.type)]

    def decisive_task(self) -> Task:
        """The task whose success means training succeeded: the chief, else worker 0."""
        return self.task(CHIEF, 0) or self.task(WORKER, 0)

    def evaluator(self) -> Task | None:
        return self.task(EVALUATOR, 0)

    def attempt_of(self, task: Task) -> Attempt:
        return Attempt(self.id, task.type, task.index, task.attempt)

    def show_waiting(self, message: str) -> None:
        """A waiting job's message (why it waits), set without marking the job unsaved. The reason is worked out
        anew at every scheduling pass, after a restart too, and its words follow what is free on the nodes (which
        task of the gang found no room, each node's free GPUs): written as a change, every task's exit rewrote
        every waiting job's record, hundreds of writes per exit in a queue of hundreds. A write for any other
        change of the job carries the message it shows then."""
        object.__setattr__(self, "message", message)

    def add_evaluation(self, result: Evaluation) -> None:
        """One entry per checkpoint: a checkpoint evaluated again replaces its entry and moves to the end."""
        kept = [e for e in self.evaluations if e.checkpoint != result.checkpoint]
        self.evaluations = (kept + [result])[-MAX_EVALUATIONS_KEPT:]


def preemption_note(job: Job) -> str:
    """What a preempted job's status says: "preempted by alice's job y-7-k3f9 at 14:03" ("" if never), with
    ", saved at step 120" once its tasks said so."""
    if not job.preempted_by:
        return ""
    note, step = describe_preemption(job.preempted_by, job.preempted_by_owner, job.preempted_at), saved_step(job)
    return note if step is None else f"{note}, saved at step {step}"


def saved_step(job: Job) -> int | None:
    """The step its training tasks' last preemption save was made at (their exits say it); None: unknown."""
    steps = [t.exit.saved_step for t in job.tasks if t.exit is not None and t.exit.saved_step is not None]
    return max(steps) if steps else None


def describe_preemption(by: str, owner: str, at: float) -> str:
    """"preempted by alice's job y-7-k3f9 at 14:03" (the coordinator's local time)."""
    whose = f"{owner}'s job" if owner else "job"
    return f"preempted by {whose} {by} at {time.strftime('%H:%M', time.localtime(at))}"
