"""The coordinator's control service on grpc.aio (the agents' in rpc/agent_service.py; the server that serves both
in grpc_server.py). Thin: decode, call the Coordinator, encode, map errors.

Nothing a client or an agent sends can crash the coordinator: a bad field is INVALID_ARGUMENT, a node name
held by another live agent ALREADY_EXISTS. One stream per agent costs a coroutine, not a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import urllib.parse

import grpc

from tfcluster import security, summaries, wire
from tfcluster.api.v1 import control_pb2, control_pb2_grpc
from tfcluster.daemon.coordinator.core import status
from tfcluster.daemon.coordinator.core.access import rules as access
from tfcluster.daemon.coordinator.core.cluster import Unplaceable
from tfcluster.daemon.coordinator.core.lifecycle.launch import command_for
from tfcluster.daemon.coordinator.core.model import accounting
from tfcluster.daemon.coordinator.core.model.job import Job, Task
from tfcluster.daemon.coordinator.core.scheduling.policy import ClassRefused
from tfcluster.daemon.coordinator.rpc import doctor
from tfcluster.daemon.coordinator.rpc.code_service import CodeServicer
from tfcluster.daemon.coordinator.rpc.coordinator import Coordinator
from tfcluster.daemon.coordinator.rpc.sweep_service import SweepServicer
from tfcluster.daemon.coordinator.rpc.watchers import TooManyWatchers
from tfcluster.daemon.logformat import fields
from tfcluster.model import NODE_NAME_RE, drain_reason_problem
from tfcluster.spec import SpecError
from tfcluster.states import JobState

log = logging.getLogger("tfcluster.coordinator")


class ControlServicer(CodeServicer, SweepServicer, control_pb2_grpc.ControlServiceServicer):
    def __init__(self, coordinator: Coordinator):
        self.c = coordinator

    async def _acknowledged(self, write: asyncio.Future, context) -> None:
        await _stored(write, context)

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
        await _stored(self.c.apply(commands), context)  # acknowledged only once stored
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
        await _stored(self.c.apply(self.c.cluster.stop(job.id, self.c.clock(), request.graceful)), context)
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
        response.nodes.extend(wire.node_status(n, running[n.name], now, memory.get(n.name, 0), c.nodes.drain_state(n.name))
                              for n in nodes)
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
        if request.tensorboard_jobs:
            page = await self._tensorboard_page(list(request.tensorboard_jobs), context)
        else:
            if request.job_id:
                await self._readable_job(request.job_id, context)
            page = f"/jobs/{urllib.parse.quote(request.job_id)}" if request.job_id else "/"
        token, expires = self.c.logins.create_link(security.caller(), self.c.clock())
        path = f"/login?{urllib.parse.urlencode({'token': token, 'next': page})}"
        return control_pb2.CreateDashboardLoginResponse(port=self.c.dashboard_port, path=path, expires=expires)

    async def _tensorboard_page(self, job_ids: list[str], context) -> str:
        """The address of the TensorBoard over the jobs (web/boards.py), once the caller may read each; a job
        that is not there and one that is not the caller's are refused alike, as the board itself does."""
        if len(job_ids) > summaries.BOARD_MAX_JOBS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"a TensorBoard shows at most {summaries.BOARD_MAX_JOBS} jobs, got {len(job_ids)}")
        for job_id in job_ids:
            job = self.c.cluster.jobs.get(job_id)
            if job is None or not access.may_read(security.caller(), job):
                await context.abort(grpc.StatusCode.NOT_FOUND, access.unreadable(job_id))
        if self.c.summaries is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this coordinator keeps no summaries")
        if importlib.util.find_spec("tensorboard") is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the coordinator's host lacks the tensorboard "
                                                                     "package (pip install 'tfcluster[tf]' there)")
        return summaries.board_path(job_ids)

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
        await _stored(stored, context)
        return control_pb2.CreateJoinTokenResponse(token=token, expires=expires)

    async def RemoveNode(self, request, context):
        try:
            lost, stored = self.c.remove_node(request.name)
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown node {request.name!r}")
        await _stored(stored, context)
        return control_pb2.RemoveNodeResponse(tasks_lost=lost)

    async def DrainNode(self, request, context):
        reason = request.reason.strip()
        problem = drain_reason_problem(reason)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"reason: {problem} (got {request.reason[:80]!r})")
        who = security.caller()
        try:
            requeued, running, stored = self.c.drain_node(request.name, reason, who.name if who else "",
                                                          request.requeue)
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown node {request.name!r}")
        await _stored(stored, context)
        return control_pb2.DrainNodeResponse(jobs_requeued=requeued, jobs_running=running)

    async def ResumeNode(self, request, context):
        try:
            was_drained, stored = self.c.resume_node(request.name)
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown node {request.name!r}")
        await _stored(stored, context)
        return control_pb2.ResumeNodeResponse(was_drained=was_drained)

    async def Diagnose(self, request, context):
        return wire.diagnose_response(await doctor.diagnose(self.c))

    async def ListNodes(self, request, context):
        running, memory, now = self.c.running_tasks(), self.c.memory_allocated(), self.c.clock()
        entries = status.nodes(self.c.cluster, request.page_token, request.state, request.name_prefix)
        nodes, token = status.fill(entries, status.page_size(request.page_size),
                                   lambda n: wire.node_status(n, running[n.name], now, memory.get(n.name, 0),
                                                              self.c.cluster.nodes.drain_state(n.name)),
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

    async def ReadSummaries(self, request, context):
        """The job's event files past what the client holds (store/summaries.py), read off the event loop."""
        await self._readable_job(request.job_id, context)
        if self.c.summaries is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "this coordinator keeps no summaries")
        have = dict(request.have)
        try:
            chunks = await asyncio.to_thread(lambda: list(self.c.summaries.read(request.job_id, have)))
        except OSError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the summaries cannot be read: {e}")
        for chunk in chunks:
            yield wire.summary_to_proto(chunk)

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
        """job -> its status as the caller may read it (core/access/rules.py), with what it used up to now and, while it is
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


async def _stored(write: asyncio.Future, context) -> None:
    """Waits for a change's write (shielded: another client of the same write going away must not cancel this
    one's acknowledgement); a store that cannot take
    it now (no quorum, etcd unreachable) is UNAVAILABLE, said as the store says it."""
    try:
        await asyncio.shield(write)
    except OSError as e:
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
