"""The coordinator's Prometheus metrics.

Two kinds: what the model holds right now (nodes, GPUs, jobs, tasks, heartbeat ages, the latest evaluation of
each job) is read off the model at each scrape, on the event loop that owns it, so it is never stale and costs
nothing between scrapes; what only exists when it happens (restarts and their causes, placement waits, job
durations, store writes, RPCs) is counted as it happens, through the Observer and a gRPC interceptor.
"""

from __future__ import annotations

import inspect
import math
import time
from collections import Counter

import grpc
from prometheus_client import CollectorRegistry, ProcessCollector, disable_created_metrics
from prometheus_client import Counter as CounterMetric
from prometheus_client import Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tfcluster import strategies
from tfcluster.daemon.coordinator.core.cluster import Cluster
from tfcluster.daemon.coordinator.core.lifecycle.restart import CAUSES
from tfcluster.daemon.coordinator.core.model.job import Job
from tfcluster.daemon.coordinator.core.model.observer import Observer
from tfcluster.states import JobState, NodeState, TaskState

# A job runs for minutes to weeks; it waits for placement for milliseconds to hours.
JOB_SECONDS_BUCKETS = (60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400,
                       math.inf)
PLACEMENT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600, math.inf)
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, math.inf)
STORE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, math.inf)
STRATEGIES = tuple(s for s in strategies.NAMES if s != "auto")  # a job's strategy is resolved on submission


class CoordinatorMetrics(Observer):
    """The registry the coordinator's /metrics serves; also the Observer the core reports events to."""

    def __init__(self, cluster: Cluster, clock=time.time):
        disable_created_metrics()  # a `_created` series beside every counter only doubles what is scraped
        self.registry = CollectorRegistry()
        r = self.registry
        self.restarts = CounterMetric("tfcluster_job_restarts", "Restarts of jobs (the whole group, some tasks or "
                                      "the evaluator), by cause.", ["cause"], registry=r)
        for cause in CAUSES:
            self.restarts.labels(cause)
        self.job_seconds = Histogram("tfcluster_job_duration_seconds", "How long ended jobs took, submission to "
                                     "end.", ["strategy", "state"], buckets=JOB_SECONDS_BUCKETS, registry=r)
        self.placement = Histogram("tfcluster_job_placement_wait_seconds", "How long a job waited to be placed, "
                                   "from submission (or from when a restart may place it).",
                                   buckets=PLACEMENT_BUCKETS, registry=r)
        self.queue_wait = Histogram("tfcluster_job_queue_wait_seconds", "How long jobs waited from submission until "
                                    "they first ran (every task up), by priority class (\"\" without a policy).",
                                    ["priority"], buckets=PLACEMENT_BUCKETS, registry=r)
        self.store_seconds = Histogram("tfcluster_store_write_seconds", "Time to write one batch of changes to "
                                       "the state database.", buckets=STORE_BUCKETS, registry=r)
        self.store_errors = CounterMetric("tfcluster_store_write_errors", "Batches of changes that could not be "
                                          "written (they are retried).", registry=r)
        self.rpcs = CounterMetric("tfcluster_rpc_requests", "gRPC calls handled, by method and status code.",
                                  ["method", "code"], registry=r)
        self.rpc_seconds = Histogram("tfcluster_rpc_duration_seconds", "gRPC call duration by method (a stream's "
                                     "whole life for streaming calls).", ["method"], buckets=RPC_BUCKETS,
                                     registry=r)
        ProcessCollector(registry=r)
        r.register(ModelCollector(cluster, clock))

    # ---- the Observer ------------------------------------------------------------------------------

    def placed(self, job: Job, waited_seconds: float) -> None:
        self.placement.observe(waited_seconds)

    def started(self, job: Job, waited_seconds: float) -> None:
        self.queue_wait.labels(job.priority).observe(waited_seconds)

    def restarted(self, job: Job, cause: str) -> None:
        self.restarts.labels(cause).inc()

    def ended(self, job: Job) -> None:
        if job.created and job.finished >= job.created:
            self.job_seconds.labels(job.strategy, job.state.value).observe(job.finished - job.created)

    def stored(self, seconds: float, ok: bool) -> None:
        self.store_seconds.observe(seconds)
        if not ok:
            self.store_errors.inc()

    def interceptor(self) -> "RpcMetrics":
        return RpcMetrics(self.rpcs, self.rpc_seconds)


class ModelCollector(Collector):
    """Reads the model at scrape time. Runs on the coordinator's event loop (the HTTP listener is on it)."""

    def __init__(self, cluster: Cluster, clock):
        self.cluster, self.clock = cluster, clock

    def collect(self):
        yield from self._nodes()
        yield from self._jobs()
        yield self._evaluations()

    def _nodes(self):
        nodes = self.cluster.nodes.values()
        by_state = Counter(n.state for n in nodes)
        family = GaugeMetricFamily("tfcluster_nodes", "Nodes by state.", labels=["state"])
        for state in NodeState:
            family.add_metric([state.value], by_state[state])
        yield family
        yield GaugeMetricFamily("tfcluster_gpus", "GPUs on READY nodes.",
                                value=sum(len(n.info.gpus) for n in nodes if n.state == NodeState.READY))
        yield GaugeMetricFamily("tfcluster_gpus_allocated", "GPUs held by tasks of jobs that have not ended.",
                                value=sum(len(t.gpus) for j in self.cluster.jobs.live.values() for t in j.tasks if t.live))
        age = GaugeMetricFamily("tfcluster_node_heartbeat_age_seconds", "Seconds since each READY node's agent was "
                                "last heard from.", labels=["node"])
        now = self.clock()
        for node in nodes:
            if node.state == NodeState.READY:
                age.add_metric([node.name], max(0.0, now - node.seen.last_seen))
        yield age
        yield self._drains(nodes)
        yield self._conditions(nodes)

    def _drains(self, nodes) -> GaugeMetricFamily:
        """One series per drained node (a handful at most): an alert can say who drained what, why and since."""
        drained = GaugeMetricFamily("tfcluster_node_drained_since_seconds", "When each drained node was drained "
                                    "(unix seconds), with its drain's state, who drained it and why.",
                                    labels=["node", "state", "by", "reason"])
        for node in nodes:
            if node.drain is not None:
                state = self.cluster.nodes.drain_state(node.name)
                drained.add_metric([node.name, state.value, node.drain.by, node.drain.reason], node.drain.since)
        return drained

    @staticmethod
    def _conditions(nodes) -> GaugeMetricFamily:
        """One series per condition an agent found (none on a healthy cluster): 1 where it keeps the GPU out of
        placement, 0 where it is only shown (throttling)."""
        family = GaugeMetricFamily("tfcluster_gpu_conditions", "Problems the agents found on their GPUs (gpu "
                                   "\"\": the node): 1 while the GPU is left out of placement, 0 when only shown.",
                                   labels=["node", "gpu", "kind"])
        for node in nodes:
            for c in node.seen.conditions:
                family.add_metric([node.name, "" if c.gpu is None else str(c.gpu), c.kind], 1.0 if c.excludes else 0.0)
        return family

    def _jobs(self):
        jobs = Counter((j.state, j.strategy) for j in self.cluster.jobs.values())
        family = GaugeMetricFamily("tfcluster_jobs", "Jobs the coordinator keeps, by state and strategy.",
                                   labels=["state", "strategy"])
        for strategy in sorted(set(STRATEGIES) | {s for _, s in jobs}):
            for state in JobState:
                family.add_metric([state.value, strategy], jobs[(state, strategy)])
        yield family
        pending = Counter(j.priority for j in self.cluster.jobs.live.values() if j.state == JobState.PENDING)
        family = GaugeMetricFamily("tfcluster_queue_jobs", "PENDING jobs (the queue), by priority class (\"\" "
                                   "without a policy).", labels=["priority"])
        for priority in sorted((set(self.cluster.policy.classes) or {""}) | set(pending)):
            family.add_metric([priority], pending[priority])
        yield family
        tasks = Counter(t.state for j in self.cluster.jobs.live.values() for t in j.tasks)
        family = GaugeMetricFamily("tfcluster_tasks", "Tasks of jobs that have not ended, by state.",
                                   labels=["state"])
        for state in TaskState:
            family.add_metric([state.value], tasks[state])
        yield family

    def _evaluations(self):
        # owner adds no series: each job has one.
        family = GaugeMetricFamily("tfcluster_evaluation", "Each job's latest evaluation result, by metric "
                                   "(`step` is the step of the evaluated checkpoint), with the job's owner.",
                                   labels=["job_id", "owner", "metric"])
        for job in self.cluster.jobs.values():
            if job.evaluations:
                latest = job.evaluations[-1]
                family.add_metric([job.id, job.owner, "step"], latest.step)
                for name, value in latest.metrics.items():
                    family.add_metric([job.id, job.owner, name], value)
        return family


class RpcMetrics(grpc.aio.ServerInterceptor):
    """Counts every call and times it, by method and final status code; outermost, so refusals count too."""

    def __init__(self, calls: CounterMetric, seconds: Histogram):
        self.calls, self.seconds = calls, seconds

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method.rsplit("/", 1)[-1]
        kind = next(k for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
                    if getattr(handler, k) is not None)
        behaviour = getattr(handler, kind)
        if inspect.isasyncgenfunction(behaviour):
            async def run(request, context):
                started = time.monotonic()
                try:
                    async for item in behaviour(request, context):
                        yield item
                finally:
                    self._count(method, context, started)
        else:
            async def run(request, context):
                started = time.monotonic()
                try:
                    return await behaviour(request, context)
                finally:
                    self._count(method, context, started)
        return getattr(grpc, f"{kind}_rpc_method_handler")(
            run, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)

    def _count(self, method: str, context, started: float) -> None:
        code = context.code()
        name = code.name if isinstance(code, grpc.StatusCode) else "OK" if code in (None, 0) else str(code)
        self.calls.labels(method, name).inc()
        self.seconds.labels(method).observe(time.monotonic() - started)
