"""The coordinator's pure core (Cluster) driven by random sequences of what agents, users and time do, with the
invariants that must hold after every step, whatever the order:

- no ended job has a live task;
- a task's attempt number never goes down;
- the restarts a job is charged never exceed its budget (nor do its evaluator's);
- no GPU is held by two live tasks;
- a job is preempted only by one of a higher class, and only when its own class is preemptible; what it gave
  up is taken by no job but the one it was preempted for;
- every job and task state change went through Job.move / Task.move and is in the transition table
  (tfcluster/states.py), also inside Cluster.tick, which logs and swallows one job's error to keep the others.

The agents here play by the protocol: they run what they are told to launch, report it running, exit in any
of the ways a task exits (success, failure, a permanent exit code, a preemption save, a signal, failing to
start, a port taken), obey stops, fall silent, come back with or without their tasks. Derandomized, so CI
runs the same examples every time.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from coresim import check_held, info, make_spec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tfcluster.commands import Launch, Stop, SyncCheckpoints
from tfcluster.daemon.coordinator.core.cluster import Cluster, Unplaceable
from tfcluster.daemon.coordinator.core.model.job import Job, StateRecord, Task
from tfcluster.daemon.coordinator.store.records import Writer
from tfcluster.model import Attempt, PREEMPTION_EXIT_CODE, TaskExit, TaskProgress, TaskReport
from tfcluster.states import JOB_TRANSITIONS, TASK_TRANSITIONS, JobState, Phase

NODES = ("n1", "n2", "n3")
GPUS_PER_NODE = 2
PORTS = (20000, 20009)
PERMANENT_EXIT_CODE = 7
SHAPES = {  # the richest first: Hypothesis draws early entries more often
    "parameter servers": dict(strategy="parameter_server", gpus=1, chief=1, worker=2, ps={"count": 1, "gpus": 0},
                              evaluator={"count": 1, "gpus": 0}),
    "group with chief and evaluator": dict(strategy="multi_worker_mirrored", gpus=1, chief=1, worker=1,
                                           evaluator={"count": 1, "gpus": 0}),
    "group": dict(strategy="multi_worker_mirrored", gpus=1, worker=2),
    "one task": dict(strategy="mirrored", gpus=1, worker=1),
}
MAX_LIVE_JOBS = 3  # more would only wait PENDING for the 6 GPUs
EXITS = {  # how an attempt ends: (phase, exit fields)
    "succeeded": (Phase.EXITED, {"exit_code": 0}),
    "failed": (Phase.EXITED, {"exit_code": 1}),
    "permanent": (Phase.EXITED, {"exit_code": PERMANENT_EXIT_CODE}),
    "preempted": (Phase.EXITED, {"exit_code": PREEMPTION_EXIT_CODE}),
    "killed": (Phase.EXITED, {"signal": 9}),
    "terminated": (Phase.EXITED, {"signal": 15}),
    "never started": (Phase.FAILED_TO_START, {"message": "no such program"}),
    "port taken": (Phase.FAILED_TO_START, {"message": "port taken"}),  # busy_port: the attempt's port
}


@dataclass
class Process:
    """An attempt an agent runs."""
    pid: int
    port: int
    reported_running: bool = False
    stop_asked: bool = False


@dataclass
class AgentSim:
    session: str = ""  # "": not connected
    processes: dict[Attempt, Process] | None = None

    def __post_init__(self) -> None:
        self.processes = {}


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cluster = Cluster(lost_after_seconds=3.0, keep_finished_jobs=10_000, keep_finished_seconds=1e9)
        self.writer = Writer()  # collects after every step, as the coordinator writes after every event
        self.now = 1000.0
        self.agents = {name: AgentSim() for name in NODES}
        self.sessions = itertools.count(1)
        self.pids = itertools.count(100)
        self.output_bytes = 0
        self.syncs: list[SyncCheckpoints] = []
        self.attempts: dict[tuple[str, str], int] = {}
        self.known: dict[int, tuple[Job | Task, object]] = {}  # id -> (record, its state after the last step)
        self.moves: list[tuple[Job | Task, object, object]] = []
        self._record_moves()

    # ---- how the core is watched ------------------------------------------------------------------

    def _record_moves(self) -> None:
        """Every Job.move and Task.move is noted (before it checks, so a refused one is seen even where the
        core swallows the error)."""
        original = self.original_move = StateRecord.move

        def move(record, state):
            self.moves.append((record, record.state, state))
            original(record, state)
        StateRecord.move = move

    def teardown(self) -> None:
        StateRecord.move = self.original_move

    def records(self):
        for job in self.cluster.jobs.values():
            yield job
            yield from job.tasks

    # ---- what agents do ---------------------------------------------------------------------------

    def carry_out(self, commands) -> None:
        """Commands reach connected agents; what a disconnected one was sent is lost (reconcile heals it)."""
        for command in commands or ():
            agent = self.agents.get(getattr(command, "node", ""))
            if agent is None or not agent.session:
                continue
            if isinstance(command, Launch):
                agent.processes[command.attempt] = Process(next(self.pids), command.port)
            elif isinstance(command, Stop) and command.attempt in agent.processes:
                agent.processes[command.attempt].stop_asked = True
            elif isinstance(command, SyncCheckpoints):
                self.syncs.append(command)

    def processes(self, only=lambda p: True) -> list[tuple[str, Attempt, Process]]:
        return [(name, a, p) for name, agent in self.agents.items() if agent.session
                for a, p in sorted(agent.processes.items(), key=lambda kv: str(kv[0])) if only(p)]

    @initialize()
    def start_nodes(self) -> None:
        for name in NODES:
            self.connect(name, forget=False)

    @rule(name=st.sampled_from(NODES), forget=st.booleans())
    def connect(self, name: str, forget: bool) -> None:
        """The agent (re)connects: with the tasks it still runs, or (restarted) having lost track of them."""
        agent = self.agents[name]
        if forget:
            agent.processes.clear()
        agent.session = f"session-{next(self.sessions)}"
        reports = [TaskReport(a, Phase.RUNNING, pid=p.pid, listening=True)
                   for a, p in agent.processes.items() if p.reported_running]
        self.carry_out(self.cluster.register(info(name, GPUS_PER_NODE, PORTS), reports, agent.session, self.now))

    @rule(name=st.sampled_from(NODES))
    def heartbeat(self, name: str) -> None:
        agent = self.agents[name]
        if not agent.session:
            return
        self.output_bytes += 1
        progress = [TaskProgress(a, output_bytes=self.output_bytes) for a in agent.processes]
        commands = self.cluster.heartbeat(name, agent.session, self.now, progress)
        if commands is None:  # the coordinator lost it: it must register again
            agent.session = ""
        self.carry_out(commands)

    @rule(name=st.sampled_from(NODES))
    def go_silent(self, name: str) -> None:
        """Its network goes: nothing from it arrives any more (its processes run on)."""
        self.agents[name].session = ""

    @precondition(lambda self: self.processes(lambda p: not p.reported_running))
    @rule(data=st.data(), listening=st.booleans())
    def report_running(self, data, listening: bool) -> None:
        name, attempt, process = data.draw(st.sampled_from(self.processes(lambda p: not p.reported_running)))
        self.running(name, attempt, process, listening)

    @precondition(lambda self: self.processes(lambda p: not p.reported_running))
    @rule()
    def all_report_running(self) -> None:
        for name, attempt, process in self.processes(lambda p: not p.reported_running):
            self.running(name, attempt, process, listening=True)

    def running(self, name: str, attempt: Attempt, process: Process, listening: bool) -> None:
        process.reported_running = True
        report = TaskReport(attempt, Phase.RUNNING, pid=process.pid, listening=listening)
        self.carry_out(self.cluster.report(name, report, self.now))

    @precondition(lambda self: self.processes())
    @rule(data=st.data(), how=st.sampled_from(list(EXITS)))
    def report_exit(self, data, how: str) -> None:
        name, attempt, process = data.draw(st.sampled_from(self.processes()))
        if how in ("never started", "port taken") and process.reported_running:
            how = "failed"
        self.end(name, attempt, how)

    @precondition(lambda self: self.processes_of_running_jobs())
    @rule(data=st.data(), how=st.sampled_from(["failed", "preempted", "killed", "permanent"]))
    def fail_in_a_running_job(self, data, how: str) -> None:
        """A failure while the job runs (where restarts in place happen), not only while it starts or stops."""
        name, attempt, _ = data.draw(st.sampled_from(self.processes_of_running_jobs()))
        self.end(name, attempt, how)

    @precondition(lambda self: self.processes_of_running_jobs())
    @rule(data=st.data())
    def training_finishes(self, data) -> None:
        """Every training process of a running job but its parameter servers exits 0 (the evaluator then has the
        final checkpoint to evaluate)."""
        job_id = data.draw(st.sampled_from(sorted({a.job_id for _, a, _ in self.processes_of_running_jobs()})))
        for name, attempt, _ in self.processes_of_running_jobs():
            if attempt.job_id == job_id and attempt.type not in ("ps", "evaluator"):
                self.end(name, attempt, "succeeded")

    def processes_of_running_jobs(self) -> list[tuple[str, Attempt, Process]]:
        jobs = self.cluster.jobs
        return [(name, a, p) for name, a, p in self.processes(lambda p: p.reported_running)
                if a.job_id in jobs and jobs[a.job_id].state == JobState.RUNNING]

    @precondition(lambda self: self.processes(lambda p: p.stop_asked))
    @rule()
    def obey_stops(self) -> None:
        for name, attempt, _ in self.processes(lambda p: p.stop_asked):
            self.end(name, attempt, "terminated")

    def end(self, name: str, attempt: Attempt, how: str) -> None:
        process = self.agents[name].processes.pop(attempt)
        phase, fields = EXITS[how]
        exit = TaskExit(**fields, busy_port=process.port if how == "port taken" else 0)
        self.carry_out(self.cluster.report(name, TaskReport(attempt, phase, pid=process.pid, exit=exit), self.now))

    @precondition(lambda self: self.syncs)
    @rule(data=st.data(), ok=st.booleans())
    def answer_sync(self, data, ok: bool) -> None:
        sync = self.syncs.pop(data.draw(st.integers(0, len(self.syncs) - 1)))
        self.carry_out(self.cluster.sync_done(sync.node, sync.job_id, sync.sync_id, ok, "" if ok else "disk full",
                                              self.now))

    # ---- what users and time do -------------------------------------------------------------------

    @precondition(lambda self: len(self.cluster.jobs.live) < MAX_LIVE_JOBS)
    @rule(shape=st.sampled_from(list(SHAPES)), max_restarts=st.integers(0, 2),
          backoff=st.sampled_from([0.0, 2.0]), hang=st.sampled_from([0.0, 20.0]),
          rank=st.sampled_from([0, 10, 100]), preemptible=st.booleans())
    def submit(self, shape: str, max_restarts: int, backoff: float, hang: float, rank: int,
               preemptible: bool) -> None:
        """A job of a priority class (rank: its value, as a policy resolves it), which may preempt others."""
        restart = {"max_restarts": max_restarts, "backoff_seconds": backoff, "hang_seconds": hang,
                   "permanent_exit_codes": [PERMANENT_EXIT_CODE]}
        self.submit_ranked(SHAPES[shape], restart, rank, preemptible)

    @precondition(lambda self: any(j.state == JobState.RUNNING and j.preemptible
                                   for j in self.cluster.jobs.live.values()))
    @rule(shape=st.sampled_from(list(SHAPES)))
    def submit_urgent(self, shape: str) -> None:
        """A job of a class above every other while some job runs: it preempts what it needs."""
        self.submit_ranked(SHAPES[shape], {"permanent_exit_codes": [PERMANENT_EXIT_CODE]}, 1000, False)

    def submit_ranked(self, shape: dict, restart: dict, rank: int, preemptible: bool) -> None:
        try:
            job, commands = self.cluster.submit(make_spec(restart=restart, name="job", **shape), self.now)
        except Unplaceable:  # its nodes are all lost now
            return
        self.carry_out(commands)
        job.rank, job.preemptible = rank, preemptible
        self.cluster.nodes.resources_changed()  # tried again with its class
        self.carry_out(self.cluster.schedule(self.now))

    @precondition(lambda self: self.cluster.jobs)
    @rule(data=st.data(), graceful=st.booleans())
    def stop(self, data, graceful: bool) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.cluster.jobs)))
        self.carry_out(self.cluster.stop(job_id, self.now, graceful))

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.5, 4.0, 30.0]))
    def tick(self, seconds: float) -> None:
        """Time passes; connected agents heartbeat meanwhile, silent ones do not."""
        self.now += seconds
        for name in NODES:
            self.heartbeat(name)
        self.carry_out(self.cluster.tick(self.now))

    # ---- invariants -------------------------------------------------------------------------------

    @invariant()
    def every_state_change_followed_the_table(self) -> None:
        expected = {key: state for key, (_, state) in self.known.items()}
        for record, old, new in self.moves:
            table = JOB_TRANSITIONS if isinstance(record, Job) else TASK_TRANSITIONS
            assert new == old or new in table[old], f"{record!r}: {old} -> {new}"
            if id(record) in expected:  # a record created during the step starts where its first move says
                assert expected[id(record)] == old, f"{record!r} changed to {old} without a move"
            expected[id(record)] = new
        self.moves.clear()
        for record in self.records():
            if id(record) in expected:
                assert record.state == expected[id(record)], f"{record!r} changed state without a move"
        self.known = {id(r): (r, r.state) for r in self.records()}

    @invariant()
    def no_ended_job_has_a_live_task(self) -> None:
        for job in self.cluster.jobs.values():
            assert not (job.ended and any(t.live for t in job.tasks)), job

    @invariant()
    def attempt_numbers_only_grow(self) -> None:
        for job in self.cluster.jobs.values():
            for task in job.tasks:
                before = self.attempts.get((job.id, task.key), 0)
                assert task.attempt >= before, f"{job.id} {task.key}: attempt {before} -> {task.attempt}"
                self.attempts[(job.id, task.key)] = task.attempt

    @invariant()
    def restarts_stay_within_the_budget(self) -> None:
        for job in self.cluster.jobs.values():
            budget = job.spec.restart.max_restarts
            assert job.restarts <= budget and job.evaluator_restarts <= budget, job

    @invariant()
    def no_gpu_is_held_twice(self) -> None:
        held = [(t.node, g.index) for j in self.cluster.jobs.values() for t in j.tasks if t.live for g in t.gpus]
        assert len(held) == len(set(held)), sorted(held)

    @invariant()
    def what_nodes_hold_is_kept_as_jobs_change(self) -> None:
        check_held(self.cluster)

    @invariant()
    def a_write_leaves_no_record_of_a_kept_job_unsaved(self) -> None:
        """The writer looks only at the records that told it they changed: none may be missed (what it misses
        is lost to a restart). Ended jobs are written once more when they end, then no more."""
        self.writer.collect(self.cluster.changes)
        for job in self.cluster.jobs.values():
            if job.id in self.writer.jobs or not job.ended:
                assert not job.unsaved and not [t.key for t in job.tasks if t.unsaved], job


    @invariant()
    def only_lower_preemptible_classes_are_preempted(self) -> None:
        jobs = self.cluster.jobs
        for job in jobs.values():
            if job.preempted_by:
                assert job.preemptible and jobs[job.preempted_by].rank > job.rank, (job, jobs[job.preempted_by])

    @invariant()
    def what_is_kept_for_a_preemptor_goes_to_no_other_job(self) -> None:
        for job in self.cluster.jobs.live.values():
            if not job.held_for:
                continue
            kept = {(t.node, g.index) for t in job.tasks if t.node for g in t.gpus}
            for other in self.cluster.jobs.live.values():
                if other.id != job.held_for and other.held_for != job.held_for:
                    taken = {(t.node, g.index) for t in other.tasks if other.holds(t) for g in t.gpus}
                    assert not kept & taken, (job, other, kept & taken)


CoreMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=60, derandomize=True, database=None,
                                         deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestCore = CoreMachine.TestCase
