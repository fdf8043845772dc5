"""The Python API: `from tfcluster import Cluster`. The `tfcluster` command is built on it: every command that
talks to a cluster makes a Cluster and calls it, so a script and the CLI connect, submit, wait, follow logs and
stop the same way, and meet the same errors.

A Cluster connects as the CLI does: the coordinator given, else $TFCLUSTER_COORDINATOR, else localhost:7070;
the credentials in the folder given, else in $TFCLUSTER_TLS_DIR, else plain text (with $TFCLUSTER_TOKEN_FILE's
token). Answers are typed values (statuses.py); failures are ClusterError and its kinds (errors.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from tfcluster import statuses
from tfcluster.client import RETRYABLE, Client, credentials_for, default_coordinator
from tfcluster.errors import ClusterError, InvalidRequest, NotFound, Unavailable, Unreachable
from tfcluster.model import CHIEF, ROLE_TYPES, WORKER
from tfcluster.states import ENDED_JOB_STATES, SweepState, TaskState

if TYPE_CHECKING:  # a spec is read by the calls that send one: `tfcluster status` starts without it
    from tfcluster.spec import JobSpec
    from tfcluster.summaries import SummaryChunk
    from tfcluster.sweepspec import SweepSpec

SpecLike = Union["JobSpec", dict, str, os.PathLike]
SweepLike = Union[tuple["JobSpec", "SweepSpec"], dict, str, os.PathLike]
RETRY_AFTER_SECONDS = 2.0  # a watch whose connection broke is taken up again after this
STOP_POLL_SECONDS = 0.3
MAX_INT32 = 2**31 - 1


def transient(error: ClusterError) -> bool:
    """Whether the same call may succeed later: no coordinator reached, or none able to act now."""
    return isinstance(error, (Unreachable, Unavailable)) or error.status in RETRYABLE


def job_spec(spec: SpecLike) -> "JobSpec":
    """A checked JobSpec from a JobSpec, a dict of the spec file's keys, a TOML text, or a spec file's path.
    Relative paths are taken from the spec file's folder, else from the current directory."""
    from tfcluster.spec import JobSpec, SpecError, validate
    from tfcluster.specfile import load_spec_file, parse_spec, parse_spec_text, resolve_paths

    try:
        if isinstance(spec, JobSpec):
            return resolve_paths(validate(spec, "JobSpec"), Path.cwd())
        if isinstance(spec, dict):
            return resolve_paths(parse_spec(spec, source="dict"), Path.cwd())
        if isinstance(spec, str) and not Path(spec).exists() and ("\n" in spec or "=" in spec):
            return parse_spec_text(spec, "<toml>", Path.cwd())
        if isinstance(spec, (str, os.PathLike)):
            return load_spec_file(spec)
    except SpecError as e:
        raise InvalidRequest(str(e)) from None
    raise InvalidRequest(f"spec: expected a JobSpec, a dict, TOML text or a spec file's path, got "
                         f"{type(spec).__name__}")


def sweep_spec(spec: SweepLike) -> tuple["JobSpec", "SweepSpec"]:
    """A checked job spec and sweep from a (JobSpec, SweepSpec) pair, a dict of the spec file's keys with its
    "sweep" table, a TOML text, or a sweep spec file's path (paths resolved as job_spec resolves them)."""
    from tfcluster.spec import SpecError
    from tfcluster.specfile import load_sweep_file, parse_sweep_spec, parse_sweep_text, resolve_paths
    from tfcluster.sweepspec import validate_sweep

    try:
        if isinstance(spec, tuple) and len(spec) == 2:
            return job_spec(spec[0]), validate_sweep(spec[1], "SweepSpec")
        if isinstance(spec, dict):
            job, sweep = parse_sweep_spec(spec, source="dict")
            return resolve_paths(job, Path.cwd()), sweep
        if isinstance(spec, str) and not Path(spec).exists() and ("\n" in spec or "=" in spec):
            return parse_sweep_text(spec, "<toml>", Path.cwd())
        if isinstance(spec, (str, os.PathLike)):
            return load_sweep_file(spec)
    except SpecError as e:
        raise InvalidRequest(str(e)) from None
    raise InvalidRequest(f"sweep: expected (JobSpec, SweepSpec), a dict, TOML text or a sweep spec file's path, "
                         f"got {type(spec).__name__}")


def parse_task(task: str) -> tuple[str, int]:
    """`worker:1` -> ("worker", 1)."""
    task_type, sep, index = task.partition(":")
    if not sep or not index.isdigit() or int(index) > MAX_INT32 or task_type not in ROLE_TYPES:
        raise InvalidRequest(f"expected TYPE:INDEX with TYPE one of chief, worker, ps, evaluator (e.g. worker:1), "
                             f"or env, got {task!r}")
    return task_type, int(index)


class Cluster:
    """A connection to a cluster's coordinator (any of several, HOST:PORT[,HOST:PORT...], following the leader).

    >>> with Cluster() as c:
    ...     job = c.start("job.toml")
    ...     job.wait().state
    'SUCCEEDED'
    """

    def __init__(self, coordinator: Optional[str] = None, tls_dir: Optional[Union[str, os.PathLike]] = None):
        self.client = Client(coordinator or default_coordinator(),
                             credentials_for(Path(tls_dir).expanduser() if tls_dir else None))

    @property
    def address(self) -> str:
        """The coordinator this connection talks to now."""
        return self.client.address

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- jobs -----------------------------------------------------------------------------------

    def start(self, spec: SpecLike) -> "Job":
        """Submits a job. A workdir not on shared storage is packed and sent to the coordinator first (what
        the coordinator already holds is not sent again); that step says what it did on stderr."""
        spec = job_spec(spec)
        if not spec.shared_workdir:
            from tfcluster.codeship import ship_code

            spec = ship_code(self.client, spec)
        return Job(self, self.client.submit(spec))

    def sweep(self, spec: SweepLike) -> "Sweep":
        """Starts a sweep: the coordinator submits its trials, as jobs of the caller's, max_concurrent at a time.
        The workdir is sent once, as start sends it, and every trial runs that code."""
        job, sweep = sweep_spec(spec)
        if not job.shared_workdir:
            from tfcluster.codeship import ship_code

            job = ship_code(self.client, job)
        return Sweep(self, self.client.start_sweep(job, sweep))

    def sweeps(self) -> list[statuses.SweepStatus]:
        """Every sweep the caller may see (oldest first), without their trials."""
        return [statuses.read(statuses.SweepStatus, s) for s in self.client.sweeps()]

    def plan(self, spec: SpecLike) -> statuses.Plan:
        """Where the job's tasks would go now, with every TF_CONFIG; starts nothing."""
        return statuses.read(statuses.Plan, self.client.plan(job_spec(spec)))

    def job(self, job_id: str) -> "Job":
        """A job by its id (nothing is asked until a call on it)."""
        return Job(self, job_id)

    def jobs(self, states: tuple[str, ...] = (), name: str = "", node: str = "") -> list[statuses.JobStatus]:
        """Every job the coordinator keeps (oldest first), or those in some states, of a name, on a node."""
        return [statuses.read(statuses.JobStatus, j) for j in self.client.all_jobs(list(states), name, node)]

    def status(self, job_id: Optional[str] = None, every: bool = False, node: Optional[str] = None,
               states: tuple[str, ...] = ()) -> statuses.ClusterStatus:
        """What `tfcluster status` shows: the bounded overview, one job and its nodes, every node and job
        (every), or one node and its jobs; jobs only in some states."""
        nodes, jobs, summary = self.client.view(job_id, every, node, list(states))
        return statuses.ClusterStatus(nodes=[statuses.read(statuses.NodeStatus, n) for n in nodes],
                                      jobs=[statuses.read(statuses.JobStatus, j) for j in jobs],
                                      summary=statuses.read(statuses.ClusterSummary, summary) if summary else None)

    def queue(self, limit: int = 0) -> statuses.Queue:
        """The pending jobs in the order they will be placed, and why each waits."""
        return statuses.read(statuses.Queue, self.client.queue(limit))

    def usage(self, window_seconds: float = 0.0) -> statuses.Usage:
        """Usage per user and per group over the last window_seconds (0: all the coordinator keeps)."""
        return statuses.read(statuses.Usage, self.client.usage(window_seconds))

    def policy(self) -> statuses.Policy:
        return statuses.read(statuses.Policy, self.client.policy())

    # ---- nodes and the cluster (most are for admins) ----------------------------------------------

    def nodes(self, state: str = "") -> list[statuses.NodeStatus]:
        return [statuses.read(statuses.NodeStatus, n) for n in self.client.all_nodes(state)]

    def node(self, name: str) -> statuses.NodeStatus:
        found = self.client.node(name)
        if found is None:
            raise NotFound(f"unknown node {name!r}")
        return statuses.read(statuses.NodeStatus, found)

    def remove_node(self, name: str) -> int:
        """Removes the node; returns how many of its tasks were running (their jobs restart elsewhere)."""
        return self.client.remove_node(name)

    def drain_node(self, name: str, reason: str, requeue: bool = False) -> tuple[int, int]:
        """Places nothing new on the node; returns (jobs still running there, jobs sent back to the queue)."""
        reply = self.client.drain_node(name, reason, requeue)
        return reply.jobs_running, reply.jobs_requeued

    def resume_node(self, name: str) -> bool:
        """The node takes new tasks again; returns whether it was drained."""
        return self.client.resume_node(name)

    def create_join_token(self, ttl_seconds: float, node: str = "", reusable: bool = False,
                          replace: bool = False) -> tuple[str, float]:
        """A join token for a new node, and when it expires."""
        return self.client.create_join_token(ttl_seconds, node, reusable, replace)

    def doctor(self) -> list[statuses.Check]:
        """The coordinator's checks of the cluster end to end (takes some seconds)."""
        return [statuses.read(statuses.Check, c) for c in self.client.diagnose()]

    def dashboard_link(self, job_id: str = "") -> tuple[str, float]:
        """A one-time link that logs a browser in to the dashboard (at the job's page), and when it expires."""
        return self.client.dashboard_login(job_id)

    def tensorboard_link(self, job_ids: list[str]) -> tuple[str, float]:
        """A one-time link that logs a browser in to the coordinator's TensorBoard over the jobs' summaries (runs
        named JOB/TASK), and when it expires. ClusterError when the caller may not read one of them."""
        return self.client.dashboard_login(tensorboard_jobs=tuple(job_ids))

    def dashboard_address(self, summary: statuses.ClusterSummary) -> str:
        """The dashboard's address as this connection reaches the coordinator's host ("": none served)."""
        port = summary.dashboard_port
        return self.client.dashboard_url(port, summary.insecure) if port else ""


class Job:
    """One job of a cluster's, by its id."""

    def __init__(self, cluster: Cluster, job_id: str):
        self.cluster, self.id = cluster, job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def status(self) -> statuses.JobStatus:
        return statuses.read(statuses.JobStatus, self.cluster.client.job(self.id))

    def watch(self, on_retry: Optional[Callable[[ClusterError], None]] = None) -> Iterator[statuses.JobStatus]:
        """The job's status now and at each change, until it has ended. A broken connection (a coordinator
        restarting, a failover) is taken up again after RETRY_AFTER_SECONDS, telling on_retry first."""
        while True:
            try:
                for job in self.cluster.client.watch(self.id, ENDED_JOB_STATES):
                    yield statuses.read(statuses.JobStatus, job)
                    if job.state in ENDED_JOB_STATES:
                        return
            except ClusterError as e:
                if not transient(e):
                    raise
                if on_retry is not None:
                    on_retry(e)
                time.sleep(RETRY_AFTER_SECONDS)

    def wait(self, timeout: Optional[float] = None,
             on_change: Optional[Callable[[statuses.JobStatus], None]] = None,
             on_retry: Optional[Callable[[ClusterError], None]] = None) -> statuses.JobStatus:
        """The job's status once it has ended (SUCCEEDED, FAILED or STOPPED); on_change sees each state it
        passes through. TimeoutError when it has not ended within timeout seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        for job in self.watch(on_retry) if deadline is None else self._poll(deadline):
            if on_change is not None and (last is None or job.state != last.state):
                on_change(job)
            last = job
        return last

    def _poll(self, deadline: float) -> Iterator[statuses.JobStatus]:
        while True:
            job = self.status()
            yield job
            if job.state in ENDED_JOB_STATES:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.id} is still {job.state}")
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    def logs(self, task: str = "", follow: bool = False, tail: int = 0, attempt: int = 0,
             node: str = "") -> Iterator[bytes]:
        """A task's log as the task wrote it ("chief:0", "worker:1"; "": the chief's, else worker 0's), chunk
        by chunk; follow: until the task ends. task "env" with node: how that node built the job's environment."""
        if task == "env":
            if not node:
                raise InvalidRequest("logs JOB env: --node NAME says which node's environment build to show")
            task_type, index = "", 0
        else:
            if node:
                raise InvalidRequest("--node goes with `env`: a task's log comes from the node it runs on")
            task_type, index = parse_task(task) if task else self._primary_of(self.status())
        return self.cluster.client.logs(self.id, task_type, index, follow=follow, tail_lines=tail,
                                        attempt=attempt, environment_node=node)

    def log_text(self, task: str = "", tail: int = 0, attempt: int = 0) -> str:
        """A task's log so far, as text."""
        return b"".join(self.logs(task, tail=tail, attempt=attempt)).decode(errors="replace")

    @staticmethod
    def _primary_of(job: statuses.JobStatus) -> tuple[str, int]:
        task = _primary(job)
        return (task.type, task.index) if task else (WORKER, 0)

    def follow_primary(self, on_retry: Optional[Callable[[str], None]] = None) -> Iterator[bytes]:
        """The chief's (or worker 0's) log, attempt after attempt, until the job ends (`tfcluster start
        --follow`); on_retry hears why a stream or the watch broke before it is taken up again."""
        attempt_seen = 0
        for job in self.watch(on_retry=lambda e: on_retry and on_retry(f"warning: {e}; retrying")):
            primary = _primary(job)
            if primary is None or primary.attempt <= attempt_seen or primary.state == TaskState.PENDING:
                continue  # the job's next change may start it (a job that ended ends the watch)
            attempt_seen = primary.attempt
            try:
                yield from self.cluster.client.logs(self.id, primary.type, primary.index, follow=True,
                                                    attempt=primary.attempt)
            except ClusterError as e:
                if on_retry is not None:
                    on_retry(f"warning: log stream ended: {e}")
                time.sleep(1)

    def stop(self, graceful: bool = True, wait: bool = True) -> str:
        """SIGTERM to every task (SIGKILL after the job's grace period; graceful=False: at once); returns the
        job's state, once every task has exited when wait."""
        state = self.cluster.client.stop(self.id, graceful)
        while wait and state not in ENDED_JOB_STATES:
            time.sleep(STOP_POLL_SECONDS)
            state = self.cluster.client.job(self.id).state
        return state

    def scalars(self) -> list[dict[str, Any]]:
        """The evaluator's results as rows a DataFrame takes (`pandas.DataFrame(job.scalars())`): one row per
        metric of each evaluation, with job, step, checkpoint, time, metric and value."""
        return [{"job": self.id, "step": e.step, "checkpoint": e.checkpoint, "time": e.time, "metric": name,
                 "value": value} for e in self.status().evaluations for name, value in sorted(e.metrics.items())]

    def dashboard_link(self) -> tuple[str, float]:
        return self.cluster.dashboard_link(self.id)

    def summaries(self, have: Optional[dict[str, int]] = None) -> Iterator["SummaryChunk"]:
        """The bytes of the TensorBoard event files the job's tasks wrote (each task's TFCLUSTER_SUMMARY_DIR), as
        the coordinator holds them, past what `have` says the caller has (SummaryChunk.key -> size). One call
        sends a bounded amount; summary_mirror.py's SummaryMirror keeps a logdir up to date with it."""
        return self.cluster.client.summaries(self.id, dict(have or {}))


class Sweep:
    """One sweep of a cluster's, by its id."""

    def __init__(self, cluster: Cluster, sweep_id: str):
        self.cluster, self.id = cluster, sweep_id

    def __repr__(self) -> str:
        return f"Sweep({self.id!r})"

    def status(self) -> statuses.SweepStatus:
        """The sweep and each of its trials (`.ranked()`: best first by the metric)."""
        return statuses.read(statuses.SweepStatus, self.cluster.client.sweep(self.id))

    def stop(self, wait: bool = True) -> str:
        """No more trials are started and the running ones are stopped; returns the sweep's state, once every
        trial has ended when wait."""
        state = self.cluster.client.stop_sweep(self.id)
        if wait:
            self.wait()
        return state

    def wait(self, timeout: Optional[float] = None, poll_seconds: float = 1.0) -> statuses.SweepStatus:
        """The sweep's status once it has ended and none of its trials runs. TimeoutError when that is not so
        within timeout seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status()
            # a trial whose job was submitted and has since been forgotten has no state: it ended long ago
            if status.state != SweepState.RUNNING and all(not t.state or t.state in ENDED_JOB_STATES
                                                          for t in status.trials):
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"sweep {self.id} is still {status.state}")
            time.sleep(poll_seconds if deadline is None else min(poll_seconds, max(0.0, deadline - time.monotonic())))


def _primary(job: statuses.JobStatus) -> Optional[statuses.TaskStatus]:
    """The task whose log tells the job's story: the chief, else worker 0."""
    return next((t for t in job.tasks if t.type == CHIEF), None) or \
        next((t for t in job.tasks if t.type == WORKER and t.index == 0), None)
