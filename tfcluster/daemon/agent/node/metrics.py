"""The agent's Prometheus metrics: its tasks' processes (psutil), its GPUs (NVML) labelled with the job and task
that hold them, checkpoint shipping, and the disk under its state dir.

Everything but the shipping counters is read at scrape time, on the HTTP listener's thread: a scrape costs a
walk over the tasks' process trees and one NVML query per GPU, and nothing at all between scrapes.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterable

import psutil
from prometheus_client import CollectorRegistry, ProcessCollector, disable_created_metrics
from prometheus_client import Counter as CounterMetric
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tfcluster.daemon.agent.node.retention import measure
from tfcluster.daemon.agent.tasks.record import TaskRecord
from tfcluster.daemon.agent.tasks.supervisor import Supervisor
from tfcluster.model import Attempt, Gpu
from tfcluster.states import Phase
log = logging.getLogger("tfcluster.agent")

STATE_DIR_SIZE_EVERY_SECONDS = 60.0  # walking a state dir with many attempts is not free: at most once a minute
# `job_id`, not `job`: Prometheus gives every scraped series a `job` label of its own (the scrape job).
TASK_LABELS = ["job_id", "task", "attempt"]


class AgentMetrics:
    """The registry the agent's /metrics serves, and the counters the agent bumps as it ships checkpoints."""

    def __init__(self, supervisor: Supervisor, gpus: tuple[Gpu, ...], state_dir: str):
        disable_created_metrics()  # a `_created` series beside every counter only doubles what is scraped
        self.registry = CollectorRegistry()
        r = self.registry
        self.shipped_bytes = CounterMetric("tfcluster_checkpoint_shipped_bytes", "Checkpoint bytes sent to other "
                                           "agents (new checkpoints and copies of whole dirs).", ["kind"], registry=r)
        self.ship_seconds = CounterMetric("tfcluster_checkpoint_ship_seconds", "Seconds spent sending checkpoint "
                                          "files to other agents.", ["kind"], registry=r)
        self.ship_failures = CounterMetric("tfcluster_checkpoint_ship_failures", "Checkpoint sends that failed "
                                           "(they are retried).", ["kind"], registry=r)
        for kind in ("new", "copy"):
            for metric in (self.shipped_bytes, self.ship_seconds, self.ship_failures):
                metric.labels(kind)
        ProcessCollector(registry=r)
        r.register(TaskCollector(supervisor))
        self.gpus = GpuCollector(gpus, supervisor)
        r.register(self.gpus)
        r.register(DiskCollector(state_dir))

    def shipped(self, kind: str, size: int, seconds: float) -> None:
        self.shipped_bytes.labels(kind).inc(size)
        self.ship_seconds.labels(kind).inc(seconds)

    def ship_failed(self, kind: str) -> None:
        self.ship_failures.labels(kind).inc()


def _task_labels(record: TaskRecord) -> list[str]:
    a = record.attempt
    return [a.job_id, f"{a.type}:{a.index}", str(a.number)]


class TaskCollector(Collector):
    """Running tasks, and each one's CPU time, resident memory and threads summed over its process tree."""

    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor

    def collect(self):
        running = [r for r in self.supervisor.snapshot() if r.phase == Phase.RUNNING and r.pid]
        yield GaugeMetricFamily("tfcluster_tasks_running", "Tasks running on this node.", value=len(running))
        cpu = CounterMetricFamily("tfcluster_task_cpu_seconds", "CPU time (user and system) of a task's "
                                  "processes.", labels=TASK_LABELS)
        rss = GaugeMetricFamily("tfcluster_task_resident_memory_bytes", "Resident memory of a task's processes.",
                                labels=TASK_LABELS)
        threads = GaugeMetricFamily("tfcluster_task_threads", "Threads of a task's processes.", labels=TASK_LABELS)
        processes = GaugeMetricFamily("tfcluster_task_processes", "Processes of a task.", labels=TASK_LABELS)
        for record in running:
            usage = process_tree_usage(record.pid)
            if usage is None:
                continue
            labels = _task_labels(record)
            cpu.add_metric(labels, usage[0])
            rss.add_metric(labels, usage[1])
            threads.add_metric(labels, usage[2])
            processes.add_metric(labels, usage[3])
        yield from (cpu, rss, threads, processes)


def process_tree_usage(pid: int) -> tuple[float, int, int, int] | None:
    """(CPU seconds, resident bytes, threads, processes) of pid and its descendants; None when pid is gone."""
    try:
        root = psutil.Process(pid)
        tree = [root] + root.children(recursive=True)
    except psutil.Error:
        return None
    cpu, rss, threads, count = 0.0, 0, 0, 0
    for process in tree:
        try:
            with process.oneshot():
                times = process.cpu_times()
                cpu += times.user + times.system
                rss += process.memory_info().rss
                threads += process.num_threads()
                count += 1
        except psutil.Error:  # it ended while we looked
            continue
    return cpu, rss, threads, count


class GpuCollector(Collector):
    """Every GPU of the node with the job and task holding it; utilisation, memory, power and temperature from
    NVML where the node has it (nodes declared with --gpu-inventory, or without NVML, report the first only)."""

    def __init__(self, gpus: tuple[Gpu, ...], supervisor: Supervisor):
        self.gpus, self.supervisor = gpus, supervisor
        self.nvml = Nvml() if gpus else None

    def collect(self):
        holders = gpu_holders(self.gpus, self.supervisor.snapshot())
        labels = ["gpu", "uuid", "job_id", "task"]
        info = GaugeMetricFamily("tfcluster_gpu_allocated", "1 for each GPU of this node held by a running task, "
                                 "0 for a free one.", labels=labels)
        families = {name: GaugeMetricFamily(f"tfcluster_gpu_{name}", text, labels=labels) for name, text in (
            ("utilization_ratio", "GPU utilisation over NVML's last sample period, 0 to 1."),
            ("memory_used_bytes", "GPU memory in use."),
            ("memory_capacity_bytes", "GPU memory in all."),
            ("power_watts", "GPU power draw."),
            ("temperature_celsius", "GPU core temperature."))}
        readings = self.nvml.read([g.index for g in self.gpus]) if self.nvml else {}
        for gpu in self.gpus:
            holder = holders.get(gpu.index)
            values = [str(gpu.index), gpu.uuid, *(_task_labels(holder)[:2] if holder else ("", ""))]
            info.add_metric(values, 1 if holder else 0)
            for name, value in readings.get(gpu.index, {}).items():
                families[name].add_metric(values, value)
        yield info
        yield from families.values()

    def task_utilization(self) -> dict[Attempt, float]:
        """Each running task's GPUs' mean utilisation now (sent with the heartbeats, for the dashboard's usage
        charts); empty where NVML does not read the GPUs (nothing is looked at then)."""
        if self.nvml is None or self.nvml.pynvml is None:
            return {}
        holders = gpu_holders(self.gpus, self.supervisor.snapshot())
        readings = self.nvml.read(sorted(holders))
        per_task: dict[Attempt, list[float]] = {}
        for index, record in holders.items():
            if index in readings:
                per_task.setdefault(record.attempt, []).append(readings[index]["utilization_ratio"])
        return {attempt: sum(values) / len(values) for attempt, values in per_task.items()}


def gpu_holders(gpus: Iterable[Gpu], records: list[TaskRecord]) -> dict[int, TaskRecord]:
    """GPU index -> the running task whose CUDA_VISIBLE_DEVICES names it (by index or UUID)."""
    by_name = {}
    for gpu in gpus:
        by_name[str(gpu.index)] = by_name[gpu.uuid] = gpu.index
    holders = {}
    for record in records:
        if record.phase != Phase.RUNNING:
            continue
        for name in record.gpus.split(","):
            if name.strip() in by_name:
                holders[by_name[name.strip()]] = record
    return holders


class Nvml:
    """NVML readings per GPU index. Initialised once; a node without a working driver reads nothing."""

    def __init__(self):
        self.lock = threading.Lock()
        try:
            import pynvml
            pynvml.nvmlInit()
            self.pynvml = pynvml
        except Exception as e:  # no library, no driver: GPUs declared by inventory on a test machine
            log.info("GPU metrics unavailable: NVML does not load (%s)", e)
            self.pynvml = None

    def read(self, indexes: list[int]) -> dict[int, dict[str, float]]:
        if self.pynvml is None:
            return {}
        readings = {}
        with self.lock:
            for index in indexes:
                try:
                    readings[index] = self._read_one(index)
                except self.pynvml.NVMLError as e:  # one GPU fallen off the bus must not hide the others
                    log.debug("NVML cannot read GPU %d: %s", index, e)
        return readings

    def _read_one(self, index: int) -> dict[str, float]:
        nvml = self.pynvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        reading = {"utilization_ratio": nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
                   "memory_used_bytes": float(memory.used), "memory_capacity_bytes": float(memory.total)}
        for name, read in (("power_watts", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
                           ("temperature_celsius",
                            lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)))):
            try:
                reading[name] = read()
            except nvml.NVMLError:  # not every board reports power
                pass
        return reading


class DiskCollector(Collector):
    """The filesystem under the state dir (free and total), and what the state dir itself holds."""

    def __init__(self, state_dir: str, clock: Callable[[], float] = time.monotonic):
        self.state_dir, self.clock = state_dir, clock
        self.size, self.sized_at = 0, -STATE_DIR_SIZE_EVERY_SECONDS

    def collect(self):
        try:
            usage = shutil.disk_usage(self.state_dir)
        except OSError:
            return
        yield GaugeMetricFamily("tfcluster_disk_free_bytes", "Free bytes on the filesystem of the state dir "
                                "(for unprivileged users).", value=usage.free)
        yield GaugeMetricFamily("tfcluster_disk_size_bytes", "Size of the filesystem of the state dir.",
                                value=usage.total)
        if self.clock() - self.sized_at >= STATE_DIR_SIZE_EVERY_SECONDS:
            self.size, self.sized_at = measure(self.state_dir)[0], self.clock()
        yield GaugeMetricFamily("tfcluster_state_dir_bytes", "Bytes under the agent's state dir (task logs, "
                                "attempts, host-local checkpoints), measured at most once a minute.", value=self.size)
