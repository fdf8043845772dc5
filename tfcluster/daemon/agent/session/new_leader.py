"""With several coordinators, where an agent goes when the one it followed can no longer be reached.

Asking the next address in its list with a registration sent every agent of a failover through a standby first: at
5,000 agents most of them asked the standby that lost the election, whose refusal naming the new leader came back
seconds later, in the middle of the storm (docs/ha.md). The standbys tell sooner, and over the connections the agent
keeps open to them (session.Channels): a watch of the health check naming the coordinator the agent followed is held
while a standby names that one the leader, and refused naming the new leader once it reads another; a watch naming
none is held until one leads (tfcluster/daemon/coordinator/ha/standby.py). So the agent watches every other
coordinator at once and registers with the first leader they name, or with the one that answers the watch itself
(it leads): one registration per agent, sent the moment a standby knows. The first watch on a standby is the one the
stream's pulse held there, naming the coordinator left (pulse.HeldWatch): kept open, not cancelled and opened again.

The search is bounded. Standbys that still name the coordinator the agent left after STILL_NAMED_SECONDS say that it
still leads (the agent's connection broke, not the coordinator), and none answers after SEARCH_SECONDS: either way,
or with no other coordinator to ask, the agent goes back to trying the addresses in turn (leaders.Coordinators).
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tfcluster.daemon.agent.session.pulse import PULSE_SECONDS, PULSE_TIMEOUT_SECONDS, Answer, Channels, HeldWatch, \
    heard
from tfcluster.leaders import is_standby, leader_hint, unreachable

SEARCH_SECONDS = 10.0  # at most, for the others to name a leader
# Twice the leader lease (tfcluster/daemon/coordinator/ha/leadership.py): by then a standby has read that the leader
# it names is gone, if it is.
STILL_NAMED_SECONDS = 4.0
_STILL_NAMED = object()  # a held watch that was not answered in STILL_NAMED_SECONDS


def find_leader(left: str, others: list[str], channels: Channels, stopped: threading.Event,
                kept: dict[str, HeldWatch] | None = None) -> str:
    """The address of the leader the coordinators at others name (or of one that leads) now that the one at left
    could not be reached; "" when none does in time, or the agent stops. kept: the watches naming left that the
    stream's pulse held, by address (Pulse.end); read here, and cancelled by the time this returns."""
    return _Search(left, channels).run([a for a in others if not channels.rest_left(a)], stopped, kept or {})


class _Search:
    def __init__(self, left: str, channels: Channels):
        self.left, self.channels = left, channels
        self.over = threading.Event()
        self._named: queue.Queue = queue.Queue()  # one address ("" for none) from each coordinator asked
        self._lock = threading.Lock()
        self._open: set = set()  # the watches under way

    def run(self, asked: list[str], stopped: threading.Event, kept: dict[str, HeldWatch]) -> str:
        deadline = time.monotonic() + SEARCH_SECONDS
        for held in kept.values():
            self._open.add(held.call)
        for address in asked:
            threading.Thread(target=self._ask, args=(address, deadline, kept.get(address)), name="leader-search",
                             daemon=True).start()
        leader, pending = "", len(asked)
        while pending and not leader and not stopped.is_set():
            try:
                leader = self._named.get(timeout=0.1)
                pending -= 1
            except queue.Empty:
                pass
        with self._lock:
            self.over.set()
            for call in self._open:
                call.cancel()
        return leader

    def _ask(self, address: str, deadline: float, kept: HeldWatch | None) -> None:
        named = ""
        try:
            named = self._named_by(address, deadline, kept)
        finally:
            self._named.put(named)

    def _named_by(self, address: str, deadline: float, kept: HeldWatch | None) -> str:
        """The leader the coordinator at address names, once it names one other than left; itself if it leads.
        kept: the pulse's watch there, naming left, whose answer is the first one read."""
        service, asked_since = self.left, time.monotonic()
        while not self.over.is_set():
            until = deadline if not service else min(deadline, asked_since + STILL_NAMED_SECONDS)
            if kept is not None:
                answer, kept = self._answer_of(kept, until - time.monotonic()), None
                if answer is _STILL_NAMED:
                    return ""  # it named left all along: as far as it knows, left leads still
            elif time.monotonic() >= until or not self.channels.reachable(address, PULSE_TIMEOUT_SECONDS):
                return ""
            else:
                answer = self._watch(address, service, until - time.monotonic())
            if answer is None:
                return address  # it answers the watch: it leads
            if unreachable(answer):
                self.channels.rest(address)
                return ""
            self.channels.reached(address)
            named = leader_hint(answer)
            if named and (named != self.left or not service):  # left, named after none led: it won again
                return named
            if is_standby(answer) and not named:
                service = ""  # an election is under way: the next watch is held until someone leads
            elif answer.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return ""  # it named left all along: as far as it knows, left leads still
            elif self.over.wait(PULSE_SECONDS):  # a coordinator before 0.8.1 refuses a watch at once, naming left
                return ""
        return ""

    def _answer_of(self, held: HeldWatch, timeout: float):
        """The held watch's answer, or _STILL_NAMED after timeout (the watch is then cancelled)."""
        try:
            return held.answer.result(max(0.0, timeout))
        except concurrent.futures.TimeoutError:
            held.cancel()
            return _STILL_NAMED

    def _watch(self, address: str, service: str, timeout: float) -> Answer:
        call = health_pb2_grpc.HealthStub(self.channels.get(address)).Watch(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        with self._lock:
            if self.over.is_set():
                call.cancel()
            self._open.add(call)
        try:
            return heard(call)
        finally:
            call.cancel()
            with self._lock:
                self._open.discard(call)
