"""How many calls that stay open each caller may hold at once: following a job (WatchJob), reading or following
a task's log (StreamLogs, and the dashboard's log view), sending code (UploadCode).

Each such call costs the coordinator for as long as it lasts, on the one event loop that also reads the agents'
heartbeats: a watcher builds its job's status after every store write, a log follow keeps a relay open through
an agent, an upload a file. One user's thousands of them stalled that loop long enough for status calls to time
out and nodes to be declared LOST, far below the global cap of watchers (rpc/watchers.py). So each caller, named by
its certificate, holds at most `per_caller` of them (--max-streams-per-caller); the next is refused before its
handler runs. A call's place is given back when it ends, however it ends: it finished, it failed, the client
went away, or the server stopped.

A refusal is cheap but not free: gRPC's own handling of a call costs the event loop about 0.3 ms before anything
knows who made it, and a call waits behind those gRPC took in before it. A caller answered at once gets its
connection's place back at once and sends the next call, so thousands of refusals spread over many connections
kept everyone else's calls waiting for hundreds of milliseconds. So a caller's refusals are paced (RefusalPace):
one comes back at once, the next ones are held, each in the place on its connection that it takes, and answered
no more than REFUSALS_PER_SECOND a second; a caller whose MOST_HELD refusals are all held gets the next one at
once. A caller within its share is never held.

An agent's own calls (its session stream, its code fetches) are not counted here: each agent has a connection
of its own, and gRPC bounds the calls on any one connection (listener.py). A caller without a certificate
(--insecure) is counted by its address.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import grpc

from tfcluster import security
from tfcluster.daemon.coordinator.rpc.join_port import source_of
from tfcluster.pki import Identity

DEFAULT_PER_CALLER = 32  # `tfcluster start --follow` holds two; a person with a few terminals open, a dozen
FLAG = "--max-streams-per-caller"
# About 0.35 ms of the event loop each: 200 a second cost it 7 %, whatever the caller spreads them over.
REFUSALS_PER_SECOND = 200.0
# Refusals one caller may have held at once: every place on 16 connections (listener.STREAMS_PER_CONNECTION
# each), a few kilobytes each. Past it a refusal is answered at once: holding all the places of 64 connections
# left 4,000 calls open at once in one run of bench/streams.py, and gRPC cancelled some of the admin's calls.
MOST_HELD = 16 * 2 * DEFAULT_PER_CALLER


class TooManyStreams(Exception):
    """The caller holds as many open calls as it may: why, in one line."""


class RefusalPace:
    """When each caller's next refusal may be answered (time passed in): one at once, then no more than `rate` a
    second; the ones that must wait are held, at most `most_held` of each caller at once."""

    def __init__(self, rate: float = REFUSALS_PER_SECOND, most_held: int = MOST_HELD):
        self.interval, self.most_held = 1.0 / rate, most_held
        self.next_at: dict[str, float] = {}  # caller -> when its next refusal may be answered
        self.held: dict[str, int] = {}  # caller -> refusals held now; a caller with none is not kept

    def hold(self, caller: str, now: float) -> float:
        """How long to hold caller's refusal made now before answering it (0: at once). A refusal held (more
        than 0) must be given back with release(caller) once answered or cancelled."""
        if len(self.next_at) > 4 * self.most_held:  # callers gone quiet are forgotten
            self.next_at = {c: at for c, at in self.next_at.items() if at > now or c in self.held}
        at = max(now, self.next_at.get(caller, now))
        held = self.held.get(caller, 0)
        if at == now:  # the caller's first refusal in a while
            self.next_at[caller] = now + self.interval
            return 0.0
        if held >= self.most_held:  # answered at once, and the pace stays where it was
            return 0.0
        self.next_at[caller] = at + self.interval
        self.held[caller] = held + 1
        return at - now

    def release(self, caller: str) -> None:
        left = self.held.pop(caller) - 1
        if left:
            self.held[caller] = left


class StreamLimits:
    """The open calls of each caller, counted; per_caller 0: no bound (they are still counted). Refusals are
    paced by pace."""

    def __init__(self, per_caller: int = DEFAULT_PER_CALLER, pace: RefusalPace | None = None):
        if per_caller < 0:
            raise ValueError(f"{FLAG}: expected 0 or more, got {per_caller}")
        self.per_caller = per_caller
        self.held: dict[str, int] = {}  # caller -> open calls; a caller with none is not kept
        self.pace = pace or RefusalPace()

    def enter(self, caller: str) -> Callable[..., None]:
        """Counts one more open call of caller and returns what gives its place back (any number of times, with
        any arguments: a call's done callback passes its context); raises TooManyStreams once it holds its share."""
        held = self.held.get(caller, 0)
        if self.per_caller and held >= self.per_caller:
            raise TooManyStreams(f"{caller} already holds {held} open streams (following jobs or logs, sending "
                                 f"code), the most one caller may ({FLAG} {self.per_caller}): end one and retry")
        self.held[caller] = held + 1
        released = False

        def release(*_) -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self.held.pop(caller) - 1
            if left:
                self.held[caller] = left
        return release

    def admit(self, context) -> None:
        """The guard's hook for the calls in security.LONG_LIVED, once the caller is known: counts the call until
        gRPC is done with it (its done callback runs whether it ended, failed, was cancelled or the server
        stopped), or raises Refused, held as the pace says."""
        who = security.caller()
        name = caller_name(who, "" if who else source_of(context.peer() or ""))
        try:
            release = self.enter(name)
        except TooManyStreams as e:
            raise security.Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e),
                                   delay=self._held(name, self.pace.hold(name, time.monotonic()))) from None
        context.add_done_callback(release)

    def _held(self, caller: str, seconds: float) -> Callable[[], Awaitable[None]] | None:
        if not seconds:
            return None

        async def held() -> None:
            try:
                await asyncio.sleep(seconds)
            finally:  # answered, or cancelled: the client went away, its deadline passed, the server stopped
                self.pace.release(caller)
        return held


def caller_name(who: Identity | None, address: str) -> str:
    """Whose count a call is in: its certificate's holder, or without one (--insecure) the address it came from."""
    return f"{who.role} {who.name!r}" if who is not None else f"the address {address}"
