"""The coordinator's gRPC services on grpc.aio (the agents' in agentservice.py) and the server that serves them.
Thin: decode, call the Coordinator, encode, map errors.

Nothing a client or an agent sends can crash the coordinator: a bad field is INVALID_ARGUMENT, a node name
held by another live agent ALREADY_EXISTS. One stream per agent costs a coroutine, not a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from tfcluster import __version__, pki, security, wire
from tfcluster.api.v1 import agent_pb2_grpc, control_pb2, control_pb2_grpc
from tfcluster.auth import async_server_interceptors
from tfcluster.daemon.coordinator import access, accounting, status
from tfcluster.daemon.coordinator.agentservice import AgentServicer, JoinServicer
from tfcluster.daemon.coordinator.cluster import Unplaceable
from tfcluster.daemon.coordinator.codeservice import CodeServicer
from tfcluster.daemon.coordinator.codestore import DEFAULT_MAX_BYTES as DEFAULT_MAX_CODE_BYTES
from tfcluster.daemon.coordinator.codestore import DEFAULT_STORE_BYTES as DEFAULT_CODE_STORE_BYTES
from tfcluster.daemon.coordinator.taskusers import UidRange
from tfcluster.daemon.coordinator.dashboard import Dashboard
from tfcluster.daemon.coordinator.job import Job, Task
from tfcluster.daemon.coordinator.joinport import JoinLimiter, join_server
from tfcluster.daemon.coordinator.launch import command_for
from tfcluster.daemon.coordinator.metrics import CoordinatorMetrics
from tfcluster.daemon.coordinator.policy import ClassRefused, Policy, PolicyError, parse
from tfcluster.daemon.coordinator.server import Coordinator, build
from tfcluster.daemon.coordinator.store import Store
from tfcluster.daemon.coordinator.watch import TooManyWatchers
from tfcluster.daemon.logformat import fields
from tfcluster.daemon.web import WebListener, parse_listen
from tfcluster.model import NODE_NAME_RE
from tfcluster.spec import SpecError
from tfcluster.states import JobState

if TYPE_CHECKING:
    from tfcluster.daemon.coordinator.etcdgateway import EtcdTls

log = logging.getLogger("tfcluster.coordinator")

MAX_MESSAGE_BYTES = 64 << 20  # sent: one job's status with thousands of tasks still fits
# Taken in: the largest request any method takes (security.POLICY bounds each method below it).
MAX_RECEIVE_BYTES = security.MAX_REQUEST_BYTES
SERVICES = ("", "tfcluster.v1.AgentService", "tfcluster.v1.ControlService")


class ControlServicer(CodeServicer, control_pb2_grpc.ControlServiceServicer):
    def __init__(self, coordinator: Coordinator):
        self.c = coordinator

    async def SubmitJob(self, request, context):
        try:
            spec = wire.spec_from_proto(request.spec)
            await self._check_code(spec, context)
            who = security.caller()
            job, commands = self.c.cluster.submit(spec, self.c.clock(), request.client_request_id[:128],
                                                  owner=who.name if who else "", groups=who.groups if who else ())
        except (SpecError, ClassRefused) as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except Unplaceable as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"job cannot ever be placed: {e}")
        try:
            # Acknowledged only once stored. Shielded: another client of the same write going away must not
            # cancel this one's acknowledgement.
            await asyncio.shield(self.c.apply(commands))
        except OSError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        log.info("job %s submitted (%s, %d tasks): %s", job.id, job.strategy, len(job.tasks), job.state,
                 extra=fields(job=job.id))
        return control_pb2.SubmitJobResponse(job_id=job.id, state=job.state.value)

    async def PlanJob(self, request, context):
        try:
            spec = wire.spec_from_proto(request.spec)
        except SpecError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        plan = self.c.cluster.plan(spec, self.c.clock())
        scratch = Job(id=f"{spec.name}-plan", spec=plan.spec)
        commands = {(p.type, p.index): command_for(scratch, Task(p.type, p.index)) for p in plan.placement or []}
        return wire.plan_response(plan, commands)

    async def StopJob(self, request, context):
        if request.job_id not in self.c.cluster.jobs:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown job {request.job_id!r}")
        job = self.c.cluster.jobs[request.job_id]
        if not access.may_act(security.caller(), job):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, access.refusal(job))
        try:
            await asyncio.shield(self.c.apply(self.c.cluster.stop(job.id, self.c.clock(), request.graceful)))
        except OSError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        return control_pb2.StopJobResponse(state=job.state.value)

    async def GetStatus(self, request, context):
        c = self.c.cluster
        if request.job_id:
            job = c.jobs.get(request.job_id)
            if job is None:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown job {request.job_id!r}")
            names = dict.fromkeys(t.node for t in job.tasks if t.node in c.nodes)
            nodes, jobs = [c.nodes[name] for name in names], [job]
        else:
            nodes, jobs = status.overview_nodes(c), status.overview_jobs(c)
        running, memory, now = self.c.running_tasks(), self.c.memory_allocated(), self.c.clock()
        response = control_pb2.GetStatusResponse(summary=control_pb2.ClusterSummary(**status.summary(c)))
        response.nodes.extend(wire.node_status(n, running[n.name], now, memory.get(n.name, 0)) for n in nodes)
        job_messages, _ = status.fill(jobs, len(jobs), self._encoder(), lambda j: str(j.number), _size)
        response.jobs.extend(job_messages)
        response.summary.nodes_shown, response.summary.jobs_shown = len(response.nodes), len(response.jobs)
        response.summary.insecure = self.c.authority is None
        response.summary.dashboard_port = self.c.dashboard_port
        response.summary.leader = self.c.leader_address
        return response

    async def CreateDashboardLogin(self, request, context):
        if not self.c.dashboard_port:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the coordinator serves no dashboard: start it "
                                                                     "with --http-listen HOST:PORT")
        if request.job_id:
            await self._readable_job(request.job_id, context)
        token, expires = self.c.logins.create_link(security.caller(), self.c.clock())
        page = f"/jobs/{urllib.parse.quote(request.job_id)}" if request.job_id else "/"
        path = f"/login?{urllib.parse.urlencode({'token': token, 'next': page})}"
        return control_pb2.CreateDashboardLoginResponse(port=self.c.dashboard_port, path=path, expires=expires)

    async def GetUsage(self, request, context):
        window = request.window_seconds
        if not 0 <= window < float("inf"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"window_seconds: expected 0 or more, got {window}")
        c, now = self.c.cluster, self.c.clock()
        since = max(now - window if window else 0.0, now - c.usage.keep_seconds)
        users, groups = accounting.by_user_and_group(c.usage_totals(since, now))
        return wire.usage_response(users, groups, since, now, c.usage.keep_seconds)

    async def CreateJoinToken(self, request, context):
        if request.node and not NODE_NAME_RE.fullmatch(request.node):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"node: not a node name: {request.node[:80]!r}")
        try:
            token, expires, stored = self.c.create_token(request.ttl_seconds, request.node, request.reusable,
                                                         request.replace)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        await asyncio.shield(stored)
        return control_pb2.CreateJoinTokenResponse(token=token, expires=expires)

    async def RemoveNode(self, request, context):
        try:
            lost, stored = self.c.remove_node(request.name)
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown node {request.name!r}")
        await asyncio.shield(stored)
        return control_pb2.RemoveNodeResponse(tasks_lost=lost)

    async def ListNodes(self, request, context):
        running, memory, now = self.c.running_tasks(), self.c.memory_allocated(), self.c.clock()
        entries = status.nodes(self.c.cluster, request.page_token, request.state, request.name_prefix)
        nodes, token = status.fill(entries, status.page_size(request.page_size),
                                   lambda n: wire.node_status(n, running[n.name], now, memory.get(n.name, 0)),
                                   lambda n: n.name, _size)
        return control_pb2.ListNodesResponse(nodes=nodes, next_page_token=token)

    async def ListJobs(self, request, context):
        try:
            after = int(request.page_token or 0)
        except ValueError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"page_token: not a token: {request.page_token!r}")
        entries = status.jobs(self.c.cluster, after, request.states, request.name, request.node)
        jobs, token = status.fill(entries, status.page_size(request.page_size), self._encoder(),
                                  lambda j: str(j.number), _size)
        return control_pb2.ListJobsResponse(jobs=jobs, next_page_token=token)

    async def StreamLogs(self, request, context):
        if not request.task_type and not request.environment:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "task_type: required")
        if request.environment and not request.node:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "node: required with environment")
        await self._readable_job(request.job_id, context)
        try:
            if request.environment:
                request_id, waiter = self.c.open_environment_log(request.job_id, request.node[:256], request.follow,
                                                                 request.tail_lines)
            else:
                request_id, waiter = self.c.open_log(request.job_id, request.task_type, request.task_index,
                                                     request.attempt, request.follow, request.tail_lines)
        except KeyError as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, e.args[0] if e.args else str(e))
        except LookupError as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except ConnectionError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        finished = False
        try:
            while True:
                chunk = await waiter.chunks.get()
                if chunk.error:
                    finished = True
                    code = grpc.StatusCode.UNAVAILABLE if "disconnected" in chunk.error else \
                        grpc.StatusCode.RESOURCE_EXHAUSTED if "faster" in chunk.error else grpc.StatusCode.NOT_FOUND
                    await context.abort(code, chunk.error)
                if chunk.data:
                    yield control_pb2.LogChunk(data=chunk.data)
                if chunk.eof:
                    finished = True
                    return
        finally:
            self.c.close_log(request_id, cancel=not finished)

    async def WatchJob(self, request, context):
        jobs = self.c.cluster.jobs
        await self._readable_job(request.job_id, context)
        try:
            views = self.c.watchers.follow(lambda: jobs.get(request.job_id),
                                           lambda job: self._encoder([job])(job),
                                           lambda job: job.state.ended)
            async with contextlib.aclosing(views):  # a client gone mid-send ends the watch at once
                async for job in views:
                    yield control_pb2.WatchJobResponse(job=job)
        except TooManyWatchers as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))

    async def _readable_job(self, job_id: str, context) -> Job:
        """The job, once the caller may read all of it (its logs, its progress, its dashboard page)."""
        job = self.c.cluster.jobs.get(job_id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown job {job_id[:200]!r}")
        if not access.may_read(security.caller(), job):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, access.refusal(job))
        return job

    async def GetQueue(self, request, context):
        now = self.c.clock()
        order = self.c.cluster.queue_order(now)
        shown = order[:request.limit] if request.limit else order
        return control_pb2.GetQueueResponse(jobs=[wire.queued_job(job, position, now)
                                                  for position, job in enumerate(shown, 1)], total=len(order))

    async def GetPolicy(self, request, context):
        return wire.policy_response(self.c.cluster.policy)

    def _encoder(self, pending: list[Job] | None = None):
        """job -> its status as the caller may read it (access.py), with what it used up to now and, while it is
        PENDING, its place in the queue (worked out only when a job is pending)."""
        c, now = self.c.cluster, self.c.clock()
        if any(j.state == JobState.PENDING for j in (c.jobs.live.values() if pending is None else pending)):
            positions = c.queue_positions(now)
        else:
            positions = {}
        return access.job_status_for(security.caller(), lambda job: wire.job_status(
            job, accounting.job_usage(job, now), positions.get(job.id, 0)))


def _size(message) -> int:
    return message.ByteSize()


class CoordinatorServer:
    """A running coordinator on its event loop: the gRPC server, the writer and the ticker.

    With tls_dir (tfcluster ca init) it serves mutual TLS on `listen` and joins on `join_listen`; without it,
    plain text, which needs insecure=True said out loud."""

    def __init__(self, listen: str, state_dir: Path, lost_after_seconds: float = 3.0,
                 heartbeat_interval_seconds: float = 1.0, tls_dir: Path | None = None, insecure: bool = False,
                 join_listen: str = "", token: str | None = None, keep_finished_jobs: int = 1000,
                 keep_finished_seconds: float = 7 * 86400.0, node_cert_seconds: float = pki.NODE_HOURS * 3600.0,
                 http_listen: str = "", task_uids: UidRange = UidRange(), store_url: str = "",
                 keep_usage_seconds: float = accounting.DEFAULT_KEEP_USAGE_SECONDS,
                 policy_path: Path | None = None, etcd_tls: EtcdTls | None = None,
                 max_code_bytes: int = DEFAULT_MAX_CODE_BYTES, code_store_bytes: int = DEFAULT_CODE_STORE_BYTES,
                 store: Store | None = None):
        if (tls_dir is None) == (not insecure):
            raise ValueError("give --tls-dir (see `tfcluster ca init`) or --insecure")
        self.listen, self.join_listen, self.token = listen, join_listen or next_port(listen), token
        if tls_dir and pki.upgrade_coordinator_certificate(tls_dir):
            log.warning("%s: made again with the name clients now check (%s)", tls_dir / pki.SERVER_CERT,
                        pki.COORDINATOR_NAME)
        self.credentials = security.Credentials.from_dir(tls_dir, pki.SERVER_CERT, pki.SERVER_KEY) if tls_dir \
            else security.Credentials()
        authority = pki.Authority.load(tls_dir, with_key=True) if tls_dir else None
        # A policy with a mistake stops the start here (PolicyError), before the store is opened.
        policy = read_policy(policy_path, time.time()) if policy_path is not None else None
        self.coordinator = build(state_dir, lost_after_seconds, heartbeat_interval_seconds, keep_finished_jobs,
                                 keep_finished_seconds, authority, task_uids=task_uids, store_url=store_url,
                                 etcd_tls=etcd_tls, max_code_bytes=max_code_bytes, code_store_bytes=code_store_bytes,
                                 store=store)
        self.coordinator.cluster.usage.keep_seconds = keep_usage_seconds
        if tls_dir:  # no node may be named as the coordinator is reached
            self.coordinator.trust.reserved = frozenset(pki.server_names(pki.load_cert(tls_dir / pki.SERVER_CERT)))
        self.coordinator.node_cert_lifetime = datetime.timedelta(seconds=node_cert_seconds)
        self.policy_path = policy_path
        if policy is not None:
            self.coordinator.cluster.set_policy(policy)
        self.server: grpc.aio.Server | None = None
        self.join_server: grpc.aio.Server | None = None
        self.join_limiter = JoinLimiter()
        self.health = HealthServicer()
        self.address = self.join_address = ""
        self.metrics: CoordinatorMetrics | None = None
        self.web: WebListener | None = None
        if http_listen:
            parse_listen(http_listen)  # a bad address is an error before anything starts
            self.metrics = CoordinatorMetrics(self.coordinator.cluster)
            self.coordinator.cluster.observer = self.metrics
            web_credentials = self.credentials if tls_dir else security.Credentials(token=token)
            self.web = WebListener(http_listen, web_credentials, self.metrics.registry, self._refusal)
            Dashboard(self.coordinator, self.web)

    def reload_policy(self) -> bool:
        """Reads the policy file again (SIGHUP). One with a mistake is logged and the policy in force stays."""
        if self.policy_path is None:
            log.warning("SIGHUP: no policy to reload (the coordinator runs without --policy)")
            return False
        try:
            policy = read_policy(self.policy_path, self.coordinator.clock())
        except PolicyError as e:
            log.error("policy not reloaded, the one loaded at %s stays in force: %s",
                      datetime.datetime.fromtimestamp(self.coordinator.cluster.policy.loaded_at).isoformat(" ",
                                                                                                      "seconds"), e)
            return False
        cluster = self.coordinator.cluster
        cluster.set_policy(policy)
        log.info("policy reloaded from %s: %d classes, quotas for %d users and %d groups", policy.source,
                 len(policy.classes), len(policy.users), len(policy.groups))
        self.coordinator.apply(cluster.schedule(self.coordinator.clock()))
        return True

    def _refusal(self, who: pki.Identity) -> str:
        return self.coordinator.trust.refusal(who)

    def _interceptors(self) -> list:
        counting = [self.metrics.interceptor()] if self.metrics else []
        if self.credentials.insecure:
            return counting + async_server_interceptors(self.token) + [security.AsyncGuard(None)]
        # Trust is read at each call: a node removed a moment ago is refused.
        return counting + [security.AsyncGuard(security.Gate(is_revoked=self._refusal))]

    async def start(self) -> "CoordinatorServer":
        # No BDP probing: it grows a connection's receive window to megabytes, and a message refused for its
        # size from its length prefix would still come in up to that window (a 60 MB one cost 80 MB at a
        # time). gRPC's 64 KiB window is ample for a LAN; what the coordinator sends is not affected.
        options = [("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.min_ping_interval_without_data_ms", 5000),
                   ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES), ("grpc.http2.bdp_probe", 0),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        self.server = grpc.aio.server(interceptors=self._interceptors(), options=options)
        agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentServicer(self.coordinator), self.server)
        control_pb2_grpc.add_ControlServiceServicer_to_server(ControlServicer(self.coordinator), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if self.credentials.insecure:
            port = self.server.add_insecure_port(self.listen)
        else:
            port = self.server.add_secure_port(self.listen, self.credentials.server())
            self.join_server = self._join_server()
        if port == 0:
            raise OSError(f"cannot listen on {self.listen}")
        self.address = _reachable(self.listen, port)
        self.coordinator.leader_address = self.coordinator.leader_address or self.address
        await self.server.start()
        if self.join_server is not None:
            await self.join_server.start()
        if self.web is not None:
            try:
                await self.web.start()
            except OSError:
                await self._stop_servers(0)
                raise
            self.coordinator.dashboard_port = int(self.web.address.rsplit(":", 1)[1])
        self.coordinator.start()
        for service in SERVICES:
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        if self.credentials.insecure:
            log.warning("coordinator %s listening on %s WITHOUT TLS (--insecure): anyone who reaches it can read "
                        "the cluster and, without a token, make the agents run commands", __version__, self.address)
        else:
            log.info("coordinator %s listening on %s (mutual TLS), joins on %s (state: %s)", __version__,
                     self.address, self.join_address, self.coordinator.store.location)
        return self

    async def stop(self, grace: float = 1.0) -> None:
        await self.health.enter_graceful_shutdown()
        if self.web is not None:
            await self.web.stop()
        await self._stop_servers(grace)
        await self.coordinator.close()

    def _join_server(self) -> grpc.aio.Server:
        counting = [self.metrics.interceptor()] if self.metrics else []
        server, port = join_server(self.join_listen, self.credentials, JoinServicer(self.coordinator), self.health,
                                   counting, self.join_limiter)
        self.join_address = _reachable(self.join_listen, port)
        return server

    async def _stop_servers(self, grace: float) -> None:
        servers = [s for s in (self.server, self.join_server) if s is not None]
        await asyncio.gather(*(s.stop(grace) for s in servers))


def read_policy(path: Path, now: float) -> Policy:
    """The policy in the file; raises PolicyError naming the file, the key and the reason."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError(f"{path}: cannot read it: {e}") from None
    return parse(text, str(path), now)


def next_port(listen: str) -> str:
    """The join port's default: the port after the listen port, on the same host."""
    host, _, port = listen.rpartition(":")
    return f"{host}:{int(port) + 1}" if port not in ("", "0") else f"{host}:0"


def _reachable(listen: str, port: int) -> str:
    host = listen.rsplit(":", 1)[0]
    return f"{'127.0.0.1' if host in ('0.0.0.0', '[::]', '') else host}:{port}"
