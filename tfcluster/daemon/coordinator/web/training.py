"""The dashboard's views of training as it happens: a job's scalar curves (from its summaries), its tasks' CPU
memory and GPU use over time (from heartbeats), and the sweeps.

  GET /api/jobs/<id>/scalars  every scalar tag of every task's event files: {"series": [{"run", "tag", "points":
                              [[step, value, wall time], ...], "written", "stride"}], "problems", "skipped"}
  GET /api/jobs/<id>/usage    {"interval": s, "tasks": [{"task", "node", "attempt", "points": [[time, CPU cores,
                              RSS bytes, GPU utilisation 0..1 or null], ...]}]}
  GET /api/sweeps             the sweeps the caller may see, newest first, each with its trials' jobs
  /sweeps                     the page that lists them

A job's curves and usage follow the job's access rules (core/access/rules.py), as its page does: a user reads
their own jobs', an admin or a viewer any; a sweep is listed to whom it may be shown, as ListSweeps does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from tfcluster.daemon.coordinator.core.access import rules as access
from tfcluster.daemon.coordinator.core.model.job import Job
from tfcluster.daemon.coordinator.core.model.sweep import Sweep
from tfcluster.daemon.coordinator.core.model.usage_history import SAMPLE_SECONDS
from tfcluster.daemon.coordinator.web.curves import Curves
from tfcluster.daemon.coordinator.rpc.coordinator import Coordinator
from tfcluster.daemon.web import CALLER

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MAX_SWEEPS = 200  # the sweeps page lists the newest sweeps


class TrainingViews:
    """Added to the dashboard (dashboard.py), whose page, job look-up and JSON answers it uses."""

    def __init__(self, coordinator: Coordinator, router: web.UrlDispatcher, page: Handler,
                 readable_job: Callable[[web.Request], Job], json_response: Callable[[object], web.Response]):
        self.c, self.readable_job, self.json = coordinator, readable_job, json_response
        self.curves = Curves(self.c.summaries)
        self.reading: dict[str, asyncio.Future] = {}  # job -> the reading under way: a second poll waits for it
        router.add_get("/sweeps", page)
        router.add_get("/api/jobs/{job_id}/scalars", self._scalars)
        router.add_get("/api/jobs/{job_id}/usage", self._usage)
        router.add_get("/api/sweeps", self._sweeps)

    async def _scalars(self, request: web.Request) -> web.Response:
        job = self.readable_job(request)
        reading = self.reading.get(job.id)
        if reading is None:  # parsing event files blocks: on a thread, one reading per job at a time
            reading = asyncio.get_running_loop().run_in_executor(None, self.curves.read, job.id)
            self.reading[job.id] = reading
            reading.add_done_callback(lambda _: self.reading.pop(job.id, None))
        return self.json(await asyncio.shield(reading))

    async def _usage(self, request: web.Request) -> web.Response:
        job = self.readable_job(request)
        tasks = [{"task": name, "node": h.node, "attempt": h.attempt, "points": [list(s) for s in h.samples]}
                 for name, h in sorted(self.c.usage.of_job(job.id).items())]
        return self.json({"job": job.id, "interval": SAMPLE_SECONDS, "tasks": tasks})

    async def _sweeps(self, request: web.Request) -> web.Response:
        who = request.get(CALLER)
        shown = [s for s in sorted(self.c.cluster.sweeps.by_id.values(), key=lambda s: s.number, reverse=True)
                 if access.may_read(who, s)][:MAX_SWEEPS]
        return self.json({"sweeps": [self._sweep_row(s) for s in shown]})

    def _sweep_row(self, sweep: Sweep) -> dict:
        trials = self.c.cluster.trial_rows(sweep)
        jobs = self.c.cluster.jobs
        bests = [t["best"] for t in trials if "best" in t]
        pick = max if sweep.sweep.goal == "max" else min
        return {"id": sweep.id, "name": sweep.spec.name, "owner": sweep.owner, "state": sweep.state.value,
                "message": sweep.message, "created": sweep.created, "finished": sweep.finished or None,
                "metric": sweep.sweep.metric, "goal": sweep.sweep.goal, "total": len(sweep.parameters),
                "done": sum(1 for t in trials if t["job_id"] and t["job_id"] in jobs and jobs[t["job_id"]].ended),
                "best": pick(bests) if bests else None,
                "trials": [{"index": t["index"], "job": t["job_id"] or None, "state": t["state"] or None,
                            "best": t.get("best"), "stopped_early": t["stopped_early"],
                            "kept": t["job_id"] in jobs}  # a trial's job that retention let go has no page
                           for t in trials]}
