"""How many calls that stay open each caller may hold at once: following a job (WatchJob), reading or following
a task's log (StreamLogs, and the dashboard's log view), sending code (UploadCode).

Each such call costs the coordinator for as long as it lasts, on the one event loop that also reads the agents'
heartbeats: a watcher builds its job's status after every store write, a log follow keeps a relay open through
an agent, an upload a file. One user's thousands of them stalled that loop long enough for status calls to time
out and nodes to be declared LOST, far below the global cap of watchers (rpc/watchers.py). So each caller, named by
its certificate, holds at most `per_caller` of them (--max-streams-per-caller); the next is refused at once,
before its handler runs. A call's place is given back when it ends, however it ends: it finished, it failed,
the client went away, or the server stopped.

An agent's own calls (its session stream, its code fetches) are not counted here: each agent has a connection
of its own, and gRPC bounds the calls on any one connection (listener.py). A caller without a certificate
(--insecure) is counted by its address.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from tfcluster import security
from tfcluster.daemon.coordinator.rpc.join_port import source_of
from tfcluster.pki import Identity

DEFAULT_PER_CALLER = 32  # `tfcluster start --follow` holds two; a person with a few terminals open, a dozen
FLAG = "--max-streams-per-caller"


class TooManyStreams(Exception):
    """The caller holds as many open calls as it may: why, in one line."""


class StreamLimits:
    """The open calls of each caller, counted; per_caller 0: no bound (they are still counted)."""

    def __init__(self, per_caller: int = DEFAULT_PER_CALLER):
        if per_caller < 0:
            raise ValueError(f"{FLAG}: expected 0 or more, got {per_caller}")
        self.per_caller = per_caller
        self.held: dict[str, int] = {}  # caller -> open calls; a caller with none is not kept

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
        stopped), or raises Refused."""
        who = security.caller()
        try:
            release = self.enter(caller_name(who, "" if who else source_of(context.peer() or "")))
        except TooManyStreams as e:
            raise security.Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)) from None
        context.add_done_callback(release)


def caller_name(who: Identity | None, address: str) -> str:
    """Whose count a call is in: its certificate's holder, or without one (--insecure) the address it came from."""
    return f"{who.role} {who.name!r}" if who is not None else f"the address {address}"
