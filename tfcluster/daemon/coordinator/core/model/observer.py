"""What the coordinator tells its metrics as things happen. The core calls it; by default nothing listens.

Counts and durations that only exist at the moment something happens (a restart and its cause, how long a job
waited to be placed, how long a store write took) cannot be read off the model later, so the core reports
them here. The Prometheus side (metrics.py) is one implementation; tests can record the calls.
"""

from __future__ import annotations

from tfcluster.daemon.coordinator.core.model.job import Job


class Observer:
    def placed(self, job: Job, waited_seconds: float) -> None:
        """A job was placed, having waited this long since it was submitted or may restart."""

    def started(self, job: Job, waited_seconds: float) -> None:
        """A job ran for the first time (every task up), this long after it was submitted."""

    def restarted(self, job: Job, cause: str) -> None:
        """A job restarted (all of it, some tasks, or its evaluator) for one of restart.CAUSES."""

    def ended(self, job: Job) -> None:
        """A job ended (job.state, job.created and job.finished say how and when)."""

    def stored(self, seconds: float, ok: bool) -> None:
        """A batch of changes was written to the store (or the write failed)."""
