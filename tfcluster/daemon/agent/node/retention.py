"""Keeping a node's disk bounded: which files of its jobs go, and why.

plan() is pure: what is on disk (scan()), the policy and the time in; the removals out, each with its size
and its reason. remove() carries them out. The agent runs a pass at startup and every few minutes
(RetentionPass); `tfcluster gc` runs one by hand. Both follow the same rules:

- a job with a task running on this node keeps everything;
- a job the coordinator said is over (it ended, or the coordinator has forgotten it: its ended marker, so
  `tfcluster gc` knows it offline) goes whole once it was last written longer ago than --retain-for, and
  sooner, oldest first, while the jobs on disk take more than --retain-bytes or the free disk is below
  --min-free-disk;
- any other job may still restart here, from its newest checkpoint: it keeps the newest attempt of each task
  and its newest checkpoint; its older attempts and older checkpoints go by the same age and byte rules, after
  every ended job.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import grpc

from tfcluster import layout, wire
from tfcluster.api.v1 import agent_pb2_grpc
from tfcluster.checkpoints import latest_checkpoint
from tfcluster.daemon.agent.shim.taskfiles import ShimStatus, TaskFileError, write_json_atomic
from tfcluster.daemon.agent.tasks.record import is_shim
from tfcluster.security import Credentials
from tfcluster.states import Phase

log = logging.getLogger("tfcluster.agent")

PASS_EVERY_SECONDS = 300.0
ASK_TIMEOUT_SECONDS = 10.0
STARTING_GRACE_SECONDS = 60.0  # an attempt with a launch file and no status yet counts as starting this long


@dataclass(frozen=True)
class Policy:
    retain_for: float = 7 * 86400.0   # --retain-for
    retain_bytes: int = 50 << 30      # --retain-bytes
    min_free_bytes: int = 1 << 30     # --min-free-disk


@dataclass(frozen=True)
class Item:
    """Files that go together: an older attempt, or an older checkpoint's index and data files."""
    label: str               # what it is, for the reason: "older attempt 1 of worker:0"
    shown: str               # where it is: a folder, or a checkpoint's prefix followed by `.*`
    paths: tuple[Path, ...]
    size: int
    written: float           # the newest modification time among its files


@dataclass(frozen=True)
class JobOnDisk:
    id: str
    dir: Path
    size: int                # every file of the job on this node
    written: float           # when any of them last changed (the ended marker aside)
    ended: bool              # the coordinator said it is over
    running: bool            # a task of it runs on this node
    older: tuple[Item, ...] = ()  # what may go while it is not over: older attempts and checkpoints


@dataclass(frozen=True)
class Removal:
    shown: str
    paths: tuple[Path, ...]
    size: int
    reason: str


# ---- the plan (pure) ----------------------------------------------------------------------------

def plan(jobs: Iterable[JobOnDisk], policy: Policy, now: float, free_bytes: int) -> list[Removal]:
    """What goes, in order: ended jobs (oldest first), then older attempts and checkpoints of jobs that are
    not over (oldest first), each past --retain-for, or while bytes must be freed."""
    jobs = list(jobs)
    total = sum(j.size for j in jobs)
    over_budget, below_floor = total - policy.retain_bytes, policy.min_free_bytes - free_bytes
    excess = max(over_budget, below_floor, 0)
    pressure = (f"over --retain-bytes {human_size(policy.retain_bytes)} (jobs take {human_size(total)})"
                if over_budget >= below_floor else
                f"free disk {human_size(free_bytes)} is below --min-free-disk {human_size(policy.min_free_bytes)}")
    idle = [j for j in jobs if not j.running]
    ended = sorted((Item("ended job", str(j.dir), (j.dir,), j.size, j.written) for j in idle if j.ended),
                   key=lambda i: i.written)
    older = sorted((i for j in idle if not j.ended for i in j.older), key=lambda i: i.written)
    removals = []
    for item in ended + older:
        what = f"{item.label}, last written {duration(now - item.written)} ago"
        if now - item.written > policy.retain_for:
            reason = f"{what}: past --retain-for {duration(policy.retain_for)}"
        elif excess > 0:
            reason = f"{what}: {pressure}"
        else:
            continue
        removals.append(Removal(item.shown, item.paths, item.size, reason))
        excess -= item.size
    return removals


def disk_condition(state_dir: Path, free_bytes: int, min_free_bytes: int) -> str:
    """Why this node takes no new tasks, in one line ("" when it does)."""
    if free_bytes >= min_free_bytes:
        return ""
    return (f"free disk under {state_dir} is {human_size(free_bytes)}, below the floor of "
            f"{human_size(min_free_bytes)} (--min-free-disk)")


def human_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.1f}".removesuffix(".0") + f" {unit}"
        size /= 1024
    return f"{size:.1f}".removesuffix(".0") + " TiB"


def duration(seconds: float) -> str:
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds / length:.1f}".removesuffix(".0") + unit
    return f"{max(seconds, 0):.0f}s"


# ---- what is on disk ----------------------------------------------------------------------------

def scan(state_dir: Path, running_jobs: Iterable[str] = (), now: float | None = None,
         measured: dict[str, tuple[int, int, float]] | None = None) -> list[JobOnDisk]:
    """The jobs under state_dir. A job runs when running_jobs (the agent's own knowledge) names it or one of its
    attempts' shims is alive (so `tfcluster gc` beside a running agent leaves its jobs alone). A job marked over
    changes no more: `measured` keeps what its files take from one pass to the next (job -> its dir's mtime,
    size, written), since a node keeps days of them and walking every file of each took seconds a pass."""
    now = time.time() if now is None else now
    running = set(running_jobs)
    jobs = []
    try:
        entries = sorted(os.scandir(layout.jobs_dir(state_dir)), key=lambda e: e.name)
    except OSError:
        return []
    kept: dict[str, tuple[int, int, float]] = {}
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        directory = Path(entry.path)
        over = (directory / layout.ENDED_MARKER).exists()  # it goes whole, when it goes: no older parts to list
        attempts, live = _attempts(state_dir, entry.name, now, older=not over)
        if over:
            size, written = _measure_over(directory, (measured or {}).get(entry.name), kept)
            jobs.append(JobOnDisk(id=entry.name, dir=directory, size=size, written=written, ended=True,
                                  running=entry.name in running or live))
            continue
        size, written = measure(directory, timeless=directory / layout.ENDED_MARKER)
        jobs.append(JobOnDisk(id=entry.name, dir=directory, size=size, written=written, ended=False,
                              running=entry.name in running or live,
                              older=tuple(attempts) + tuple(_older_checkpoints(state_dir, entry.name))))
    if measured is not None:
        measured.clear()
        measured.update(kept)
    return jobs


def _measure_over(directory: Path, before: tuple[int, int, float] | None,
                  kept: dict[str, tuple[int, int, float]]) -> tuple[int, float]:
    """What a job marked over takes: as measured before, unless its dir changed since."""
    try:
        changed = directory.stat().st_mtime_ns
    except OSError:  # removed meanwhile
        return 0, 0.0
    if before is not None and before[0] == changed:
        size, written = before[1], before[2]
    else:
        size, written = measure(directory, timeless=directory / layout.ENDED_MARKER)
    kept[directory.name] = (changed, size, written)
    return size, written


def measure(directory: Path | str, timeless: Path | None = None) -> tuple[int, float]:
    """Bytes of the files under a folder and the newest modification time among them (but timeless's)."""
    return _measure_files([Path(root, name) for root, _, names in os.walk(directory) for name in names], timeless)


def _measure_files(files: list[Path], timeless: Path | None = None) -> tuple[int, float]:
    size, written = 0, 0.0
    for file in files:
        try:
            info = os.lstat(file)
        except OSError:  # deleted meanwhile
            continue
        size += info.st_size
        written = written if file == timeless else max(written, info.st_mtime)
    return size, written


def _attempts(state_dir: Path, job_id: str, now: float, older: bool = True) -> tuple[list[Item], bool]:
    """The older attempts of each task of a job (the newest of each is kept; none listed unless `older`), and
    whether any attempt runs."""
    items, live = [], False
    try:
        tasks = [Path(e.path) for e in os.scandir(layout.tasks_dir(state_dir, job_id)) if e.is_dir()]
    except OSError:
        return [], False
    for task in tasks:
        try:
            names = os.listdir(task)
        except OSError:  # removed meanwhile
            continue
        numbers = [n.removeprefix(layout.ATTEMPT_DIR_PREFIX) for n in names if n.startswith(layout.ATTEMPT_DIR_PREFIX)]
        numbered = sorted((int(n), task / f"{layout.ATTEMPT_DIR_PREFIX}{n}") for n in numbers if n.isdigit())
        live = live or any(_attempt_runs(path, now) for _, path in numbered)
        for number, path in numbered[:-1] if older else ():
            size, written = measure(path)
            items.append(Item(f"older attempt {number} of {task.name} (attempt {numbered[-1][0]} is kept)", str(path),
                              (path,), size, written))
    return items, live


def _attempt_runs(attempt_dir: Path, now: float) -> bool:
    try:
        status = ShimStatus.read(attempt_dir)
    except TaskFileError:
        status = None  # as good as none: within the start's grace, it may run
    if status is None:  # starting: its shim has not written its status yet
        try:
            return now - (attempt_dir / layout.LAUNCH_FILE).stat().st_mtime < STARTING_GRACE_SECONDS
        except OSError:
            return False
    return status.phase == Phase.RUNNING and is_shim(status.shim_pid, attempt_dir, status.shim_started)


def _older_checkpoints(state_dir: Path, job_id: str) -> list[Item]:
    """The checkpoints in the job's host-local checkpoint dir but its newest (the one its state file names, and
    the newest written, when they differ)."""
    directory = layout.host_checkpoint_dir(str(state_dir), job_id)
    prefixes: dict[str, list[Path]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        # A checkpoint is its index and its data shards: ckpt-7.index, ckpt-7.data-00000-of-00001.
        prefix = name.removesuffix(".index") if name.endswith(".index") else name.partition(".data-")[0]
        if prefix != name:
            prefixes.setdefault(prefix, []).append(Path(directory, name))
    measured = {p: _measure_files(files) for p, files in prefixes.items()}
    committed = latest_checkpoint(directory)
    kept = {os.path.basename(committed)} if committed else set()
    if measured:
        kept.add(max(measured, key=lambda p: measured[p][1]))
    return [Item(f"older checkpoint {p} ({', '.join(sorted(kept))} kept)", f"{os.path.join(directory, p)}.*",
                 tuple(prefixes[p]), *measured[p]) for p in sorted(measured) if p not in kept]


def free_bytes(state_dir: Path) -> int:
    try:
        return shutil.disk_usage(state_dir).free
    except OSError:
        return 0


# ---- carrying it out ----------------------------------------------------------------------------

def mark_ended(state_dir: Path, job_id: str, now: float) -> None:
    """Records that the coordinator said the job is over, once (its time does not restart the job's age)."""
    marker = layout.job_dir(state_dir, job_id) / layout.ENDED_MARKER
    if not marker.exists():
        try:
            write_json_atomic(marker, {"over_since": now})
        except FileNotFoundError:  # its folder was removed meanwhile
            pass


def remove(removals: Iterable[Removal]) -> tuple[int, list[str]]:
    """Deletes what the plan says; returns the bytes freed and what could not be deleted (and why). Files
    another pass (or `tfcluster gc`) deleted first count as gone."""
    freed, errors = 0, []
    for removal in removals:
        failed = [error for path in removal.paths for error in _delete(path)]
        errors += failed
        freed += 0 if failed else removal.size
    return freed, errors


def ask_coordinator(address: str, credentials: Callable[[], Credentials], job_ids: list[str]) -> set[str]:
    """Which of these jobs the coordinator says are over. What it cannot be asked about counts as not over
    (a coordinator away, or one from before EndedJobs): the next pass asks again."""
    over: set[str] = set()
    try:
        with credentials().channel(address) as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            for start in range(0, len(job_ids), wire.MAX_JOB_IDS):
                batch = job_ids[start:start + wire.MAX_JOB_IDS]
                reply = stub.EndedJobs(wire.ended_jobs_request(batch), timeout=ASK_TIMEOUT_SECONDS)
                over |= wire.ended_jobs_from_proto(reply, batch)
    except grpc.RpcError as e:
        log.info("retention: cannot ask the coordinator which jobs are over (%s); asking again in %.0f s",
                 e.details() or e.code().name, PASS_EVERY_SECONDS)
    return over


def _delete(path: Path) -> list[str]:
    """Deletes a file or a folder; returns what could not be deleted, and why."""
    failed: list[str] = []

    def note(_function, where: str, info) -> None:
        if not isinstance(info[1], FileNotFoundError):
            failed.append(f"{where}: {info[1].strerror or info[1]}")

    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, onerror=note)
        else:
            path.unlink(missing_ok=True)
    except OSError as e:
        failed.append(f"{path}: {e.strerror or e}")
    return failed


class RetentionPass:
    """The agent's retention: at startup and every PASS_EVERY_SECONDS it asks the coordinator which jobs on disk
    without a running task are over (ask: job ids in, the ones over out; empty when the coordinator cannot be
    asked, so nothing new counts as over until a later pass), marks them, and removes what plan() says."""

    def __init__(self, state_dir: Path, policy: Policy, running_jobs: Callable[[], set[str]],
                 ask: Callable[[list[str]], set[str]], environments=None):
        self.state_dir, self.policy = state_dir, policy
        self.running_jobs, self.ask = running_jobs, ask
        self.environments = environments  # the jobs' environments (environments.py), unused ones go too
        self.measured: dict[str, tuple[int, int, float]] = {}  # what jobs marked over take (scan)

    def run(self, stop: threading.Event) -> None:
        while True:
            try:
                self.once(time.time())
            except Exception:  # a bug in one pass must not end the next ones
                log.exception("retention pass failed")
            if stop.wait(PASS_EVERY_SECONDS):
                return

    def once(self, now: float) -> list[Removal]:
        running = self.running_jobs()
        if self.environments is not None:
            for key in self.environments.sweep(running, now, self.policy.retain_for):
                log.info("retention: removed the environment %s, unused for %s", key[:12],
                         duration(self.policy.retain_for))
        jobs = scan(self.state_dir, running, now, self.measured)
        unsure = [j.id for j in jobs if not j.ended and not j.running]
        over = self.ask(unsure) if unsure else set()
        for job_id in over:
            mark_ended(self.state_dir, job_id, now)
        jobs = [replace(j, ended=True) if j.id in over else j for j in jobs]
        removals = plan(jobs, self.policy, now, free_bytes(self.state_dir))
        freed, errors = remove(removals)
        for removal in removals:
            log.info("retention: removed %s (%s): %s", removal.shown, human_size(removal.size), removal.reason)
        for error in errors:
            log.warning("retention: could not remove %s", error)
        if removals:
            log.info("retention: %s freed", human_size(freed))
        return removals
