"""A client of the coordinator's ControlService, the Python API's transport (cluster.py). gRPC failures become
ClusterError (errors.py) of the kind the answer says, with one line a person can act on."""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from tfcluster import layout
from tfcluster.api.v1 import control_pb2, control_pb2_grpc, types_pb2
from tfcluster.auth import TokenError, client_token
from tfcluster.credentials import Credentials, PkiError
from tfcluster.errors import BY_STATUS, ClusterError, InvalidRequest, NotFound, Unavailable, Unreachable
from tfcluster.leaders import Coordinators, is_standby

if TYPE_CHECKING:  # the spec and its conversion are imported by the calls that send one: status starts without
    from tfcluster.spec import JobSpec
    from tfcluster.summaries import SummaryChunk
    from tfcluster.sweepspec import SweepSpec

RPC_TIMEOUT_SECONDS = 10.0
DIAGNOSE_SECONDS = 30.0  # `tfcluster doctor` waits on every agent's probes (at most about 15 s)
SUBMIT_TRIES = 5  # over about 4 s: a coordinator that restarts is back; one that is not running is reported
MAX_MESSAGE_BYTES = 64 << 20
CODE_CHUNK_BYTES = 1 << 20  # the coordinator takes up to 2 MiB a message (security.CHUNK)
POLL_SECONDS = 0.5  # following a job on a coordinator without WatchJob
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# A standby that names no other leader is in an election, or is itself taking over: both take about a leader
# lease's life (2 s) and the build of the coordinator, so a call waits that long for a leader before failing.
ELECTION_WAIT_SECONDS = 10.0
ELECTION_POLL_SECONDS = 0.25


def default_coordinator() -> str:
    return os.environ.get(layout.COORDINATOR_ENV) or layout.DEFAULT_COORDINATOR


def credentials_for(tls_dir: str | os.PathLike | None = None) -> Credentials:
    """A client's credentials: the directory given, else $TFCLUSTER_TLS_DIR (ca.crt, client.crt, client.key);
    with neither, plain text to a coordinator run with --insecure, with the token of $TFCLUSTER_TOKEN_FILE if set."""
    directory = tls_dir or os.environ.get(layout.TLS_DIR_ENV)
    try:
        return Credentials.from_dir(Path(directory)) if directory else Credentials(token=client_token())
    except PkiError as e:
        raise InvalidRequest(f"--tls-dir: {e}") from None
    except TokenError as e:
        raise InvalidRequest(f"{layout.TOKEN_FILE_ENV}: {e}") from None


def _store_refused(e: grpc.RpcError) -> bool:
    """The coordinator could not store the change (its store has no quorum, a full disk): it says so at once,
    and keeps the change to store once it can."""
    return e.code() == grpc.StatusCode.UNAVAILABLE and (e.details() or "").startswith("cannot store the change")


class Client:
    """A client of the coordinator that leads among those given (HOST:PORT[,HOST:PORT...], see leaders.py)."""

    def __init__(self, coordinator: str | None = None, credentials: Credentials | None = None):
        try:
            self.coordinators = Coordinators(coordinator or default_coordinator())
        except ValueError as e:
            raise InvalidRequest(f"--coordinator: {e}") from None
        self.credentials = credentials if credentials is not None else credentials_for()
        self.election_ends: float | None = None  # set by the first standby's answer: see _await_leader
        self._connect()

    def _connect(self) -> None:
        self.address = self.coordinators.current
        self.channel = self.credentials.channel(self.address, [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        self.stub = control_pb2_grpc.ControlServiceStub(self.channel)

    def _follow(self, error: grpc.RpcError, tried: int) -> bool:
        """After a call failed: moves to the leader a standby named, or to the next coordinator given, while
        some are left to try, or waits for an election to end (True); False: the error stands."""
        if error.code() not in RETRYABLE or _store_refused(error):
            return False
        if self.election_ends is None and is_standby(error):  # the wait counts from the first standby's answer,
            self.election_ends = time.monotonic() + ELECTION_WAIT_SECONDS  # however the tries went since
        if tried <= len(self.coordinators.addresses) and self.coordinators.failed(error):
            self._reconnect()
            return True
        return self._await_leader(error)

    def _await_leader(self, error: grpc.RpcError) -> bool:
        """Once a standby has answered, no leader yet is an election under way: the call is tried again, on
        each coordinator given in turn, until ELECTION_WAIT_SECONDS after that first answer."""
        if self.election_ends is None or time.monotonic() >= self.election_ends:
            return False
        time.sleep(ELECTION_POLL_SECONDS)
        self.coordinators.failed(error)
        self._reconnect()
        return True

    def _reconnect(self) -> None:
        self.channel.close()
        self._connect()

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, request, timeout: float = RPC_TIMEOUT_SECONDS):
        tried = 0
        while True:
            try:
                reply = getattr(self.stub, method)(request, timeout=timeout, wait_for_ready=False)
                self.election_ends = None  # a leader answered: a later failover gets a wait of its own
                return reply
            except grpc.RpcError as e:
                tried += 1
                if not self._follow(e, tried):
                    raise self._error(e) from None

    def _error(self, e: grpc.RpcError) -> ClusterError:
        error = self._describe(e)
        error.status = e.code()
        return error

    def _describe(self, e: grpc.RpcError) -> ClusterError:
        code, details = e.code(), e.details() or ""
        if _store_refused(e):  # the coordinator answered: it is its store that cannot take the change now
            return Unavailable(f"the coordinator at {self.address} {details}")
        if is_standby(e):
            return Unavailable(f"the coordinator at {self.address}: {details}")
        if code in RETRYABLE and "disconnected" not in details and "is not connected" not in details:
            first = details.splitlines()[0] if details else code.name
            hint = (f"if it serves TLS, give --tls-dir or {layout.TLS_DIR_ENV}" if self.credentials.insecure else
                    "are the credentials of this cluster's CA and valid, and does the coordinator's certificate "
                    "name the address you gave (`tfcluster ca init --san`)?")
            return Unreachable(f"cannot reach the coordinator at {self.address} ({first}); is `tfcluster "
                               f"coordinator` running? (set --coordinator or {layout.COORDINATOR_ENV}); {hint}")
        kind = BY_STATUS.get(code, ClusterError)
        if code == grpc.StatusCode.UNAUTHENTICATED:
            hint = (f"point {layout.TOKEN_FILE_ENV} at the cluster's token file" if self.credentials.insecure else
                    "are these credentials of this cluster's CA, and still valid?")
            return kind(f"the coordinator at {self.address} refused the request: {details}; {hint}")
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return kind(f"the coordinator at {self.address} refused the request: {details}")
        return kind(details or code.name)

    def submit(self, spec: JobSpec) -> str:
        """Submits once: a retry after a lost answer carries the same request id and gets the same job."""
        from tfcluster.wire import spec_to_proto

        request = control_pb2.SubmitJobRequest(spec=spec_to_proto(spec), client_request_id=uuid.uuid4().hex)
        return self._once("SubmitJob", request).job_id

    def start_sweep(self, spec: JobSpec, sweep: SweepSpec) -> str:
        """Starts a sweep once, as submit submits a job."""
        from tfcluster.wire import spec_to_proto, sweep_spec_to_proto

        request = control_pb2.StartSweepRequest(spec=spec_to_proto(spec), sweep=sweep_spec_to_proto(sweep),
                                                client_request_id=uuid.uuid4().hex)
        return self._once("StartSweep", request).sweep_id

    def sweep(self, sweep_id: str) -> control_pb2.SweepStatus:
        return self._call("GetSweep", control_pb2.GetSweepRequest(sweep_id=sweep_id)).sweep

    def sweeps(self) -> list[control_pb2.SweepStatus]:
        return list(self._call("ListSweeps", control_pb2.ListSweepsRequest()).sweeps)

    def stop_sweep(self, sweep_id: str) -> str:
        return self._call("StopSweep", control_pb2.StopSweepRequest(sweep_id=sweep_id)).state

    def _once(self, method: str, request):
        """A call that creates something, tried again while no coordinator answers: the request carries its
        client request id, so a retry after a lost answer gets what the first created."""
        tried = backed_off = 0
        while True:
            try:
                reply = getattr(self.stub, method)(request, timeout=RPC_TIMEOUT_SECONDS)
                self.election_ends = None
                return reply
            except grpc.RpcError as e:
                tried += 1
                if self._follow(e, tried):  # another coordinator, at once; or a leader being elected
                    continue
                if e.code() not in RETRYABLE or _store_refused(e) or backed_off >= SUBMIT_TRIES - 1:
                    raise self._error(e) from None
                time.sleep(0.25 * 2 ** backed_off)
                backed_off, tried = backed_off + 1, 0

    def code_status(self, sha256: str, size: int) -> control_pb2.CodeStatusResponse:
        """How much of the archive the coordinator holds, and its cap (sha256 "": the cap alone)."""
        return self._call("CodeStatus", control_pb2.CodeStatusRequest(sha256=sha256, size=size))

    def upload_code(self, path: Path, sha256: str, size: int, offset: int,
                    sent: Callable[[int], None] = lambda received: None) -> control_pb2.UploadCodeResponse:
        """Sends the archive's bytes from offset on, in CODE_CHUNK_BYTES chunks; sent(bytes held) after each."""
        def chunks() -> Iterator[types_pb2.CodeChunk]:
            with open(path, "rb") as f:
                f.seek(offset)
                position = offset
                while data := f.read(CODE_CHUNK_BYTES):
                    yield types_pb2.CodeChunk(sha256=sha256, size=size, offset=position, data=data)
                    position += len(data)
                    sent(position)
        try:
            return self.stub.UploadCode(chunks(), timeout=None, wait_for_ready=False)
        except grpc.RpcError as e:
            raise self._error(e) from None

    def create_join_token(self, ttl_seconds: float, node: str = "", reusable: bool = False,
                          replace: bool = False) -> tuple[str, float]:
        reply = self._call("CreateJoinToken", control_pb2.CreateJoinTokenRequest(
            ttl_seconds=ttl_seconds, node=node, reusable=reusable, replace=replace))
        return reply.token, reply.expires

    def dashboard_url(self, port: int, insecure: bool) -> str:
        """The dashboard's address on the coordinator's host, as this client reaches that host."""
        host = self.address.rsplit(":", 1)[0]
        return f"{'http' if insecure else 'https'}://{host}:{port}"

    def dashboard_login(self, job_id: str = "", tensorboard_jobs: tuple[str, ...] = ()) -> tuple[str, float]:
        """A one-time link that logs a browser in to the dashboard (at the job's page, or at a TensorBoard over
        tensorboard_jobs), and when it expires."""
        reply = self._call("CreateDashboardLogin", control_pb2.CreateDashboardLoginRequest(
            job_id=job_id, tensorboard_jobs=tensorboard_jobs))
        insecure = self.credentials.insecure
        return self.dashboard_url(reply.port, insecure) + reply.path, reply.expires

    def remove_node(self, name: str) -> int:
        """Removes the node from the cluster; returns how many of its tasks were running."""
        return self._call("RemoveNode", control_pb2.RemoveNodeRequest(name=name)).tasks_lost

    def drain_node(self, name: str, reason: str, requeue: bool = False) -> control_pb2.DrainNodeResponse:
        """Places nothing new on the node; with requeue its jobs go back to the queue."""
        return self._call("DrainNode", control_pb2.DrainNodeRequest(name=name, reason=reason, requeue=requeue))

    def resume_node(self, name: str) -> bool:
        """The node takes new tasks again; returns whether it was drained."""
        return self._call("ResumeNode", control_pb2.ResumeNodeRequest(name=name)).was_drained

    def diagnose(self) -> list[control_pb2.Check]:
        """`tfcluster doctor`: the coordinator checks the cluster end to end (it takes some seconds)."""
        return list(self._call("Diagnose", control_pb2.DiagnoseRequest(), timeout=DIAGNOSE_SECONDS).checks)

    def node(self, name: str) -> control_pb2.NodeStatus | None:
        """One node's status; None when the coordinator knows no node of that name."""
        reply = self._call("ListNodes", control_pb2.ListNodesRequest(name_prefix=name, page_size=1))
        return reply.nodes[0] if reply.nodes and reply.nodes[0].name == name else None

    def plan(self, spec: JobSpec) -> control_pb2.PlanJobResponse:
        from tfcluster.wire import spec_to_proto

        return self._call("PlanJob", control_pb2.PlanJobRequest(spec=spec_to_proto(spec)))

    def stop(self, job_id: str, graceful: bool = True) -> str:
        return self._call("StopJob", control_pb2.StopJobRequest(job_id=job_id, graceful=graceful)).state

    def status(self, job_id: str = "") -> control_pb2.GetStatusResponse:
        return self._call("GetStatus", control_pb2.GetStatusRequest(job_id=job_id))

    def usage(self, window_seconds: float = 0.0) -> control_pb2.GetUsageResponse:
        """Usage per user and per group over the last window_seconds (0: all the coordinator keeps)."""
        return self._call("GetUsage", control_pb2.GetUsageRequest(window_seconds=window_seconds))

    def queue(self, limit: int = 0) -> control_pb2.GetQueueResponse:
        return self._call("GetQueue", control_pb2.GetQueueRequest(limit=limit))

    def policy(self) -> control_pb2.GetPolicyResponse:
        return self._call("GetPolicy", control_pb2.GetPolicyRequest())

    def job(self, job_id: str) -> control_pb2.JobStatus:
        return self.status(job_id).jobs[0]

    def all_nodes(self, state: str = "", name_prefix: str = "") -> Iterator[control_pb2.NodeStatus]:
        """Every node, page after page."""
        token = ""
        while True:
            page = self._call("ListNodes", control_pb2.ListNodesRequest(page_token=token, state=state,
                                                                                 name_prefix=name_prefix))
            yield from page.nodes
            token = page.next_page_token
            if not token:
                return

    def all_jobs(self, states: list[str] = (), name: str = "", node: str = "") -> Iterator[control_pb2.JobStatus]:
        """Every job (oldest first), page after page."""
        token = ""
        while True:
            page = self._call("ListJobs", control_pb2.ListJobsRequest(page_token=token, states=states,
                                                                               name=name, node=node))
            yield from page.jobs
            token = page.next_page_token
            if not token:
                return

    def view(self, job_id: str | None = None, every: bool = False, node: str | None = None,
             states: list[str] = ()) -> tuple[list, list, control_pb2.ClusterSummary | None]:
        """(nodes, jobs, summary) as `tfcluster status` shows them: one job (and the nodes its tasks are on), the
        bounded overview, every node and job (every), or one node and its jobs; jobs only in some states."""
        if job_id:
            response = self.status(job_id)
            return list(response.nodes), list(response.jobs), None
        overview = self.status()
        if node:
            nodes = [n for n in self.all_nodes(name_prefix=node) if n.name == node]
            if not nodes:
                raise NotFound(f"unknown node {node!r}")
            return nodes, list(self.all_jobs(states=states, node=node)), overview.summary
        if every:
            return list(self.all_nodes()), list(self.all_jobs(states=states)), overview.summary
        if states:
            return list(overview.nodes), list(self.all_jobs(states=states)), overview.summary
        return list(overview.nodes), list(overview.jobs), overview.summary

    def watch(self, job_id: str, ended: Iterable[str]) -> Iterator[control_pb2.JobStatus]:
        """The job's status now and at each change, until its state is one of ended. From a coordinator that
        streams them (WatchJob); from one that predates it, by asking for the status every POLL_SECONDS."""
        for tried in itertools.count(1):
            call, seen = self.stub.WatchJob(control_pb2.WatchJobRequest(job_id=job_id), timeout=None), False
            try:
                for reply in call:
                    seen = True
                    yield reply.job
                return
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    break
                if seen or not self._follow(e, tried):
                    raise self._error(e) from None
            finally:
                call.cancel()
        yield from self._poll(job_id, frozenset(ended))

    def _poll(self, job_id: str, ended: frozenset[str]) -> Iterator[control_pb2.JobStatus]:
        last = None
        while True:
            job = self.job(job_id)
            if job != last:
                yield job
                last = job
            if job.state in ended:
                return
            time.sleep(POLL_SECONDS)

    def logs(self, job_id: str, task_type: str, task_index: int, follow: bool = False, tail_lines: int = 0,
             attempt: int = 0, environment_node: str = "") -> Iterator[bytes]:
        """A task's log, or with environment_node, the build log of the job's environment on that node."""
        request = control_pb2.StreamLogsRequest(job_id=job_id, task_type=task_type, task_index=task_index,
                                                follow=follow, tail_lines=tail_lines, attempt=attempt,
                                                environment=bool(environment_node), node=environment_node)
        for tried in itertools.count(1):
            call, seen = self.stub.StreamLogs(request, timeout=None if follow else 60.0), False
            try:
                for chunk in call:
                    seen = True
                    yield chunk.data
                return
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.CANCELLED:
                    return
                if seen or not self._follow(e, tried):  # a standby answered before any chunk: ask the leader
                    raise self._error(e) from None
            finally:
                call.cancel()

    def summaries(self, job_id: str, have: dict[str, int]) -> Iterator[SummaryChunk]:
        """The bytes of the job's TensorBoard event files that the coordinator holds past what `have` says the caller
        has (SummaryChunk.key -> size); one call sends a bounded amount, so a caller that wants all calls again."""
        from tfcluster import wire

        call = self.stub.ReadSummaries(control_pb2.ReadSummariesRequest(job_id=job_id, have=have), timeout=120.0)
        try:
            for msg in call:
                yield wire.summary_from_proto(msg)
        except grpc.RpcError as e:
            raise self._error(e) from None
        except ValueError as e:
            raise InvalidRequest(f"the coordinator sent summaries this client cannot take: {e}") from None
        finally:
            call.cancel()
