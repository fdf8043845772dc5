"""The agent's session with the coordinator: registers the node, keeps one stream to the coordinator
(heartbeats and messages up, commands down), and reconnects with backoff and jitter when the coordinator is
away, without touching running tasks.

Nothing that must arrive is lost across reconnects: the registration carries every task's state (exits
included), and the owner's on_register sends again what else the coordinator must have (its hooks' results).
A coordinator that refuses the agent (bad settings, its name held by another live agent, a wrong token)
ends the session for good: retrying would not help.
"""

from __future__ import annotations

import logging
import queue
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Protocol

import grpc

from tfcluster import wire
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.daemon.agent.session.liveness import STAMP_EVERY_SECONDS, Liveness
from tfcluster.daemon.agent.session.new_leader import find_leader
from tfcluster.daemon.agent.session.pulse import HeldWatch, Pulse
from tfcluster.leaders import Coordinators, is_lease_ran_out, is_standby, leader_hint, unreachable
from tfcluster.model import NodeInfo, TaskProgress
from tfcluster.security import Credentials

log = logging.getLogger("tfcluster.agent")

BACKOFF_START_SECONDS = 0.5
# Short enough that agents are back well inside a restarted coordinator's reconnect grace.
BACKOFF_MAX_SECONDS = 2.0
REGISTER_TIMEOUT_SECONDS = 10.0
LEAVE_SECONDS = 1.0        # at most, for the word that the agent is stopping to leave on the stream
LEAVE_FLUSH_SECONDS = 0.1
# Another agent holds this node's name: wait this long for it to turn out to be this node's own old
# registration (it expires), then give up.
NAME_CONFLICT_PATIENCE_SECONDS = 20.0
# How long a coordinator that could not be reached is left alone by the pulse, its channel closed meanwhile: the
# first rest, doubled at each try that fails in a row up to the last (each jittered by half either way). One still
# starting is watched again within seconds; a crashed one costs an agent a refused TCP connect now and then.
REST_FIRST_SECONDS = 2.0
REST_SECONDS = 30.0
REFUSALS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
# The transport's own reconnect backoff would otherwise grow to two minutes during a long coordinator
# outage, and the agent would come back after its node had been declared lost.
CHANNEL_OPTIONS = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
                   ("grpc.initial_reconnect_backoff_ms", int(BACKOFF_START_SECONDS * 1000)),
                   ("grpc.max_reconnect_backoff_ms", int(BACKOFF_MAX_SECONDS * 1000))]


class Owner(Protocol):
    """What the session needs of the agent it serves."""
    credentials: Credentials  # the node's current ones: replaced when the certificate is renewed

    def node_info(self) -> NodeInfo: ...
    def task_reports(self) -> list: ...  # every task's report (wire messages), for the registration
    def progress(self) -> list[TaskProgress]: ...
    def condition(self) -> str: ...
    def health(self) -> str: ...  # the health check's failure; "": it passes, or none runs
    def conditions(self) -> tuple: ...  # what the GPU check found (tfcluster/conditions.py)
    def on_register(self) -> None: ...
    def handle(self, message: agent_pb2.CoordinatorMessage) -> None: ...


class Session:
    def __init__(self, coordinator: str, owner: Owner, stopped: threading.Event, liveness: Liveness,
                 on_refused: Callable[[str], None]):
        self.coordinators = Coordinators(coordinator)  # one or several: the leader among them is followed
        self.owner = owner
        self.stopped = stopped  # set when the agent stops
        self.liveness = liveness
        self.on_refused = on_refused
        self.outbound: queue.Queue = queue.Queue()  # messages for the stream
        self.connected = threading.Event()
        self.registered = threading.Event()  # set at the first registration, for systemd's READY=1
        self.trouble = ""  # why the last try to reach the coordinator failed, until one succeeds
        self.refused = ""  # why the coordinator refused this agent, once it has
        self._call = None
        self._renewed = threading.Event()  # the stream was ended to reconnect with a renewed certificate
        self._stalled = threading.Event()  # the stream was ended: its coordinator no longer leads
        self._stalled_by: grpc.RpcError | None = None  # the answer that said so (a standby's names the leader)
        self._left = ""  # the coordinator this session last left because it no longer led
        self._kept: dict[str, HeldWatch] = {}  # the watches the last stream's pulse held, for a search (pulse.end)
        self.channels = Channels(owner)  # one kept channel to each coordinator: the session's and the pulse's
        self.interval = 1.0  # seconds between heartbeats: as the registration, or a later Pace, says

    @property
    def coordinator(self) -> str:
        """The address of the coordinator this session talks to (the leader, as far as it knows)."""
        return self.coordinators.current

    def send(self, message: agent_pb2.AgentMessage) -> None:
        self.outbound.put(message)

    def run(self) -> None:
        """Registers and serves the stream until the agent stops or is refused; reconnects with backoff."""
        backoff, conflict_since, followed = BACKOFF_START_SECONDS, 0.0, 0  # followed: failures in a row
        while not self.stopped.is_set():
            self.liveness.stamp("connection")
            try:
                self._serve(self.channels.get(self.coordinator))
                backoff, conflict_since, followed = BACKOFF_START_SECONDS, 0.0, 0
            except grpc.RpcError as e:
                if self.stopped.is_set():
                    break
                code = e.code() if hasattr(e, "code") else None
                stalled = code == grpc.StatusCode.CANCELLED and self._stalled.is_set()
                if stalled:
                    self._stalled.clear()
                    code = grpc.StatusCode.UNAVAILABLE  # as if its connection had dropped: the next one,
                    e = self._stalled_by or e  # or the leader a standby named
                if code == grpc.StatusCode.CANCELLED and self._renewed.is_set():
                    self._renewed.clear()  # not a failure: the stream ended to start again with the new
                    backoff = BACKOFF_START_SECONDS  # certificate, at once (the node must not go LOST)
                    continue
                if code == grpc.StatusCode.ALREADY_EXISTS:
                    conflict_since = conflict_since or time.monotonic()
                if code in REFUSALS or (conflict_since and
                                        time.monotonic() - conflict_since > NAME_CONFLICT_PATIENCE_SECONDS):
                    self.refused = e.details() or code.name
                    log.error("the coordinator refused this agent: %s", self.refused)
                    self.on_refused(self.refused)
                    break
                why = "no longer leads" if stalled else e.details() if code == grpc.StatusCode.ALREADY_EXISTS or \
                    is_standby(e) or is_lease_ran_out(e) else f"unreachable ({code.name if code else e})"
                self.trouble = f"coordinator {self.coordinator}: {why}"
                hinted = bool(leader_hint(e))
                followed = 1 if self.connected.is_set() else followed + 1  # a stream that served: anew
                if not stalled and unreachable(e) and self.coordinators.several:
                    self.channels.rest(self.coordinator)  # the next stream's pulse leaves it alone a while
                    if followed == 1 and self._go_to_named_leader():
                        backoff = BACKOFF_START_SECONDS
                        continue
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and \
                        self.coordinators.failed(e):  # another coordinator may lead
                    log.warning("%s; trying the coordinator at %s", self.trouble, self.coordinator)
                    backoff = BACKOFF_START_SECONDS
                    if hinted and followed == 1:  # the leader a standby named: asked at once
                        continue
                else:
                    log.warning("coordinator %s: %s; retrying in %.1f s", self.coordinator, why, backoff)
            finally:
                self.connected.clear()
                self._drop_kept()
            if self.stopped.wait(backoff * random.uniform(0.5, 1.5)):
                break
            backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)
        self.channels.close()

    def _go_to_named_leader(self) -> bool:
        """The coordinator could not be reached: whether the others named the leader, now the one to try
        (new_leader.py). Once per loss, so that coordinators naming each other cannot keep the agent from its
        backoff."""
        others = [a for a in self.coordinators.addresses if a != self.coordinator]
        kept, self._kept = self._kept, {}
        leader = find_leader(self.coordinator, others, self.channels, self.stopped, kept)
        if leader:
            log.warning("%s; the leader is at %s", self.trouble, leader)
            self.coordinators.follow(leader)
        return bool(leader)

    def _drop_kept(self) -> None:
        """The watches the last stream's pulse held, not needed by a search: cancelled."""
        kept, self._kept = self._kept, {}
        for held in kept.values():
            held.cancel()

    def reconnect(self) -> None:
        """Ends the stream so that the session starts again at once (with a renewed certificate)."""
        call = self._call
        if call is not None:
            self._renewed.set()
            call.cancel()

    def leave(self, wait: float = LEAVE_SECONDS) -> None:
        """Says the agent is going away with its tasks left running (node_events.py gives them the grace of an
        announced restart), and gives the stream up to `wait` to carry it before the caller ends it."""
        if self._call is None or not self.connected.is_set():
            return
        self.send(agent_pb2.AgentMessage(leaving=agent_pb2.Leaving()))
        deadline = time.monotonic() + wait
        while not self.outbound.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(min(LEAVE_FLUSH_SECONDS, max(0.0, deadline - time.monotonic())))  # taken; now onto the wire

    def cancel(self) -> None:
        call = self._call
        if call is not None:
            call.cancel()

    def _serve(self, channel: grpc.Channel) -> None:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        # What was queued for the old stream is covered by the registration and what follows it.
        while not self.outbound.empty():
            self.outbound.get_nowait()
        info = self.owner.node_info()
        reply = stub.Register(agent_pb2.RegisterRequest(node=wire.node_info_to_proto(info),
                                                        tasks=self.owner.task_reports(),
                                                        health_failure=self.owner.health(),
                                                        conditions=wire.conditions_to_proto(self.owner.conditions())),
                              timeout=REGISTER_TIMEOUT_SECONDS)
        self.owner.on_register()
        log.info("registered with %s as %s (%s)", self.coordinator, info.name, info.address)
        self.trouble = ""
        self.registered.set()
        self.interval = reply.heartbeat_interval_seconds or 1.0
        self._call = stub.Connect(self._messages(info.name, reply.session_id))
        self.connected.set()
        pulse = self._start_pulse() if self.coordinators.several else None
        try:
            for message in self._call:
                self.owner.handle(message)
        finally:
            self.outbound.put(_END)
            self._call = None
            if pulse is not None:
                self._kept = pulse.end()

    def set_pace(self, interval: float) -> None:
        """The coordinator stretched the heartbeats (its cluster grew past its bound): from the next one on."""
        self.interval = interval

    def _start_pulse(self) -> Pulse:
        """With several coordinators: watches the others for the moment this one no longer leads (pulse.py)."""
        call, current = self._call, self.coordinator

        def stalled(answer) -> None:
            self._stalled_by, self._left = answer, current
            self._stalled.set()
            call.cancel()
        others = [a for a in self.coordinators.addresses if a != current]
        return Pulse(current, others, self.channels, lambda: self.interval, stalled, self._left).start()

    def _heartbeat(self, session_id: str) -> agent_pb2.AgentMessage:
        owner = self.owner
        return wire.heartbeat_to_proto(session_id, owner.progress(), owner.condition(), owner.health(),
                                       owner.conditions())

    def _messages(self, node_name: str, session_id: str):
        """The stream up: its opening, then heartbeats every self.interval and queued messages as they come."""
        yield agent_pb2.AgentMessage(open=agent_pb2.StreamOpen(node_name=node_name, session_id=session_id))
        yield self._heartbeat(session_id)
        next_beat = time.monotonic() + self.interval
        while not self.stopped.is_set():
            self.liveness.stamp("connection")
            wait = min(STAMP_EVERY_SECONDS, max(0.0, next_beat - time.monotonic()))
            try:
                item = self.outbound.get(timeout=wait)
            except queue.Empty:
                item = None
            if item is _END:
                return
            if item is not None:
                yield item
            if time.monotonic() >= next_beat:
                yield self._heartbeat(session_id)
                next_beat = time.monotonic() + self.interval


class Channels:
    """One channel to each coordinator, kept: the session's calls and the pulse's watches and health checks go over
    the connection already open, not a TLS handshake each time. With several coordinators the pulse keeps one open
    to each standby (a watch on each); when that standby wins, the agent registers with it over the same
    connection (the new leader serves on the server that refused a moment before:
    tfcluster/daemon/coordinator/rpc/listener.py); thousands of agents moving at once no longer make thousands of
    handshakes (docs/ha.md). A channel made with credentials since replaced (the certificate was renewed) is made
    again. A coordinator that could not be reached rests: its channel is closed, as gRPC redials a channel on which
    a call failed every BACKOFF_MAX_SECONDS for as long as it lives (its client idle timeout works only once:
    grpc/grpc#38454), and the pulse leaves it alone until the rest is over, then asks for a TCP connection
    before it makes a channel again."""

    def __init__(self, owner: Owner):
        self.owner = owner
        self.lock = threading.Lock()
        self.channels: dict[str, tuple[Credentials, grpc.Channel]] = {}
        self.resting_until: dict[str, float] = {}  # address -> monotonic time
        self.failed_tries: dict[str, int] = {}  # address -> tries that could not reach it, in a row

    def get(self, address: str) -> grpc.Channel:
        credentials = self.owner.credentials
        with self.lock:
            kept = self.channels.get(address)
            if kept is None or kept[0] is not credentials:
                if kept is not None:
                    kept[1].close()
                kept = self.channels[address] = (credentials, credentials.channel(address, CHANNEL_OPTIONS))
            return kept[1]

    def rest(self, address: str) -> None:
        """The coordinator at address could not be reached: closes its channel, and starts its rest."""
        with self.lock:
            kept = self.channels.pop(address, None)
            tries = self.failed_tries[address] = self.failed_tries.get(address, 0) + 1
            rest = min(REST_SECONDS, REST_FIRST_SECONDS * 2 ** min(tries - 1, 16)) * random.uniform(0.5, 1.5)
            self.resting_until[address] = time.monotonic() + rest
        if kept is not None:
            kept[1].close()

    def rest_left(self, address: str) -> float:
        """Seconds until the coordinator at address has rested; 0 when it is not resting."""
        with self.lock:
            return max(0.0, self.resting_until.get(address, 0.0) - time.monotonic())

    def reachable(self, address: str, timeout: float) -> bool:
        """After its rest, whether the coordinator at address takes a TCP connection, before a channel is made for
        it again (a TLS context and gRPC's connection machinery, which cost the agent's host far more than a
        refused connect); rests it again when not."""
        with self.lock:
            if address not in self.resting_until:
                return True
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
        except (OSError, ValueError):
            self.rest(address)
            return False
        with self.lock:
            self.resting_until.pop(address, None)  # its tries in a row count on until it answers (reached)
        return True

    def reached(self, address: str) -> None:
        """The coordinator at address answered: its next failure rests it for the first rest again."""
        with self.lock:
            self.failed_tries.pop(address, None)

    def close(self) -> None:
        with self.lock:
            for _, channel in self.channels.values():
                channel.close()
            self.channels.clear()


_END = object()
