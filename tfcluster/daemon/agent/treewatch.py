"""What a task's process tree uses, watched from its shim (taskrunner.py): CPU seconds, resident memory now and
at its peak; and the task's memory limit, where no cgroup enforces it, kept by killing the tree once its
resident memory passes the limit.

The shim is the watcher because it outlives an agent restart and already waits on the task: a limit keeps
holding while no agent runs. The tree is sampled at least once a second, and sooner as its memory nears the
limit at the pace it grows, so a task allocating fast is caught soon after it crosses, while a quiet one costs
one sample a second. Between samples the kernel still keeps the high-water mark of each process (ru_maxrss),
which the final figure takes into account.

CPU seconds count every process of the tree: the live ones (with the children they reaped), and at the end the
task with every descendant reaped below it (the shim's RUSAGE_CHILDREN) plus those still alive when it ended,
sampled just before the shim kills them.
"""

from __future__ import annotations

import os
import resource
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from tfcluster.model import size_text

SAMPLE_SECONDS = 1.0        # at least this often
FASTEST_SAMPLE_SECONDS = 0.1
PUBLISH_SECONDS = 1.0       # the live figures are handed to the agent at most this often


@dataclass(frozen=True)
class Usage:
    cpu_seconds: float = 0.0
    rss_bytes: int = 0
    peak_rss_bytes: int = 0


def exceeded_message(task: str, limit: int, peak: int) -> str:
    """What a task killed for its memory says, in its exit and its job's last failure."""
    return f"{task} exceeded its memory limit of {size_text(limit)} (peak {size_text(peak)})"


class TreeWatch:
    """Samples the tree of pid in a thread of its own until stop(); with limit_bytes (0: none), kills the tree when
    its resident memory passes the limit. publish gets the live figures (at most once per PUBLISH_SECONDS)."""

    def __init__(self, pid: int, limit_bytes: int = 0, publish: Callable[[Usage], None] = lambda usage: None):
        self.pid, self.limit, self.publish = pid, limit_bytes, publish
        self.cpu = 0.0   # the most the live tree has counted (it drops when a process leaves unreaped)
        self.rss = 0
        self.peak = 0
        self.exceeded = False  # the tree was killed for passing the limit
        self._tree: list[psutil.Process] = []
        self._done = threading.Event()
        self._published_at = 0.0
        self._thread = threading.Thread(target=self._loop, name="tree-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        last_rss, last_at = 0, time.monotonic()
        while not self._done.is_set():
            self.sample()
            now = time.monotonic()
            if self.limit and self.rss > self.limit and not self.exceeded:
                self.exceeded = True
                self.kill()
            if now - self._published_at >= PUBLISH_SECONDS:
                self._published_at = now
                self.publish(self.usage())
            wait = self._next_wait((self.rss - last_rss) / max(now - last_at, 1e-3))
            last_rss, last_at = self.rss, now
            self._done.wait(wait)

    def _next_wait(self, growth_per_second: float) -> float:
        """Sooner while the tree grows towards its limit: half the time it would take to reach it."""
        if not self.limit or growth_per_second <= 0:
            return SAMPLE_SECONDS
        reach = max(0, self.limit - self.rss) / growth_per_second
        return min(SAMPLE_SECONDS, max(FASTEST_SAMPLE_SECONDS, reach / 2))

    def sample(self) -> None:
        """Reads the tree's figures now."""
        try:
            root = psutil.Process(self.pid)
            tree = [root] + root.children(recursive=True)
        except psutil.Error:  # the task ended: what is left of its tree is looked at in finish()
            return
        cpu, rss = _cpu_and_rss(tree)
        self._tree = tree
        self.cpu, self.rss = max(self.cpu, cpu), rss
        self.peak = max(self.peak, rss)

    def kill(self) -> None:
        """SIGKILL to the task's process group, and to any process of its tree that left the group."""
        for process in self._tree:
            try:
                process.send_signal(signal.SIGKILL)  # checks the process is still the one sampled (pid reuse)
            except psutil.Error:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def usage(self) -> Usage:
        return Usage(round(self.cpu, 3), self.rss, self.peak)

    def finish(self) -> Usage:
        """Once the task was reaped, before its leftovers are killed: stops sampling and gives the attempt's
        figures, its reaped processes and the survivors of its tree included."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        survivors = [p for p in self._tree[1:] if _still_running(p)]
        cpu, rss = _cpu_and_rss(survivors)
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)  # the shim's only child is the task
        self.cpu = max(self.cpu, reaped.ru_utime + reaped.ru_stime + cpu)
        self.peak = max(self.peak, reaped.ru_maxrss * 1024, rss)
        self.rss = 0
        return self.usage()


def _cpu_and_rss(processes: list[psutil.Process]) -> tuple[float, int]:
    """CPU seconds (with what each process's reaped children used) and resident bytes of these processes."""
    cpu, rss = 0.0, 0
    for process in processes:
        try:
            with process.oneshot():
                times = process.cpu_times()
                rss += process.memory_info().rss
        except psutil.Error:  # it ended while we looked
            continue
        cpu += times.user + times.system + times.children_user + times.children_system
    return cpu, rss


def _still_running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
