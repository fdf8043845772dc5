"""What each running task has used lately, over time, as its agent's heartbeats tell it: CPU (cores in use,
from the CPU seconds of the task's process tree between two samples), resident memory, and its GPUs' mean
utilisation (0 to 1, from NVML; None where the agent does not read its GPUs). The dashboard draws
it; nothing is stored, and a coordinator that starts (or takes over) starts with empty histories.

Bounded: a sample per task at most every SAMPLE_SECONDS (heartbeats come every second from every node: most
are passed over at the cost of one dict look-up), SAMPLES per task (a ring: the oldest goes), and the tasks
heard from last, at most MAX_TASKS of them (the one silent longest goes).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from tfcluster.model import TaskProgress

SAMPLE_SECONDS = 5.0
SAMPLES = 720  # an hour at one sample per 5 s
MAX_TASKS = 4096


@dataclass
class TaskHistory:
    node: str
    attempt: int
    samples: deque = field(default_factory=lambda: deque(maxlen=SAMPLES))  # (time, CPU cores, RSS bytes, GPU use)
    cpu_seconds: float = 0.0  # at the last sample, to turn the next into cores in use
    at: float = 0.0


class UsageHistory:
    def __init__(self, sample_seconds: float = SAMPLE_SECONDS, max_tasks: int = MAX_TASKS):
        self.sample_seconds, self.max_tasks = sample_seconds, max_tasks
        self.tasks: OrderedDict[tuple[str, str, int], TaskHistory] = OrderedDict()

    def heartbeat(self, node: str, progress: list[TaskProgress], now: float) -> None:
        for p in progress:
            key = (p.attempt.job_id, p.attempt.type, p.attempt.index)
            history = self.tasks.get(key)
            if history is not None and history.attempt == p.attempt.number and now - history.at < self.sample_seconds:
                continue
            if history is None or history.attempt != p.attempt.number or history.node != node:
                # A new attempt (or node) starts a new CPU count: its first sample only sets the baseline.
                history = self.tasks[key] = TaskHistory(node, p.attempt.number, cpu_seconds=p.cpu_seconds, at=now)
                self._bound()
                continue
            elapsed = now - history.at
            cores = max(0.0, p.cpu_seconds - history.cpu_seconds) / elapsed if elapsed > 0 else 0.0
            gpu = None if p.gpu_utilization is None else round(p.gpu_utilization, 3)
            history.samples.append((now, round(cores, 3), p.rss_bytes, gpu))
            history.cpu_seconds, history.at = p.cpu_seconds, now
            self.tasks.move_to_end(key)

    def of_job(self, job_id: str) -> dict[str, TaskHistory]:
        """The job's tasks' histories by task name (`worker:0`)."""
        return {f"{task_type}:{index}": h for (job, task_type, index), h in self.tasks.items() if job == job_id}

    def _bound(self) -> None:
        while len(self.tasks) > self.max_tasks:
            self.tasks.popitem(last=False)
