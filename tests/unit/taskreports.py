"""What a Supervisor reports, as tests of the agent's task start and launcher wait for it."""

from __future__ import annotations

import threading

from tfcluster.model import Attempt


class Reports:
    """The on_report callback: every (attempt, phase) reported, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[Attempt, str]] = []
        self.changed = threading.Condition()

    def __call__(self, record) -> None:
        with self.changed:
            self.seen.append((record.attempt, record.phase))
            self.changed.notify_all()

    def wait_for(self, attempt: Attempt, phase: str, timeout: float = 30) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: (attempt, phase) in self.seen, timeout), self.seen

    def of(self, attempt: Attempt) -> list[str]:
        """The phases reported for this attempt."""
        with self.changed:
            return [phase for a, phase in self.seen if a == attempt]
