"""With several coordinators, how an agent finds out that the one serving its stream no longer leads.

One that is paused or cut off keeps the connection open, and the stream would wait on it for as long (gRPC's
keepalive pings do not fire while the agent keeps sending). So the agent watches every other coordinator: it
opens the health check's Watch on each, naming the coordinator it follows, and a standby keeps that call open,
saying nothing and costing nothing, while it names the same leader; when the leader it knows changes, it refuses
the call naming the new one (tfcluster/daemon/coordinator/ha/standby.py). The agent then ends its stream and
goes to that leader at once, well inside the reconnect grace. Every other coordinator is watched at once, so the
agent keeps a connection to each, and whichever wins serves it over that connection (docs/ha.md).

A watch that ends without telling (the coordinator no longer answers, names no leader while an election is
under way, or serves too) is answered by another standby holding a watch, which names the same leader for as
long as it holds it. Without one, the others are asked with the health check. The coordinator serving the stream
is asked only when none of them tells on its own and, together, they say it no longer leads (one serves, or a
standby names another leader or none: leaders.leads_elsewhere): it is then left if it gives no answer in time.
So a leader merely behind (thousands of agents registering) is not given a call per agent per pulse on top of its
load, and is kept; nor is a leader whose only standby is down (its watch fails at once, every pulse). A watch is
opened again a pulse after the last one opened (PULSE_SECONDS, or the heartbeat interval once the coordinator
stretched that): a coordinator before 0.8.1 refuses a watch at once, as any call, and is then asked every pulse,
as agents before 0.8.1 asked it.

A coordinator that could not be reached (the leader just killed, a standby down) tells nothing, and rests: its
channel is closed, it is neither watched nor asked for a rest that doubles at each failed try up to
session.REST_SECONDS, and after that only once it takes a TCP connection again (session.Channels). Watched every
pulse, a dead leader cost 5,000 agents sharing a 2-core host most of it after a failover, in gRPC's redials of
those channels (docs/ha.md, Limits).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tfcluster.leaders import leader_hint, leads_elsewhere, says_of, unreachable

log = logging.getLogger("tfcluster.agent")

PULSE_SECONDS = 2.0          # the least time between two watches (or checks) of one coordinator
PULSE_TIMEOUT_SECONDS = 3.0  # how long a coordinator asked with the health check has to answer

Answer = grpc.RpcError | None  # a coordinator's answer: None when it serves, else its refusal or error


def heard(watch) -> Answer:
    """What a watch of the health check says once it ends: None when its coordinator serves (a leader answers at
    once), else its refusal, its error, or the call itself when it ended without a word (no answer)."""
    try:
        for _ in watch:
            return None
        return watch
    except grpc.RpcError as e:
        return e


class HeldWatch:
    """A watch a standby holds, naming the coordinator the agent follows: its call, and its answer once it ends (set by
    the pulse's thread that reads it). The pulse hands those still held over when its stream ends (Pulse.end): where
    that coordinator could not be reached, the search for the new leader reads their answers (new_leader.py) instead
    of cancelling them and opening the same watches again: two calls fewer per standby and agent at a failover."""

    def __init__(self, call):
        self.call = call
        self.answer: concurrent.futures.Future = concurrent.futures.Future()

    def cancel(self) -> None:
        self.call.cancel()


class Channels(Protocol):
    """The agent's kept channels (session.Channels)."""

    def get(self, address: str) -> grpc.Channel: ...

    def rest(self, address: str) -> None: ...

    def rest_left(self, address: str) -> float: ...

    def reachable(self, address: str, timeout: float) -> bool: ...

    def reached(self, address: str) -> None: ...


class Pulse:
    """The pulse of one session stream, ended with it (which cancels its open watches). `channels.get(address)`
    gives the agent's kept channel to a coordinator; `interval()` the heartbeat interval now; `on_stalled(answer)` is
    called once, with the answer that told, when the coordinator at `current` no longer leads. `left`: the
    coordinator the agent last left because it no longer led. A coordinator that could not be reached is neither
    watched nor asked until its rest is over (session.Channels.rest)."""

    def __init__(self, current: str, others: list[str], channels: Channels,
                 interval: Callable[[], float], on_stalled: Callable[[Answer], None], left: str = ""):
        self.current, self.others, self.left = current, others, left
        self.channels, self.interval, self.on_stalled = channels, interval, on_stalled
        self.ended = threading.Event()
        self._answers: queue.Queue = queue.Queue()  # (address, answer) as each watch ends; None: ended
        self._lock = threading.Lock()
        self._open: set = set()  # the watches under way
        self._held: dict[str, HeldWatch] = {}  # by the coordinators holding them: standbys that name current

    def start(self) -> "Pulse":
        for address in self.others:
            threading.Thread(target=self._keep_watching, args=(address,), name="coordinator-watch",
                             daemon=True).start()
        threading.Thread(target=self._judge, name="coordinator-pulse", daemon=True).start()
        return self

    def end(self) -> dict[str, HeldWatch]:
        """Ends the pulse: cancels its open watches but those a standby holds, which it returns by address. The
        caller hands them to the search for the new leader, or cancels them."""
        with self._lock:
            self.ended.set()
            kept = dict(self._held)
            for call in self._open - {held.call for held in kept.values()}:
                call.cancel()
        self._answers.put(None)
        return kept

    def _keep_watching(self, address: str) -> None:
        """One watch open on the coordinator at address at a time; the answer each ends with goes to _judge.
        The first opens within a pulse, not at once: thousands of agents registering with a new leader together
        would otherwise open theirs together too, in the middle of that storm."""
        if self.ended.wait(random.uniform(0, max(PULSE_SECONDS, self.interval()))):
            return
        while not self.ended.is_set():
            if self.ended.wait(self.channels.rest_left(address)):
                return
            if not self.channels.reachable(address, PULSE_TIMEOUT_SECONDS):
                continue  # resting again: a refusal to connect tells nothing of the leader
            opened = time.monotonic()
            answer = self._watch(address)
            if self.ended.is_set():
                return
            if unreachable(answer):
                self.channels.rest(address)
            else:
                self.channels.reached(address)
            self._answers.put((address, answer))
            if self.ended.wait(max(0.0, max(PULSE_SECONDS, self.interval()) - (time.monotonic() - opened))):
                return

    def _watch(self, address: str) -> Answer:
        """Open until the coordinator at address says something: its refusal (or error, or the call's end
        without a word), or None when it serves (a leader answers a watch at once)."""
        call = health_pb2_grpc.HealthStub(self.channels.get(address)).Watch(
            health_pb2.HealthCheckRequest(service=self.current))
        with self._lock:
            if self.ended.is_set():
                call.cancel()
                return call
            self._open.add(call)
        held = None
        try:
            call.initial_metadata()  # a standby sends its headers once it holds the watch (this waits, never raises)
            with self._lock:
                if call.is_active() and not self.ended.is_set():
                    held = self._held[address] = HeldWatch(call)
            answer = heard(call)
            if held is not None:
                held.answer.set_result(answer)
            return answer
        finally:
            call.cancel()  # a no-op once it ended; ends one left open by an error
            with self._lock:
                self._open.discard(call)
                if held is not None and self._held.get(address) is held:
                    del self._held[address]

    def _judge(self) -> None:
        """Hears each watch's answer; leaves the coordinator once one says (or, asked around, all say) that it
        no longer leads."""
        while True:
            heard = self._answers.get()
            if heard is None or self.ended.is_set():
                return
            address, answer = heard
            verdict = self._says(answer)
            with self._lock:  # the watching threads change the set
                held_elsewhere = bool(set(self._held) - {address})
            if verdict is None and held_elsewhere:
                verdict = True  # another standby holds a watch: it names current, and will tell when that changes
            if verdict is None:
                verdict = self._ask_around(address, answer)
            if verdict or self.ended.is_set():
                continue
            log.warning("the coordinator at %s no longer leads (paused or cut off?); trying another", self.current)
            self.on_stalled(answer)
            return

    def _says(self, answer: Answer) -> bool | None:
        """What another coordinator's answer says of current on its own (leaders.says_of), but for old news:
        the standbys read the leader key in turn, and one that has not read it since the agent moved still names
        the leader the agent left. The others tell."""
        verdict = says_of(self.current, answer)
        return None if verdict is False and leader_hint(answer) == self.left else verdict

    def _ask_around(self, watched: str, answer: Answer) -> bool:
        """Whether the coordinator at current still leads, when the watched one's answer did not tell: the others
        are asked, and current itself only when they say, together, that another leads or none does."""
        answers = [answer]
        for address in self.others:
            if address != watched and not self.channels.rest_left(address) and \
                    self.channels.reachable(address, PULSE_TIMEOUT_SECONDS):
                answers.append(self._check(address))
                if unreachable(answers[-1]):
                    self.channels.rest(address)
                verdict = self._says(answers[-1])
                if verdict is not None:
                    return verdict
        if not leads_elsewhere(self.current, answers):
            # Current is kept whatever it would answer: asking it anyway gave a leader a health check per agent per
            # pulse for as long as its only standby was down.
            return True
        own = self._check(self.current)
        return own is None or own.code() != grpc.StatusCode.DEADLINE_EXCEEDED  # else it gave no pulse in time

    def _check(self, address: str) -> Answer:
        try:
            health_pb2_grpc.HealthStub(self.channels.get(address)).Check(health_pb2.HealthCheckRequest(),
                                                                         timeout=PULSE_TIMEOUT_SECONDS)
            return None
        except grpc.RpcError as e:
            return e
