"""The coordinator's read-only web dashboard, on the listener that serves /metrics (`--http-listen`).

Pages (every view has its own address): the job list at `/`, a job at `/jobs/<id>` (with its live curves and
usage: training.py), the nodes at `/nodes`, the queue at `/queue`, the sweeps at `/sweeps`, a task's log at `/jobs/<id>/tasks/<type>:<index>/log`. Each is the same small page shell; its script fetches the
JSON API below and refreshes it every few seconds. Every API answer is one bounded page (filtered, with a token
for the next), built from the model on the event loop that owns it, in the representation `status --json`
uses (wire/status.py), so the dashboard stays fast with thousands of nodes and jobs.

A browser gets in with a one-time link (`tfcluster dashboard`, see logins.py) that sets a session cookie;
scrapers and scripts use a client certificate, as for /metrics.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
from pathlib import Path

from aiohttp import web

from tfcluster import __version__, views, wire
from tfcluster.api.v1 import control_pb2
from tfcluster.daemon.coordinator.core import status
from tfcluster.daemon.coordinator.core.access import rules as access
from tfcluster.daemon.coordinator.core.access.logins import COOKIE, SESSION_SECONDS
from tfcluster.daemon.coordinator.core.model.accounting import job_usage
from tfcluster.daemon.coordinator.core.model.job import Job, Task
from tfcluster.daemon.coordinator.rpc.coordinator import Coordinator
from tfcluster.daemon.coordinator.rpc.stream_limits import StreamLimits, TooManyStreams, caller_name
from tfcluster.daemon.coordinator.web.training import TrainingViews
from tfcluster.daemon.web import CALLER, WebListener
from tfcluster.pki import Identity
from tfcluster.states import JobState, NodeState

STATIC = Path(__file__).resolve().parent / "static"
PAGES = ("/", "/nodes", "/queue", "/jobs/{job_id}", "/jobs/{job_id}/tasks/{task}/log")
QUEUE_SHOWN = 500  # the queue page lists the first jobs of the queue (and says how many wait in all)
API_PAGE = 50
API_MAX_PAGE = 500
LOG_TAIL_LINES = 500  # the log view starts with this many lines, then follows
MAX_TAIL_LINES = 100_000
# Where a login link may lead: a page of this dashboard (a job's, or one of its tasks' logs), never another site.
NEXT_PAGE = re.compile(r"/(nodes|queue|sweeps|jobs/[A-Za-z0-9._~%-]+(/tasks/[A-Za-z0-9._~%:-]+/log)?"
                       r"|tensorboard/[a-z0-9_+-]+/)?")  # or a TensorBoard over jobs (boards.py)


def _finite(value):
    """JSON without NaN or Infinity (a diverged loss is NaN): browsers' JSON.parse refuses them; null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def json_response(data) -> web.Response:
    return web.json_response(_finite(data), dumps=functools.partial(json.dumps, allow_nan=False))


class Dashboard:
    def __init__(self, coordinator: Coordinator, listener: WebListener, streams: StreamLimits):
        self.c = coordinator
        self.streams = streams  # a log view stays open like StreamLogs, and counts with the caller's gRPC calls
        self.secure = listener.context is not None
        listener.authorizers.append(self._session)
        listener.open_paths.add("/login")
        router = listener.app.router
        for path in PAGES:
            router.add_get(path, self._page)
        router.add_get("/login", self._login)
        router.add_static("/static/", STATIC, append_version=False)
        router.add_get("/api/summary", self._summary)
        router.add_get("/api/jobs", self._jobs)
        router.add_get("/api/jobs/{job_id}", self._job)
        router.add_get("/api/nodes", self._nodes)
        router.add_get("/api/queue", self._queue)
        router.add_get("/api/jobs/{job_id}/tasks/{task}/log", self._log)
        self.training = TrainingViews(coordinator, router, self._page, self._readable_job, json_response)

    # ---- getting in --------------------------------------------------------------------------------

    async def _session(self, request: web.Request) -> Identity | None:
        session = request.cookies.get(COOKIE)
        return self.c.logins.holder(session, self.c.clock()) if session else None

    async def _login(self, request: web.Request) -> web.Response:
        redeemed = self.c.logins.redeem(request.query.get("token", ""), self.c.clock())
        if redeemed is None:
            raise web.HTTPForbidden(text="this login link is unknown, used or expired: run `tfcluster dashboard` "
                                         "for a new one\n")
        session_id, _ = redeemed
        target = request.query.get("next", "/")
        if not NEXT_PAGE.fullmatch(target):  # only a page of this dashboard: never a redirect to another site
            target = "/"
        response = web.HTTPFound(target)
        response.set_cookie(COOKIE, session_id, max_age=int(SESSION_SECONDS), httponly=True, secure=self.secure,
                            samesite="Lax", path="/")  # Lax: a link opened from chat or mail still logs in
        raise response

    async def _page(self, request: web.Request) -> web.FileResponse:
        if "job_id" in request.match_info:  # a page of no job, or of no task of it, is not there
            job = self._readable_job(request)
            if "task" in request.match_info:
                _find_task(job, request.match_info["task"])
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    # ---- the API -----------------------------------------------------------------------------------

    async def _summary(self, request: web.Request) -> web.Response:
        summary = views.summary_doc(control_pb2.ClusterSummary(**status.summary(self.c.cluster),
                                                              insecure=self.c.authority is None))
        who = request.get(CALLER)
        return json_response({**summary, "version": __version__, "time": self.c.clock(),
                              "viewer": str(who) if who else "", "job_states": [s.value for s in JobState],
                              "node_states": [s.value for s in NodeState]})

    async def _jobs(self, request: web.Request) -> web.Response:
        """Jobs newest first, `before` a job number, filtered by state and name prefix."""
        before = _int(request, "before", 0)
        states = {s for s in request.query.get("state", "").split(",") if s}
        prefix = request.query.get("name", "")
        jobs = (j for j in sorted(self.c.cluster.jobs.values(), key=lambda j: j.number, reverse=True)
                if (not before or j.number < before) and (not states or j.state in states)
                and j.spec.name.startswith(prefix))
        page, more = _page(jobs, _limit(request))
        who = request.get(CALLER)
        return json_response({"jobs": [job_row(j, access.may_read(who, j)) for j in page],
                              "next": str(page[-1].number) if more else ""})

    async def _job(self, request: web.Request) -> web.Response:
        job, now = self._readable_job(request), self.c.clock()
        position = self.c.cluster.queue_positions(now).get(job.id, 0) if job.state == JobState.PENDING else 0
        return json_response(views.job_doc(wire.job_status(job, job_usage(job, now), position)))

    async def _queue(self, request: web.Request) -> web.Response:
        """The pending jobs in queue order, as `tfcluster queue --json` prints them."""
        now = self.c.clock()
        order = self.c.cluster.queue_order(now)
        shown = [wire.queued_job(job, n, now) for n, job in enumerate(order[:QUEUE_SHOWN], 1)]
        return json_response(views.queue_doc(control_pb2.GetQueueResponse(jobs=shown, total=len(order)), now))

    async def _nodes(self, request: web.Request) -> web.Response:
        c = self.c.cluster
        running, memory, now = self.c.running_tasks(), self.c.memory_allocated(), self.c.clock()
        entries = status.nodes(c, request.query.get("after", ""), request.query.get("state", ""),
                               request.query.get("name", ""))
        page, more = _page(entries, _limit(request))
        nodes = []
        for node in page:
            doc = views.node_doc(wire.node_status(node, running[node.name], now, memory.get(node.name, 0),
                                                  c.nodes.drain_state(node.name)))
            doc["tasks"] = [{"job": job.id, "task": task.key, "state": task.state.value,
                             "gpus": [g.index for g in task.gpus]}
                            for job, task in c.nodes.live_on(node.name)]
            nodes.append(doc)
        return json_response({"nodes": nodes, "next": page[-1].name if more else ""})

    async def _log(self, request: web.Request) -> web.StreamResponse:
        """A task's log as plain text: its last lines, then (follow=1) what it writes until it ends."""
        job = self._readable_job(request)
        task = _find_task(job, request.match_info["task"])
        follow = request.query.get("follow") == "1"
        try:
            release = self.streams.enter(caller_name(request.get(CALLER), request.remote or "unknown"))
        except TooManyStreams as e:
            raise web.HTTPTooManyRequests(text=f"{e}\n") from None
        try:
            return await self._send_log(request, job, task, follow)
        finally:
            release()

    async def _send_log(self, request: web.Request, job: Job, task: Task, follow: bool) -> web.StreamResponse:
        try:
            request_id, waiter = self.c.open_log(job.id, task.type, task.index, _int(request, "attempt", 0),
                                                 follow, min(_int(request, "tail", LOG_TAIL_LINES), MAX_TAIL_LINES))
        except (KeyError, LookupError, ConnectionError) as e:
            raise web.HTTPServiceUnavailable(text=f"{e.args[0] if e.args else e}\n") from None
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8",
                                               "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})
        await response.prepare(request)
        finished = False
        try:
            while True:
                chunk = await waiter.chunks.get()
                if chunk.data:
                    await response.write(chunk.data)
                if chunk.error:
                    await response.write(f"\n[tfcluster: {chunk.error}]\n".encode())
                if chunk.eof or chunk.error:
                    finished = True
                    break
        except ConnectionResetError:
            pass  # the browser went away (when it goes while nothing is written, the handler is cancelled)
        finally:
            self.c.close_log(request_id, cancel=not finished)
        return response

    def _find_job(self, request: web.Request) -> Job:
        job = self.c.cluster.jobs.get(request.match_info["job_id"])
        if job is None:
            raise web.HTTPNotFound(text=f"unknown job {_short(request.match_info['job_id'])}\n")
        return job

    def _readable_job(self, request: web.Request) -> Job:
        """The job of the address, once the caller may see all of it (core/access/rules.py): a user's own, or any for an
        admin or a viewer; another person's job is refused with its owner's name."""
        job = self._find_job(request)
        if not access.may_read(request.get(CALLER), job):
            raise web.HTTPForbidden(text=access.refusal(job) + "\n")
        return job


def _find_task(job: Job, name: str):
    """The task a URL names as TYPE:INDEX; 400 for what cannot be a task's name, 404 for one the job lacks."""
    task_type, colon, index = name.partition(":")
    if not colon or not (index.isascii() and index.isdigit()) or len(index) > 9:
        raise web.HTTPBadRequest(text=f"task: expected TYPE:INDEX (worker:0), got {_short(name)}\n")
    task = job.task(task_type, int(index))
    if task is None:
        raise web.HTTPNotFound(text=f"job {job.id} has no task {_short(name)}\n")
    return task


def _short(text: str) -> str:
    """A value from a URL, quoted and cut short for an error message."""
    return repr(text[:80]) + (" (cut)" if len(text) > 80 else "")


def job_row(job: Job, readable: bool = True) -> dict:
    """What the job list shows of a job (no tasks, no evaluation history: a page of them stays small); of a job
    the viewer may not read in full (core/access/rules.py), no message and no failure, and no link to its page."""
    f = job.last_failure if readable else None
    latest = job.evaluations[-1] if job.evaluations else None
    return {"id": job.id, "name": job.spec.name, "state": job.state.value, "strategy": job.strategy,
            "restarts": job.restarts, "preemptions": job.preemptions, "message": job.message if readable else "",
            "created": job.created, "finished": job.finished or None, "tasks": len(job.tasks),
            "gpus": sum(job.spec.gpus_for(t.type) for t in job.tasks),
            "owner": job.owner, "readable": readable, "last_failure": f.describe() if f else "",
            "evaluation": {"step": latest.step, "metrics": latest.metrics} if latest else None}


def _int(request: web.Request, name: str, default: int) -> int:
    text = request.query.get(name, "")
    if not text:
        return default
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise web.HTTPBadRequest(text=f"{name}: expected a whole number, got {text[:40]!r}\n")
    return int(text)


def _page(entries, limit: int) -> tuple[list, bool]:
    """The first `limit` entries, and whether there are more."""
    page = list(itertools.islice(entries, limit + 1))
    return page[:limit], len(page) > limit


def _limit(request: web.Request) -> int:
    return max(1, min(_int(request, "limit", API_PAGE), API_MAX_PAGE))
