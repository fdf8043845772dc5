"""What a task's process tree uses, watched from its shim (shim/runner.py): CPU seconds, resident memory now and
at its peak; and the task's memory limit, where no cgroup enforces it, kept by killing the tree once its
resident memory passes the limit.

The shim is the watcher because it outlives an agent restart and already waits on the task: a limit keeps
holding while no agent runs. The tree is sampled at least once a second, and sooner as its memory nears the
limit at the pace it grows, so a task allocating fast is caught soon after it crosses, while a quiet one costs
one sample a second. Between samples the kernel still keeps the high-water mark of each process (ru_maxrss),
which the final figure takes into account.

A sample reads one /proc/PID/stat per process of the tree (CPU times, those of reaped children, resident
pages). Finding the tree's members means reading every process's stat on the node, so that is done every few
seconds, and at every sample once the tree holds half its limit; in between, the members known are read.

CPU seconds count every process of the tree: the live ones (with the children they reaped), and at the end the
task with every descendant reaped below it (what wait4 says of the task) plus those still alive when it ended,
sampled just before the shim kills them.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from tfcluster.daemon.agent.shim import threads
from tfcluster.model import size_text

SAMPLE_SECONDS = 1.0        # at least this often
FASTEST_SAMPLE_SECONDS = 0.1
PUBLISH_SECONDS = 1.0       # the live figures are handed to the agent at most this often
RESCAN_SECONDS = 5.0        # the tree's members are looked for anew at least this often
FIRST_RESCAN_SECONDS = 0.5  # ... and first this long after the start: most short tasks end before it
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Usage:
    cpu_seconds: float = 0.0
    rss_bytes: int = 0
    peak_rss_bytes: int = 0


def exceeded_message(task: str, limit: int, peak: int) -> str:
    """What a task killed for its memory says, in its exit and its job's last failure."""
    return f"{task} exceeded its memory limit of {size_text(limit)} (peak {size_text(peak)})"


class TreeWatch:
    """Samples the tree of pid in a thread of its own until finish(); with limit_bytes (0: none), kills the tree
    when its resident memory passes the limit. publish gets the live figures (at most once per PUBLISH_SECONDS)."""

    def __init__(self, pid: int, limit_bytes: int = 0, publish: Callable[[Usage], None] = lambda usage: None):
        self.pid, self.limit, self.publish = pid, limit_bytes, publish
        self.cpu = 0.0   # the most the live tree has counted (it drops when a process leaves unreaped)
        self.rss = 0
        self.peak = 0
        self.exceeded = False  # the tree was killed for passing the limit
        self._members: dict[int, _Stat] = {}  # the tree as last sampled: pid -> its stat
        self._rescan_at = 0.0
        self._published_at = 0.0
        self._done = self._thread = None  # made by start(): a task that ends first costs no thread

    def start(self) -> None:
        import threading  # here, not at the top: a shim whose task ended first needs none (runner.py)

        self._done = threading.Event()
        self._thread = threads.start(self._loop, "tree-watch")

    def _loop(self) -> None:
        # At the start the tree is the task alone: reading every process on the node (the rescan) and handing
        # figures on would be most of what watching a short task costs, so both wait a little.
        started = self._stat_of_task()
        last_rss, last_at = 0, time.monotonic()
        self._rescan_at = last_at + FIRST_RESCAN_SECONDS if started else 0.0
        self._published_at = last_at
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

    def _stat_of_task(self) -> bool:
        stat = _stat(self.pid)
        if stat is not None:
            self._members = {self.pid: stat}
        return stat is not None

    def _next_wait(self, growth_per_second: float) -> float:
        """Sooner while the tree grows towards its limit: half the time it would take to reach it."""
        if not self.limit or growth_per_second <= 0:
            return SAMPLE_SECONDS
        reach = max(0, self.limit - self.rss) / growth_per_second
        return min(SAMPLE_SECONDS, max(FASTEST_SAMPLE_SECONDS, reach / 2))

    def sample(self) -> None:
        """Reads the tree's figures now."""
        now = time.monotonic()
        if now >= self._rescan_at or (self.limit and self.rss * 2 > self.limit):
            members = _tree(self.pid)
            self._rescan_at = now + RESCAN_SECONDS
        else:
            members = _same(self._members)
        if self.pid not in members:  # the task ended: what is left of its tree is looked at in finish()
            return
        self._members = members
        self.cpu = max(self.cpu, sum(s.cpu for s in members.values()))
        self.rss = sum(s.rss for s in members.values())
        self.peak = max(self.peak, self.rss)

    def kill(self) -> None:
        """SIGKILL to the task's process group, and to each process of its tree that left the group."""
        for pid in _same(self._members):
            _signal(pid, signal.SIGKILL)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def usage(self) -> Usage:
        return Usage(round(self.cpu, 3), self.rss, self.peak)

    def finish(self, reaped: resource.struct_rusage | None) -> Usage:
        """Once the task was reaped (reaped: what wait4 said it and the descendants it reaped used), before its
        leftovers are killed: stops sampling and gives the attempt's figures, the survivors of its tree
        included."""
        if self._thread is not None:
            self._done.set()
            self._thread.join()
        survivors = [s for pid, s in _same(self._members).items() if pid != self.pid]
        cpu, peak = (reaped.ru_utime + reaped.ru_stime, reaped.ru_maxrss * 1024) if reaped is not None else (0.0, 0)
        self.cpu = max(self.cpu, cpu + sum(s.cpu for s in survivors))
        self.peak = max(self.peak, peak, sum(s.rss for s in survivors))
        self.rss = 0
        return self.usage()


@dataclass(frozen=True)
class _Stat:
    """What one /proc/PID/stat says of a process."""
    parent: int
    start: int   # clock ticks after boot: with the pid, it names the process for good
    cpu: float   # its user and system seconds, and those of the children it reaped
    rss: int     # bytes


def _stat(pid: int) -> _Stat | None:
    try:  # os.open and os.read cost less than open(), which counts when every process on the node is read
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # Fields after the command name (in parentheses, which may hold anything): state is field 3.
    f = data[data.rindex(b")") + 2:].split()
    ticks = int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])  # utime, stime, cutime, cstime
    return _Stat(parent=int(f[1]), start=int(f[19]), cpu=ticks / TICKS, rss=int(f[21]) * PAGE)


def _tree(root: int) -> dict[int, _Stat]:
    """root and its descendants, from every process's stat."""
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None:
                stats[int(name)] = stat
    children: dict[int, list[int]] = {}
    for pid, stat in stats.items():
        children.setdefault(stat.parent, []).append(pid)
    found, todo = {}, [root] if root in stats else []
    while todo:
        pid = todo.pop()
        found[pid] = stats[pid]
        todo += children.get(pid, ())
    return found


def _same(members: dict[int, _Stat]) -> dict[int, _Stat]:
    """The members still running (the same processes: a reused pid has another start), read again."""
    now = {}
    for pid, before in members.items():
        stat = _stat(pid)
        if stat is not None and stat.start == before.start:
            now[pid] = stat
    return now


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
