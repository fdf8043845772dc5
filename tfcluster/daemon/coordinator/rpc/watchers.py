"""Clients that follow a job (`tfcluster start --wait`): each gets the job's newest status whenever it changes.

The core stays as it is: after each store write the coordinator wakes every watcher, and each watcher builds
its job's status and sends it if it differs from the last one sent. A watcher holds one flag and the last
status it sent, never a queue: one that reads slowly (or not at all) makes its own send wait, skips the states
in between, and gets the newest one next; nothing it does holds up the event loop or another watcher.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

MAX_WATCHERS = 10_000  # coroutines and last statuses: a few MB at most
# A change that reaches no store write (a waiting job's new reason alone: Job.show_waiting) is still sent this long
# after it happened.
REFRESH_SECONDS = 5.0


class TooManyWatchers(Exception):
    pass


class Watchers:
    def __init__(self, limit: int = MAX_WATCHERS, refresh_seconds: float = REFRESH_SECONDS):
        self.limit, self.refresh_seconds = limit, refresh_seconds
        self.flags: set[asyncio.Event] = set()

    def __len__(self) -> int:
        return len(self.flags)

    def changed(self) -> None:
        """Something was stored: every watcher looks at its job again."""
        for flag in self.flags:
            flag.set()

    async def follow(self, find: Callable[[], Any], view: Callable[[Any], Any],
                     ended: Callable[[Any], bool]) -> AsyncIterator[Any]:
        """view(job) now and after each change, for the job find() returns, until ended(job) (that view
        included) or until find() no longer finds it (the job was removed)."""
        if len(self.flags) >= self.limit:
            raise TooManyWatchers(f"{len(self.flags)} clients already follow jobs here; try again later")
        flag = asyncio.Event()
        self.flags.add(flag)
        try:
            last = None
            while True:
                flag.clear()
                job = find()
                if job is None:
                    return
                current, over = view(job), ended(job)  # both now: the job changes while a view is sent
                if current != last:
                    yield current
                    last = current
                if over:
                    return
                await until_set(flag, self.refresh_seconds)
        finally:
            self.flags.discard(flag)


async def until_set(flag: asyncio.Event, seconds: float) -> None:
    """Waits until flag is set or seconds have passed (a watcher's next change, a probe round's answers). Not
    asyncio.wait_for: before Python 3.12 it swallows a cancellation that comes as the flag is set, and the follower
    of a client gone then waited on (its call's place held: rpc/stream_limits.py) until the job ended."""
    waiting = asyncio.ensure_future(flag.wait())
    try:
        await asyncio.wait((waiting,), timeout=seconds)
    finally:
        waiting.cancel()
