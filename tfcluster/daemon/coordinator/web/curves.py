"""Every scalar a job's tasks write to their summaries, as curves the dashboard draws while the job runs.

The event files come from the coordinator's summary store (store/summaries.py), read on from where the last
reading ended: each refresh parses only the bytes written since. Memory stays bounded however long a job runs
and however many jobs are looked at: a curve keeps at most MAX_POINTS points (past that, every other point goes
and from then on only every second, fourth, ... new point is kept, so the kept points stay evenly spread over
the steps; the newest point is always shown), a job at most MAX_SERIES curves, and the curves of only the
MAX_JOBS jobs looked at last are kept (another job's are read again from its files when asked for).

Reading files and parsing records is blocking work: the dashboard runs `JobCurves.update` on a thread, one at
a time per job, never on the coordinator's event loop.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from tfcluster.daemon.coordinator.store.summaries import SummaryStore
from tfcluster.daemon.coordinator.web.event_records import EventFileError, Scalar, scalars, split_records

MAX_POINTS = 500
MAX_SERIES = 200
MAX_JOBS = 32
MAX_PENDING_BYTES = 64 * 1024 * 1024  # a record longer than this never completes: event_records refuses it first


@dataclass
class Series:
    """One curve: one tag of one run (the task that wrote it, and the folder below its summary dir)."""
    run: str
    tag: str
    points: list[tuple[int, float, float]] = field(default_factory=list)  # (step, value, wall time), kept ones
    stride: int = 1   # every stride-th point written is kept
    seen: int = 0     # points written so far
    last: tuple[int, float, float] | None = None

    def add(self, point: tuple[int, float, float], limit: int = MAX_POINTS) -> None:
        if self.seen % self.stride == 0:
            self.points.append(point)
            if len(self.points) > limit:
                self.points = self.points[::2]
                self.stride *= 2
        self.seen += 1
        self.last = point

    def doc(self) -> dict:
        shown = list(self.points)
        if self.last is not None and (not shown or shown[-1] != self.last):
            shown.append(self.last)
        return {"run": self.run, "tag": self.tag, "points": [list(p) for p in shown], "written": self.seen,
                "stride": self.stride}


class JobCurves:
    """The curves of one job, and how far each of its event files has been read."""

    def __init__(self, job_id: str):
        self.job_id = job_id
        self.read_to: dict[str, int] = {}     # file key -> bytes parsed
        self.pending: dict[str, bytes] = {}   # file key -> bytes of a record not yet whole
        self.series: dict[tuple[str, str], Series] = {}
        self.problems: dict[str, str] = {}    # file key -> why it is read no further
        self.skipped = 0                      # records that were no Event, or curves past MAX_SERIES
        self.lock = threading.Lock()

    def update(self, store: SummaryStore) -> None:
        """Reads what the job's files gained since the last update (blocking: on a thread)."""
        with self.lock:
            have = {key: self.read_to.get(key, 0) + len(self.pending.get(key, b"")) for key in self.read_to}
            for key in self.problems:
                have[key] = 1 << 62  # read no further
            for chunk in store.read(self.job_id, have):
                self._add_bytes(chunk.key, chunk.task, chunk.path, chunk.offset, chunk.data)

    def _add_bytes(self, key: str, task: str, path: str, offset: int, data: bytes) -> None:
        self.read_to.setdefault(key, 0)
        data = self.pending.pop(key, b"") + data
        try:
            records, used = split_records(data, f"{task}/{path}")
        except EventFileError as e:
            self.problems[key] = str(e)
            return
        self.read_to[key] += used
        if used < len(data):
            self.pending[key] = data[used:]
        run = task if "/" not in path else f"{task}/{path.rsplit('/', 1)[0]}"  # Keras: worker:0/train, .../validation
        for record in records:
            try:
                found = scalars(record)
            except ValueError:  # protobuf's DecodeError: a record that is not an Event
                self.skipped += 1
                continue
            for s in found:
                self._series(run, s)

    def _series(self, run: str, s: Scalar) -> None:
        series = self.series.get((run, s.tag))
        if series is None:
            if len(self.series) >= MAX_SERIES:
                self.skipped += 1
                return
            series = self.series[(run, s.tag)] = Series(run, s.tag)
        series.add((s.step, s.value, s.wall_time))

    def doc(self) -> dict:
        with self.lock:
            return {"job": self.job_id, "series": [s.doc() for _, s in sorted(self.series.items())],
                    "problems": sorted(f"{key}: {why}" for key, why in self.problems.items()),
                    "skipped": self.skipped, "max_points": MAX_POINTS}


class Curves:
    """The curves of the jobs looked at last (at most MAX_JOBS of them)."""

    def __init__(self, store: SummaryStore | None):
        self.store = store
        self.jobs: OrderedDict[str, JobCurves] = OrderedDict()
        self.lock = threading.Lock()

    def of(self, job_id: str) -> JobCurves:
        with self.lock:
            curves = self.jobs.pop(job_id, None) or JobCurves(job_id)
            self.jobs[job_id] = curves
            while len(self.jobs) > MAX_JOBS:
                self.jobs.popitem(last=False)
            return curves

    def read(self, job_id: str) -> dict:
        """The job's curves, brought up to date (blocking: on a thread)."""
        curves = self.of(job_id)
        if self.store is not None:
            curves.update(self.store)
        return curves.doc()
