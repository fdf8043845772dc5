"""`tfcluster doctor`'s questions out to the agents, by probe id, and their answers as they come back on the agents'
streams (Coordinator.on_agent_message); rpc/doctor.py asks and waits a bounded time."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from tfcluster.commands import Command, Probe, ProbeAnswer
from tfcluster.daemon.coordinator.rpc.watchers import until_set


@dataclass
class _Round:
    waiting: set[str]
    answers: dict[str, tuple[ProbeAnswer, float]] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Probes:
    """The probes out, by id; agents' answers land here (Coordinator.on_agent_message)."""

    def __init__(self):
        self._rounds: dict[int, _Round] = {}
        self._ids = itertools.count(1)

    def answer(self, node: str, answer: ProbeAnswer, now: float) -> None:
        round_ = self._rounds.get(answer.probe_id)
        if round_ is not None and node in round_.waiting:  # only the nodes asked, once each
            round_.waiting.discard(node)
            round_.answers[node] = (answer, now)
            if not round_.waiting:
                round_.done.set()

    async def ask(self, send: Callable[[list[Command]], None], ask: dict[str, Callable[[int], Probe]],
                  seconds: float) -> dict[str, tuple[ProbeAnswer, float]]:
        """Sends each node its probe and returns the answers that came within `seconds` (node -> answer, when)."""
        probe_id = next(self._ids)
        round_ = self._rounds[probe_id] = _Round(set(ask))
        try:
            if ask:
                send([make(probe_id) for make in ask.values()])
                await until_set(round_.done, seconds)
            return dict(round_.answers)
        finally:
            del self._rounds[probe_id]
