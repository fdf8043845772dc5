"""Who may see and do what with a job: the rules the control service and the dashboard both apply.

security.POLICY says which roles may make a call at all; these rules say what a call may do with one job:

- an admin may do everything, with every job;
- a user may submit, and stop, read the logs of, follow, and open the dashboard page of their own jobs (the
  job's owner is the name in its submitter's certificate); of another's job they see what the queue needs to
  be understood (state, owner, size, class, where it runs, how often it restarted) and nothing the job's
  command, environment, TF_CONFIG or output could leak through;
- a viewer reads everything, logs included: it is the operators' read-only role (monitoring, support), not a
  person's; whoever should see only their own jobs gets a user certificate;
- with --insecure there is no caller (None), and anyone may do anything, as before.

And who may use a code archive (name it in a job, or learn that the coordinator holds it): an admin any; a
user one they uploaded; an archive stored before its uploaders were recorded, the owners of the kept jobs
that already name it (so that their restarts and resubmissions go on), until someone uploads it again.

Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tfcluster.api.v1 import control_pb2
from tfcluster.pki import ADMIN, USER, VIEWER, Identity


def may_act(who: Identity | None, job) -> bool:
    """Whether who may stop the job, read its logs, follow it, or open its dashboard page."""
    if who is None or who.role == ADMIN:
        return True
    if who.role == VIEWER:
        return False
    return who.role == USER and bool(job.owner) and job.owner == who.name


def may_read(who: Identity | None, job) -> bool:
    """Whether who sees all of the job: its messages, failures, addresses, logs."""
    return may_act(who, job) or (who is not None and who.role == VIEWER)


def refusal(job) -> str:
    """Why a user may not act on the job: it names the job's owner."""
    if not job.owner:
        return f"job {job.id} belongs to no one (it was submitted without a certificate): only an admin may act on it"
    return f"job {job.id} belongs to {job.owner}"


def unreadable(job_id: str) -> str:
    """The one answer for a job that is not there and for one the caller may not read (the TensorBoard's): it
    tells no one which jobs exist."""
    return f"no job {job_id[:100]!r} that you may read"


def redact(status: control_pb2.JobStatus) -> control_pb2.JobStatus:
    """Another person's job as a user sees it: its state, owner, size, class and placement stay; every text the
    job's program, command or environment could have put in is cleared (messages, the failure's message and log
    tail, the tasks' messages, addresses and pids, from which TF_CONFIG is rebuilt, and checkpoint paths).

    Evaluation steps and metrics stay: the coordinator's /metrics shows them to every reader already."""
    status.message = ""
    for task in status.tasks:
        task.message = task.address = task.tf_config = ""
        task.pid = 0
    if status.HasField("last_failure"):
        f = status.last_failure
        f.message = ""
        del f.log_tail[:]
        f.description = f"{f.task} on {f.node} failed" if f.task else ""
    for evaluation in status.evaluations:
        evaluation.checkpoint = ""
    if status.HasField("last_evaluation"):
        status.last_evaluation.checkpoint = ""
    return status


def job_status_for(who: Identity | None, encode):
    """encode(job) -> JobStatus, redacted for a job who may not read in full."""
    def status_of(job) -> control_pb2.JobStatus:
        status = encode(job)
        return status if may_read(who, job) else redact(status)
    return status_of


def may_use_code(who: Identity | None, owners: frozenset[str] | None,
                 users_of_jobs: Callable[[], Iterable[str]]) -> bool:
    """Whether who may use an archive whose uploaders are `owners` (None: stored before uploaders were
    recorded; then users_of_jobs() gives the owners of the kept jobs that name it)."""
    if who is None or who.role == ADMIN:
        return True
    if who.role != USER:
        return False
    return who.name in (users_of_jobs() if owners is None else owners)
