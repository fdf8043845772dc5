"""The job state machine: PENDING -> STARTING -> RUNNING -> SUCCEEDED | FAILED | STOPPED. Pure.

Every transition is a method that changes a Job and returns the actions (launch, stop) the coordinator
must send to agents. A job that has to end or restart first passes through STOPPING until every task
has exited, so no state says "done" while a process of the job is still alive.

Restarts (DESIGN.md, LESSONS.md 3): the coordinator owns the job's budget. A failed training task
restarts the whole training group on the same addresses where the nodes are still there, except under
parameter_server: a worker restarts alone, a ps or the chief restarts ps + chief (the workers stay).
Exit code 42 (a preemption checkpoint was saved) and a port conflict restart without using the budget;
a permanent exit code fails the job at once. An evaluator failing restarts the evaluator alone, on a
budget of its own, and never fails training. With `hang_seconds`, a job whose tasks write no output
and whose chief saves no checkpoint for that long is restarted as if a task had failed.
"""

from __future__ import annotations

import json
import signal as signals
from dataclasses import asdict, dataclass, field

from tfcluster.daemon.coordinator.scheduler import Gpu, TaskPlacement
from tfcluster.roles.tfconfig import build_tf_configs
from tfcluster.spec import JobSpec

PREEMPTION_EXIT_CODE = 42

# Job states
PENDING, STARTING, RUNNING, STOPPING = "PENDING", "STARTING", "RUNNING", "STOPPING"
SUCCEEDED, FAILED, STOPPED = "SUCCEEDED", "FAILED", "STOPPED"
JOB_TERMINAL = (SUCCEEDED, FAILED, STOPPED)
# What a STOPPING job becomes once its tasks are gone (RESTART: back to PENDING, attempt + 1).
RESTART = "RESTART"

# Task states
T_PENDING, T_LAUNCHING, T_RUNNING = "PENDING", "LAUNCHING", "RUNNING"
T_SUCCEEDED, T_FAILED, T_STOPPED, T_LOST = "SUCCEEDED", "FAILED", "STOPPED", "LOST"
TASK_LIVE = (T_LAUNCHING, T_RUNNING)
TASK_TERMINAL = (T_SUCCEEDED, T_FAILED, T_STOPPED, T_LOST)


@dataclass
class Task:
    type: str
    index: int
    node: str = ""
    host: str = ""
    port: int = 0
    gpus: list[Gpu] = field(default_factory=list)
    state: str = T_PENDING
    attempt: int = 0
    pid: int = 0
    exit_code: int | None = None
    signal: int | None = None
    message: str = ""
    log_tail: list[str] = field(default_factory=list)
    tf_config: str = ""
    stop_requested: bool = False
    busy_port: int = 0  # the launch failed because this port was taken on the node
    ready: bool = False  # running, and listening on its port where the next launch wave needs that
    final_checkpoint: str = ""  # newest checkpoint in its dir when it exited 0
    output_bytes: int = 0  # progress, for the hang watchdog
    checkpoint: str = ""

    @property
    def key(self) -> str:
        return f"{self.type}:{self.index}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}" if self.host else ""

    @property
    def live(self) -> bool:
        return self.state in TASK_LIVE


@dataclass
class Failure:
    """The last failure's cause, shown by status."""
    task: str
    node: str
    exit_code: int | None
    signal: int | None
    message: str
    log_tail: list[str]
    time: float
    busy_port: int = 0

    @property
    def preempted(self) -> bool:
        return self.exit_code == PREEMPTION_EXIT_CODE

    @property
    def costs_budget(self) -> bool:
        """Preemption saves and port conflicts restart the group for free: nothing in the job went wrong."""
        return not (self.preempted or self.busy_port)

    def describe(self) -> str:
        if self.signal:
            how = f"killed by {_signal_name(self.signal)}"
        elif self.exit_code is not None:
            how = f"exited with code {self.exit_code}"
        else:
            how = self.message or "failed"
        extra = f" ({self.message})" if self.message and how != self.message else ""
        return f"{self.task} on {self.node} {how}{extra}"


@dataclass
class Launch:
    node: str
    job_id: str
    task: Task
    command: list[str]
    env: dict[str, str]
    workdir: str
    stop_grace_seconds: float
    report_listening: bool = False


@dataclass
class Stop:
    node: str
    job_id: str
    task_type: str
    task_index: int
    attempt: int
    grace_seconds: float


@dataclass
class ShipCheckpoints:
    """Tells the agent of a task to ship each new checkpoint of that task to other nodes' agents."""
    node: str
    job_id: str
    task_type: str
    task_index: int
    attempt: int
    targets: list[str]  # peer addresses


@dataclass
class SyncCheckpoints:
    """Tells a node's agent to copy the job's whole host-local checkpoint dir to other nodes now."""
    node: str
    job_id: str
    sync_id: int
    targets: list[str]


@dataclass
class FinishTraining:
    """Tells the evaluator that training is over and which checkpoint is final."""
    node: str
    job_id: str
    task_type: str
    task_index: int
    attempt: int
    final_checkpoint: str


Action = Launch | Stop | FinishTraining | ShipCheckpoints | SyncCheckpoints
MAX_EVALUATIONS_KEPT = 1000
SYNC_DEADLINE_SECONDS = 600.0


@dataclass
class Job:
    id: str
    spec: JobSpec
    strategy: str
    state: str = PENDING
    tasks: list[Task] = field(default_factory=list)
    restarts: int = 0
    preemptions: int = 0
    message: str = ""
    created: float = 0.0
    finished: float = 0.0
    outcome: str = ""           # while STOPPING: the state to take once every task is gone
    not_before: float = 0.0     # restart backoff: not placed again before this time
    last_failure: Failure | None = None
    evaluations: list[dict] = field(default_factory=list)
    # Training is over and the evaluator evaluates the final checkpoint until this time.
    final_evaluation_until: float = 0.0
    evaluator_restarts: int = 0
    # While STOPPING for a partial restart (parameter_server): the tasks being restarted.
    restarting: list[str] = field(default_factory=list)
    # Hang watchdog: when any task's output or the chief's checkpoint last advanced.
    last_progress: float = 0.0
    # Filled by the coordinator when placing: node name -> that node's state dir, peer address.
    node_state_dirs: dict[str, str] = field(default_factory=dict)
    node_peers: dict[str, str] = field(default_factory=dict)
    # Host-local checkpoints (no checkpoint_dir in the spec): the node whose dir has the chief's newest
    # checkpoints, and a copy of that dir to the group's nodes before a restarted group starts.
    checkpoint_node: str = ""
    syncing: int = 0  # id of the copy under way, 0 when none
    sync_source: str = ""
    sync_until: float = 0.0
    syncs: int = 0

    @property
    def terminal(self) -> bool:
        return self.state in JOB_TERMINAL

    def task(self, task_type: str, index: int) -> Task | None:
        for t in self.tasks:
            if t.type == task_type and t.index == index:
                return t
        return None

    def training_tasks(self) -> list[Task]:
        return [t for t in self.tasks if t.type != "evaluator"]

    def decisive_task(self) -> Task:
        """The task whose success means training succeeded: the chief, else worker 0."""
        return self.task("chief", 0) or self.task("worker", 0)

    def previous_places(self) -> dict[tuple[str, int], tuple[str, int]]:
        return {(t.type, t.index): (t.node, t.port) for t in self.tasks if t.node}

    # ---- transitions ---------------------------------------------------------------------------

    def place(self, placement: list[TaskPlacement], node_state_dirs: dict[str, str], now: float,
              node_peers: dict[str, str] | None = None) -> list[Action]:
        """PENDING -> STARTING: tasks get nodes, GPUs, ports and TF_CONFIG; the first wave launches
        (after the chief's checkpoints were copied to the group's nodes, when they are host-local)."""
        assert self.state == PENDING, self.state
        by_key = {(t.type, t.index): t for t in self.tasks}
        tf_configs = build_tf_configs([(p.type, p.index, p.address) for p in placement])
        tasks = []
        for p in placement:
            old = by_key.get((p.type, p.index))
            tasks.append(Task(type=p.type, index=p.index, node=p.node, host=p.host, port=p.port, gpus=list(p.gpus),
                              attempt=(old.attempt if old else 0), tf_config=tf_configs[(p.type, p.index)]))
        self.tasks = tasks
        self.node_state_dirs = dict(node_state_dirs)
        self.node_peers = dict(node_peers or {})
        self.final_evaluation_until = 0.0
        self.state = STARTING
        self.message = ""
        return self._restore_checkpoints(now) + self._advance(now)

    def know_nodes(self, node_state_dirs: dict[str, str], node_peers: dict[str, str]) -> None:
        """Nodes that registered since the job was placed (a task placed again may go there)."""
        self.node_state_dirs.update(node_state_dirs)
        self.node_peers.update(node_peers)

    @property
    def host_local(self) -> bool:
        return not self.spec.checkpoint_dir

    def _restore_checkpoints(self, now: float) -> list[Action]:
        """Before a restarted group starts: copy the chief's last checkpoint dir (its backups included) to
        every node of the group that lacks it, so every task resumes from the same point."""
        source, self.checkpoint_node = self.checkpoint_node, self.decisive_task().node
        if not self.host_local or not source:
            return []
        if source not in self.node_state_dirs:
            self.message = f"the checkpoints were on {source}, which is gone; training starts over"
            return []
        nodes = sorted({t.node for t in self.tasks if t.type in ("chief", "worker", "evaluator")} - {source})
        targets = [self.node_peers[n] for n in nodes if self.node_peers.get(n)]
        if not targets:
            return []
        self.syncs += 1
        self.syncing, self.sync_source, self.sync_until = self.syncs, source, now + SYNC_DEADLINE_SECONDS
        self.message = f"copying checkpoints from {source} to {', '.join(nodes)}"
        return [SyncCheckpoints(node=source, job_id=self.id, sync_id=self.syncing, targets=targets)]

    def on_sync_done(self, sync_id: int, ok: bool, message: str, now: float) -> list[Action]:
        if sync_id != self.syncing or self.state != STARTING:
            return []
        self.syncing = 0
        self.message = "" if ok else f"copying the checkpoints failed ({message}); starting without them"
        return self._advance(now)

    def shipping(self) -> list[Action]:
        """With host-local checkpoints and the evaluator on another node, the chief's agent ships each new
        checkpoint to the evaluator's."""
        decisive, evaluator = self.decisive_task(), self.task("evaluator", 0)
        if not self.host_local or evaluator is None or not evaluator.node or not decisive.live:
            return []
        peer = self.node_peers.get(evaluator.node)
        if evaluator.node == decisive.node or not peer:
            return []
        return [ShipCheckpoints(node=decisive.node, job_id=self.id, task_type=decisive.type,
                                task_index=decisive.index, attempt=decisive.attempt, targets=[peer])]

    def _in_first_wave(self, task: Task) -> bool:
        # ParameterServerStrategy's chief fails at connect unless ps and workers already listen.
        return not (self.strategy == "parameter_server" and task.type == "chief")

    def _launch(self, tasks: list[Task]) -> list[Action]:
        actions: list[Action] = []
        for task in tasks:
            task.attempt += 1
            task.state = T_LAUNCHING
            task.pid, task.exit_code, task.signal, task.message = 0, None, None, ""
            task.log_tail, task.stop_requested, task.busy_port = [], False, 0
            task.ready, task.final_checkpoint = False, ""
            actions.append(self.launch_action(task))
        decisive, evaluator = self.decisive_task(), self.task("evaluator", 0)
        if decisive in tasks or evaluator in tasks:
            actions += self.shipping()
        return actions

    def launch_action(self, task: Task) -> Launch:
        """What the task's agent is told to run (the same for a resend of the same attempt)."""
        return Launch(node=task.node, job_id=self.id, task=task, command=self.command_for(task),
                      env=self.task_env(task), workdir=self.spec.workdir,
                      stop_grace_seconds=self.spec.stop_grace_seconds, report_listening=self.needs_listening(task))

    def command_for(self, task: Task) -> list[str]:
        role = self.spec.role(task.type)
        if self.strategy == "parameter_server" and task.type in ("worker", "ps") and not role.command:
            return [self._python(), "-m", "tfcluster.roles.server"]
        if task.type == "evaluator" and role.entrypoint and not role.command:
            return [self._python(), "-m", "tfcluster.roles.evaluator", role.entrypoint]
        return list(self.spec.command_for(task.type))

    def needs_listening(self, task: Task) -> bool:
        """ps and workers under parameter_server must listen before the chief starts."""
        return self.strategy == "parameter_server" and task.type in ("worker", "ps")

    def _python(self) -> str:
        """The interpreter of the job's own program (it has TensorFlow), for built-in role programs."""
        program = self.spec.command[0] if self.spec.command else ""
        return program if program.rsplit("/", 1)[-1].startswith("python") else "python3"

    def checkpoint_dir(self, node: str) -> str:
        if self.spec.checkpoint_dir:
            return self.spec.checkpoint_dir
        return f"{self.node_state_dirs.get(node, '/tmp/tfcluster')}/jobs/{self.id}/checkpoints"

    def model_dir(self, node: str) -> str:
        return self.spec.model_dir or self.checkpoint_dir(node)

    def task_env(self, task: Task) -> dict[str, str]:
        env = {"TF_USE_LEGACY_KERAS": "1"}
        if self.strategy == "parameter_server":
            env["GRPC_FAIL_FAST"] = "use_caller"
        env.update(self.spec.env_for(task.type))
        env.update({
            "TF_CONFIG": task.tf_config,
            "CUDA_VISIBLE_DEVICES": ",".join(g.uuid or str(g.index) for g in task.gpus) or "-1",
            "TFCLUSTER_JOB_ID": self.id,
            "TFCLUSTER_JOB_NAME": self.spec.name,
            "TFCLUSTER_STRATEGY": self.strategy,
            "TFCLUSTER_TASK_TYPE": task.type,
            "TFCLUSTER_TASK_INDEX": str(task.index),
            "TFCLUSTER_ATTEMPT": str(task.attempt),
            "TFCLUSTER_NUM_WORKERS": str(self.spec.count("worker")),
            "TFCLUSTER_PORT": str(task.port),
            "TFCLUSTER_CHECKPOINT_DIR": self.checkpoint_dir(task.node),
            "TFCLUSTER_MODEL_DIR": self.model_dir(task.node),
        })
        return env

    def on_running(self, task: Task, pid: int, listening: bool = False, now: float = 0.0) -> list[Action]:
        if task.state == T_RUNNING:
            task.pid = task.pid or pid
            task.ready = task.ready or listening
            return self._advance(now)
        if task.state != T_LAUNCHING:
            return []
        task.state, task.pid = T_RUNNING, pid
        task.ready = listening or not self.needs_listening(task)
        return self._advance(now)

    def _advance(self, now: float) -> list[Action]:
        """While STARTING: launch the next wave once every earlier task is up; RUNNING once all are."""
        if self.state != STARTING or self.syncing:
            return []
        if any(t.state == T_LAUNCHING or (t.state == T_RUNNING and not t.ready) for t in self.tasks):
            return []
        pending = [t for t in self.tasks if t.state == T_PENDING and t.node]
        wave = [t for t in pending if self._in_first_wave(t)] or pending
        if wave:
            return self._launch(wave)
        self.state = RUNNING
        self.last_progress = now
        return []

    def on_exit(self, task: Task, exit_code: int | None, signal: int | None, message: str,
                log_tail: list[str], now: float, busy_port: int = 0, final_checkpoint: str = "") -> list[Action]:
        """A task ended: exit code or signal; exit_code None and signal None means it never started."""
        if task.state in TASK_TERMINAL or task.state == T_PENDING:
            return []
        task.exit_code, task.signal, task.busy_port = exit_code, signal, busy_port
        task.final_checkpoint = final_checkpoint
        task.message, task.log_tail = message, log_tail[-20:]
        if task.stop_requested:
            task.state = T_SUCCEEDED if exit_code == 0 else T_STOPPED
        else:
            task.state = T_SUCCEEDED if exit_code == 0 else T_FAILED
        return self._after_task_end(task, now)

    def on_lost(self, task: Task, now: float, why: str) -> list[Action]:
        if not task.live:
            return []
        task.state, task.message = T_LOST, why
        return self._after_task_end(task, now)

    def _after_task_end(self, task: Task, now: float) -> list[Action]:
        if self.state == STOPPING:
            if self.restarting and task.key not in self.restarting and task.state in (T_FAILED, T_LOST):
                # A task outside a partial restart failed meanwhile: restart everything instead.
                return self._wind_down(RESTART, f"{self.message}; then {task.key} {task.state.lower()}", now)
            return self._finish_if_quiet(now)
        if self.final_evaluation_until:
            if task.type != "evaluator":  # training is over: a ps or worker server ending changes nothing
                return []
            how = "done" if task.state == T_SUCCEEDED else f"ended {task.state}"
            return self._wind_down(SUCCEEDED, f"final evaluation {how}", now)
        if task.state in (T_FAILED, T_LOST):
            failure = Failure(task=task.key, node=task.node, exit_code=task.exit_code, signal=task.signal,
                              message=task.message, log_tail=task.log_tail, time=now, busy_port=task.busy_port)
            if task.type == "evaluator":
                # An evaluator given up while STARTING must not hold back the chief's wave or RUNNING.
                return self._restart_evaluator(task, failure, now) + self._advance(now)
            return self._training_failed(failure, task, now)
        if task.state == T_SUCCEEDED and task.type != "evaluator":
            return self._check_training_done(now)
        return self._advance(now)

    def _training_failed(self, failure: Failure, task: Task | None, now: float) -> list[Action]:
        self.last_failure = failure
        if failure.exit_code in self.spec.restart.permanent_exit_codes:
            return self._wind_down(FAILED, f"{failure.describe()}: a permanent exit code, not restarted", now)
        if failure.costs_budget and self.restarts >= self.spec.restart.max_restarts:
            return self._wind_down(FAILED, f"{failure.describe()}; restart budget spent "
                                           f"({self.restarts} of {self.spec.restart.max_restarts})", now)
        if self.strategy == "parameter_server" and task is not None and task.state != T_LOST and \
                not failure.busy_port and self.state == RUNNING:
            if task.type == "worker":
                # The chief reschedules a dead worker's work and takes it back once it listens again.
                self._count_restart(failure)
                self.message = f"{failure.describe()}; restarting {task.key} alone"
                return self._launch([task])
            group = [t for t in self.tasks if t.type in ("chief", "ps")]
            if all(t.state != T_LOST for t in group):
                return self._wind_down(RESTART, f"{failure.describe()}; restarting ps and chief", now,
                                       only=[t.key for t in group])
        why = ("preemption checkpoint saved" if failure.preempted else
               "placing the group again" if failure.busy_port else "restarting the training group")
        return self._wind_down(RESTART, f"{failure.describe()}; {why}", now)

    def _count_restart(self, failure: Failure | None) -> None:
        if failure is None or failure.costs_budget:
            self.restarts += 1
        elif failure.preempted:
            self.preemptions += 1

    def _restart_evaluator(self, task: Task, failure: Failure, now: float) -> list[Action]:
        self.last_failure = failure
        if self.evaluator_restarts >= self.spec.restart.max_restarts:
            self.message = f"{failure.describe()}; evaluator not restarted (its {self.evaluator_restarts} " \
                           f"restarts are spent); training goes on"
            return []
        self.evaluator_restarts += 1
        if task.state == T_LOST:  # its node is gone: the coordinator places it anew (Cluster.schedule)
            task.state, task.node, task.host, task.port, task.gpus = T_PENDING, "", "", 0, []
            self.message = f"{failure.describe()}; evaluator to be placed again"
            return []
        self.message = f"{failure.describe()}; evaluator restarted"
        return self._launch([task])

    def unplaced_tasks(self) -> list[Task]:
        """Tasks of a placed job that lost their node and wait for a new one (the evaluator)."""
        if self.state not in (STARTING, RUNNING):
            return []
        return [t for t in self.tasks if t.state == T_PENDING and not t.node]

    def place_again(self, placement: list[TaskPlacement]) -> list[Action]:
        """Gives unplaced tasks their new place and launches them (the evaluator: not in the cluster,
        so no other task's TF_CONFIG changes)."""
        training = [(t.type, t.index, t.address) for t in self.tasks if t.type != "evaluator"]
        actions: list[Action] = []
        for p in placement:
            task = self.task(p.type, p.index)
            task.node, task.host, task.port, task.gpus = p.node, p.host, p.port, list(p.gpus)
            task.tf_config = build_tf_configs(training + [(p.type, p.index, p.address)])[(p.type, p.index)]
            actions += self._launch([task])
        return actions

    def on_progress(self, task: Task, output_bytes: int, checkpoint: str, now: float) -> None:
        """Output grew or the chief's checkpoint changed: the job is not hung."""
        if task.output_bytes != output_bytes or (checkpoint and task.checkpoint != checkpoint):
            task.output_bytes, task.checkpoint = output_bytes, checkpoint or task.checkpoint
            self.last_progress = max(self.last_progress, now)

    def _check_training_done(self, now: float) -> list[Action]:
        decisive = self.decisive_task()
        if decisive.state != T_SUCCEEDED:
            return []
        # Training tasks that run the user program must all finish; the built-in ps/worker servers never do.
        others = [t for t in self.training_tasks() if t is not decisive and not self._runs_forever(t)]
        if any(t.state != T_SUCCEEDED for t in others):
            return []
        evaluator = self.task("evaluator", 0)
        if evaluator is None or not evaluator.live:
            return self._wind_down(SUCCEEDED, "", now)
        # Completion is explicit (LESSONS.md 2): the evaluator evaluates the final checkpoint and exits,
        # within a deadline; only then are ps tasks stopped.
        final = decisive.final_checkpoint
        self.final_evaluation_until = now + self.spec.evaluator_deadline_seconds
        self.message = f"training finished; evaluating the final checkpoint {final}" if final else \
            "training finished without a checkpoint; waiting for the evaluator to exit"
        return [FinishTraining(node=evaluator.node, job_id=self.id, task_type=evaluator.type,
                               task_index=evaluator.index, attempt=evaluator.attempt, final_checkpoint=final)]

    def on_evaluation(self, result: dict) -> None:
        """An evaluator's result: {checkpoint, step, metrics, time}; one entry per checkpoint."""
        self.evaluations = [e for e in self.evaluations if e["checkpoint"] != result["checkpoint"]]
        self.evaluations.append(result)
        del self.evaluations[:-MAX_EVALUATIONS_KEPT]

    def on_tick(self, now: float) -> list[Action]:
        """Deadlines: the checkpoint copy's, the final evaluation's, and the hang watchdog's."""
        if self.syncing and now > self.sync_until:
            return self.on_sync_done(self.syncing, False, f"no answer within {SYNC_DEADLINE_SECONDS:g} s", now)
        if self.final_evaluation_until and self.state in (STARTING, RUNNING) and now > self.final_evaluation_until:
            return self._wind_down(SUCCEEDED, f"the evaluator did not finish the final evaluation within "
                                              f"{self.spec.evaluator_deadline_seconds:g} s; stopped it", now)
        hang = self.spec.restart.hang_seconds
        if hang and self.state == RUNNING and not self.final_evaluation_until and self.last_progress and \
                now - self.last_progress > hang:
            decisive = self.decisive_task()
            failure = Failure(task="job", node=decisive.node, exit_code=None, signal=None,
                              message=f"hung: no task wrote output and the chief saved no checkpoint for "
                                      f"{now - self.last_progress:.0f} s (hang_seconds = {hang:g})",
                              log_tail=[], time=now)
            self.last_progress = now
            return self._training_failed(failure, None, now)
        return []

    def _runs_forever(self, task: Task) -> bool:
        return self.strategy == "parameter_server" and task.type in ("worker", "ps")

    def stop(self, now: float, graceful: bool = True) -> list[Action]:
        if self.terminal:
            return []
        if self.state == PENDING:
            self.state, self.message, self.finished = STOPPED, "stopped by user", now
            return []
        return self._wind_down(STOPPED, "stopped by user", now, grace=None if graceful else 0.0)

    def _wind_down(self, outcome: str, message: str, now: float, grace: float | None = None,
                   only: list[str] | None = None) -> list[Action]:
        """Stop every live task (or only those named, for a partial restart), then become outcome once
        they are gone."""
        self.state, self.outcome, self.message = STOPPING, outcome, message
        self.restarting = list(only or [])
        actions: list[Action] = []
        for task in self.tasks:
            if only and task.key not in only:
                continue
            if task.state == T_PENDING and not only:
                task.state = T_STOPPED
            elif task.live and not (task.stop_requested and grace is None):
                actions.extend(self._stop_task(task, grace))
        return actions + self._finish_if_quiet(now)

    def _stop_task(self, task: Task, grace: float | None) -> list[Action]:
        task.stop_requested = True
        return [Stop(node=task.node, job_id=self.id, task_type=task.type, task_index=task.index, attempt=task.attempt,
                     grace_seconds=self.spec.stop_grace_seconds if grace is None else grace)]

    def _finish_if_quiet(self, now: float) -> list[Action]:
        scope = [t for t in self.tasks if not self.restarting or t.key in self.restarting]
        if self.state != STOPPING or any(t.live for t in scope):
            return []
        if self.outcome == RESTART:
            self._count_restart(self.last_failure)
            self.outcome = ""
            if self.restarting:  # relaunched in place, on the same addresses, in waves
                for task in scope:
                    task.state = T_PENDING
                self.restarting, self.state = [], STARTING
                return self._advance(now)
            self.state = PENDING
            self.not_before = now + self.spec.restart.backoff_seconds
            return []
        self.state, self.outcome, self.finished = self.outcome, "", now
        return []

    def on_unplaceable(self, reason: str, never: bool, now: float) -> None:
        if never:
            self.state, self.message, self.finished = FAILED, f"cannot ever be placed: {reason}", now
        else:
            self.message = f"waiting for resources: {reason}"

    # ---- persistence ---------------------------------------------------------------------------

    def to_json(self) -> str:
        data = asdict(self)
        return json.dumps(data)

    @staticmethod
    def from_json(text: str) -> "Job":
        from tfcluster.spec import RestartPolicy, RoleSpec  # local: keeps the import surface small

        data = json.loads(text)
        spec_data = data.pop("spec")
        spec_data["roles"] = {k: RoleSpec(**{**v, "command": tuple(v["command"]), "nodes": tuple(v["nodes"])})
                              for k, v in spec_data["roles"].items()}
        r = spec_data["restart"]
        spec_data["restart"] = RestartPolicy(**{**r, "permanent_exit_codes": tuple(r["permanent_exit_codes"])})
        spec_data["command"] = tuple(spec_data["command"])
        tasks = [Task(**{**t, "gpus": [Gpu(**g) for g in t["gpus"]]}) for t in data.pop("tasks")]
        failure = data.pop("last_failure")
        return Job(spec=JobSpec(**spec_data), tasks=tasks,
                   last_failure=Failure(**failure) if failure else None, **data)


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"
