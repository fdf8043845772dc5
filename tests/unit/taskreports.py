"""What a Supervisor reports, as tests of the agent's task start and launcher wait for it."""

from __future__ import annotations

import threading

from tfcluster.model import Attempt
from tfcluster.states import Phase


class Reports:
    """The on_report callback: every (attempt, phase) reported, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[Attempt, str]] = []
        self.pids: list[tuple[Attempt, int]] = []  # the pid each report carried, in the same order
        self.changed = threading.Condition()

    def __call__(self, record) -> None:
        with self.changed:
            self.seen.append((record.attempt, record.phase))
            self.pids.append((record.attempt, record.pid))
            self.changed.notify_all()

    def wait_for(self, attempt: Attempt, phase: str, timeout: float = 30) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: (attempt, phase) in self.seen, timeout), self.seen

    def of(self, attempt: Attempt) -> list[str]:
        """The phases reported for this attempt."""
        with self.changed:
            return [phase for a, phase in self.seen if a == attempt]

    def ran(self, attempt: Attempt) -> list[str]:
        """The phases reported for this attempt, a task's single report of an end that carries its pid (a task
        that ended within moments of its start) read as it is meant: RUNNING, then that end."""
        phases = self.of(attempt)
        with self.changed:
            pids = [pid for a, pid in self.pids if a == attempt]
        if len(phases) == 1 and phases[0] != Phase.RUNNING and pids[0]:
            return [Phase.RUNNING, phases[0]]
        return phases
