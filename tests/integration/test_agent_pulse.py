"""An agent given several coordinators watches another one for the moment the one serving its stream no longer
leads (a standby keeps the watch open while it names that leader, and refuses it naming the new one), so a leader
that is merely behind is not given a call per agent per pulse on top of its load, nor the standbys a health check
per agent per pulse. It asks its own coordinator only when no other can tell, and leaves it as soon as a standby
names another leader. Real gRPC over mutual TLS: a stand-in leader that counts the health checks it is sent, and a
real standby refusal server (tfcluster/daemon/coordinator/ha/standby.py) whose named leader the test changes."""

from __future__ import annotations

import asyncio
import datetime
import socket
import struct
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fleet import IdleOwner
from harness import free_port, wait_until
from tfcluster import pki
from tfcluster.leaders import leader_hint
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.credentials import Credentials
from tfcluster.daemon.agent.session import new_leader
from tfcluster.daemon.agent.session import pulse as pulse_module
from tfcluster.daemon.agent.session import session as session_module
from tfcluster.daemon.agent.session.liveness import Liveness
from tfcluster.daemon.agent.session.session import Session
from tfcluster.daemon.coordinator.ha.standby import WATCH_METHOD, WATCHES_PER_CALLER, Refusal
from tfcluster.daemon.coordinator.rpc.listener import Listener

PULSE = 0.2  # seconds between pulses in these tests (2 s in an agent)


class Leader(agent_pb2_grpc.AgentServiceServicer, health.HealthServicer):
    """Registers the agent, keeps its stream open, and counts the health checks it is sent."""

    def __init__(self):
        super().__init__()
        self.checks = 0
        self.checked_at: list[float] = []
        self.registrations = 0
        self.registered_at: list[float] = []
        self.streaming = threading.Event()  # set while the agent's stream is open

    def Register(self, request, context):
        self.registrations += 1
        self.registered_at.append(time.monotonic())
        return agent_pb2.RegisterResponse(session_id="s1", heartbeat_interval_seconds=PULSE)

    def Connect(self, request_iterator, context):
        self.streaming.set()
        try:
            for _ in request_iterator:
                pass
        finally:
            self.streaming.clear()
        return iter(())

    def Check(self, request, context):
        self.checks += 1
        self.checked_at.append(time.monotonic())
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


class CountingRefusal(Refusal):
    """The standby's refusals, counting the calls it is given by method."""

    def __init__(self, leader):
        super().__init__(leader)
        self.calls: Counter[str] = Counter()

    def service(self, handler_call_details):
        self.calls[handler_call_details.method] += 1
        return super().service(handler_call_details)


class Standby:
    """The real refusal server, on an event loop of its own, naming whichever leader `named` holds."""

    def __init__(self, listen: str, credentials):
        self.named, self.address = "", listen
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

        self.refusal = CountingRefusal(lambda: self.named)

        async def start() -> grpc.aio.Server:  # made on its loop, as gRPC's aio servers must be
            server = Listener(listen, credentials, self.refusal).server
            await server.start()
            return server
        self.server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)

    def stop(self) -> None:
        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            wait_until(lambda: not self.loop.is_running(), 10, what="the standby's loop to stop")


def serve_leader(address: str, credentials) -> tuple[Leader, grpc.Server]:
    leader = Leader()
    server = grpc.server(ThreadPoolExecutor(max_workers=8))
    agent_pb2_grpc.add_AgentServiceServicer_to_server(leader, server)
    health_pb2_grpc.add_HealthServicer_to_server(leader, server)
    server.add_secure_port(address, credentials)
    server.start()
    return leader, server


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A leader and two standbys naming it, over TLS, and an agent's session given all three (a standby first)."""
    monkeypatch.setattr(pulse_module, "PULSE_SECONDS", PULSE)
    pki.init_ca(tmp_path / "ca", ["127.0.0.1"])
    server_credentials = Credentials.from_dir(tmp_path / "ca", pki.SERVER_CERT, pki.SERVER_KEY).server()
    leader_address = f"127.0.0.1:{free_port()}"
    leader, server = serve_leader(leader_address, server_credentials)
    leader.server = server  # for the tests that kill it
    standbys = [Standby(f"127.0.0.1:{free_port()}", server_credentials) for _ in range(2)]
    for standby in standbys:
        standby.named = leader_address
    stopped = threading.Event()
    addresses = f"{standbys[0].address},{leader_address},{standbys[1].address}"
    session = Session(addresses, IdleOwner(Credentials.from_dir(tmp_path / "ca" / "admin")),
                      stopped, Liveness(["connection"]), on_refused=lambda why: None)
    running = threading.Thread(target=session.run, daemon=True)
    running.start()
    try:
        wait_until(leader.streaming.is_set, 10, what="the agent's stream with the leader the standby named")
        yield leader, standbys, session, leader_address
    finally:
        stopped.set()
        session.cancel()
        running.join(10)
        for standby in standbys:
            standby.stop()
        server.stop(0)


def both_held(standbys: list[Standby]) -> None:
    """Until the agent's first watches reach the standbys (each opens within a pulse), and a pulse more."""
    wait_until(lambda: all(s.refusal.calls[WATCH_METHOD] for s in standbys), 5, what="the agent to watch both")
    time.sleep(PULSE)


def test_a_leader_the_standbys_name_is_not_asked_and_is_kept(cluster):
    leader, standbys, session, leader_address = cluster
    time.sleep(8 * PULSE)
    assert leader.checks == 0, "the pulse asked the leader itself though the standbys named it"
    assert leader.streaming.is_set() and leader.registrations == 1, "the agent left a leader the standbys named"


def test_during_an_election_the_coordinator_itself_is_asked_and_kept_while_it_answers(cluster):
    leader, standbys, session, leader_address = cluster
    for standby in standbys:
        standby.named = ""  # "no coordinator leads at the moment": neither standby can tell
    wait_until(lambda: leader.checks >= 3, 5, what="the agent to ask its coordinator itself")
    assert leader.streaming.is_set() and leader.registrations == 1, "the agent left a coordinator that answers"


def test_one_standby_that_cannot_tell_is_answered_by_the_watch_the_other_holds(cluster):
    leader, standbys, session, leader_address = cluster
    both_held(standbys)
    standbys[1].named = ""  # this one has lost sight of the leader key; the other still names the leader
    time.sleep(8 * PULSE)
    assert standbys[1].refusal.calls[WATCH_METHOD] >= 4, "the standby that cannot tell was not watched again"
    assert standbys[0].refusal.calls[WATCH_METHOD] == 1, "the watch the other standby held was ended"
    assert standbys[0].refusal.calls["/grpc.health.v1.Health/Check"] == 0
    assert leader.checks == 0 and leader.streaming.is_set() and leader.registrations == 1


@pytest.mark.parametrize("which", [0, 1])
def test_an_agent_goes_to_the_leader_a_standby_names_as_soon_as_it_names_it(cluster, tmp_path, which):
    leader, standbys, session, leader_address = cluster
    credentials = Credentials.from_dir(tmp_path / "ca", pki.SERVER_CERT, pki.SERVER_KEY).server()
    new_address = f"127.0.0.1:{free_port()}"  # a leader the agent was not given
    new_leader, server = serve_leader(new_address, credentials)
    try:
        started = time.monotonic()
        standbys[which].named = new_address  # the other one has not seen it yet, and the old leader still answers:
        wait_until(new_leader.streaming.is_set, 5, interval=0.02, what="the agent's stream with the new leader")
        assert time.monotonic() - started < 4 * PULSE, "the agent heard of the new leader only at a later pulse"
        assert not [t for t in leader.checked_at if t < new_leader.registered_at[0]], \
            "a standby naming another leader is enough: the old one need not be asked"
        time.sleep(6 * PULSE)  # the other standby names the old leader still: old news, which the first one denies
        assert new_leader.streaming.is_set() and new_leader.registrations == 1, "the agent went back to the old one"
        assert not leader.streaming.is_set() and leader.registrations == 1
        standbys[1 - which].named = new_address
    finally:
        server.stop(0)


def test_every_standby_is_watched_at_once_and_neither_is_asked(cluster):
    leader, standbys, session, leader_address = cluster
    time.sleep(8 * PULSE)
    for standby in standbys:  # one call each, open all along: every connection is kept, for the one that wins
        health_calls = {m: n for m, n in standby.refusal.calls.items() if m.startswith("/grpc.health")}
        assert health_calls == {WATCH_METHOD: 1}, "the agent asked a standby again and again, or never watched it"
    assert leader.checks == 0 and leader.streaming.is_set()


def test_a_standby_that_dies_costs_the_agent_nothing_and_the_other_still_tells(cluster):
    leader, standbys, session, leader_address = cluster
    both_held(standbys)
    standbys[0].stop()
    time.sleep(6 * PULSE)
    assert leader.streaming.is_set() and leader.registrations == 1 and leader.checks == 0
    # The other holds a watch, so it names the leader still: the agent need not ask it either.
    assert standbys[1].refusal.calls["/grpc.health.v1.Health/Check"] == 0
    standbys[1].named = f"127.0.0.1:{free_port()}"
    wait_until(lambda: not leader.streaming.is_set(), 5, interval=0.02, what="the agent to end its stream")


class Doorman:
    """Takes each connection on a port and closes it at once, counting them: a coordinator the agent cannot reach,
    whose every try is seen."""

    def __init__(self, address: str):
        host, port = address.rsplit(":", 1)
        self.socket = socket.create_server((host, int(port)))
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return  # closed
            self.accepted += 1
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset: no TIME_WAIT
            connection.close()

    def close(self) -> None:
        self.socket.shutdown(socket.SHUT_RDWR)  # wakes the accept, which holds the port until it returns
        self.socket.close()


def test_a_standby_that_cannot_be_reached_rests_and_is_watched_again_once_back(cluster, tmp_path, monkeypatch):
    # A crashed coordinator: thousands of agents trying it every pulse, and gRPC redialling each channel on which a
    # call failed, cost the hosts they share (docs/ha.md). It is tried again after a rest, and watched once back.
    leader, standbys, session, leader_address = cluster
    monkeypatch.setattr(session_module, "REST_FIRST_SECONDS", PULSE)  # doubled up to 2 s here; 2 s to 30 s in an agent
    monkeypatch.setattr(session_module, "REST_SECONDS", 2.0)
    both_held(standbys)
    down = standbys[0]
    down.stop()
    doorman = Doorman(down.address)
    try:
        time.sleep(25 * PULSE)
        tries = doorman.accepted  # each try: a TCP connection, then the watch's when that was taken
    finally:
        doorman.close()
    assert 2 <= tries <= 16, f"the agent tried the standby it could not reach {tries} times in 25 pulses"
    assert leader.streaming.is_set() and leader.registrations == 1 and leader.checks == 0
    credentials = Credentials.from_dir(tmp_path / "ca", pki.SERVER_CERT, pki.SERVER_KEY).server()
    back = Standby(down.address, credentials)
    back.named = leader_address
    try:
        wait_until(lambda: back.refusal.calls[WATCH_METHOD] >= 1, 10, what="the agent to watch the standby once back")
        back.named = f"127.0.0.1:{free_port()}"  # and it tells, as before
        wait_until(lambda: not leader.streaming.is_set(), 5, interval=0.02, what="the agent to end its stream")
    finally:
        back.stop()


def test_a_leader_whose_standbys_are_all_down_is_not_asked_every_pulse_and_is_kept(cluster):
    # As in a cluster of two coordinators whose standby is down: every watch fails at once, every pulse. Asking the
    # leader then could not change the verdict (only another coordinator's word leaves it), and would give it a
    # health check per agent per pulse for as long as the standbys are down.
    leader, standbys, session, leader_address = cluster
    both_held(standbys)
    for standby in standbys:
        standby.stop()
    time.sleep(10 * PULSE)
    assert leader.checks == 0, f"the leader was asked {leader.checks} times in 10 pulses though no other could tell"
    assert leader.streaming.is_set() and leader.registrations == 1, "the agent left a leader no other denied"


def test_a_certificate_holder_cannot_hold_more_watches_than_its_share_and_the_agents_watch_stays(cluster, tmp_path):
    leader, standbys, session, leader_address = cluster
    standby = standbys[0]
    ca = pki.Authority.load(tmp_path / "ca", with_key=True)
    key = pki.new_key()
    cert = pki.cert_pem(ca.sign(key.public_key(), "mallory", pki.NODE, datetime.timedelta(hours=1)))
    channel = grpc.secure_channel(standby.address, grpc.ssl_channel_credentials(ca.pem, pki.key_pem(key), cert))
    watch = health_pb2_grpc.HealthStub(channel).Watch
    held = [watch(health_pb2.HealthCheckRequest(service=leader_address)) for _ in range(WATCHES_PER_CALLER)]
    try:
        wait_until(lambda: standby.refusal.calls[WATCH_METHOD] >= WATCHES_PER_CALLER + 1, 5,
                   what="mallory's watches to reach the standby")
        with pytest.raises(grpc.RpcError) as refused:
            next(watch(health_pb2.HealthCheckRequest(service=leader_address), timeout=5))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and leader_hint(refused.value) == leader_address
        assert all(call.running() for call in held), "the watches within its share were ended"
        standby.named = f"127.0.0.1:{free_port()}"  # the agent's own watch still tells it
        wait_until(lambda: not leader.streaming.is_set(), 5, interval=0.02, what="the agent to end its stream")
    finally:
        for call in held:
            call.cancel()
        channel.close()


REGISTER_METHOD = "/tfcluster.v1.AgentService/Register"


def test_an_agent_whose_leader_dies_registers_once_with_the_one_the_standbys_name_as_they_name_it(cluster, tmp_path):
    leader, standbys, session, leader_address = cluster
    both_held(standbys)
    registrations = [s.refusal.calls[REGISTER_METHOD] for s in standbys]  # the first one's, before the leader's
    watches = [s.refusal.calls[WATCH_METHOD] for s in standbys]
    leader.server.stop(0)  # killed: the agent's stream breaks; the standbys name it until its lease runs out
    time.sleep(4 * PULSE)
    assert not leader.streaming.is_set()
    # The search reads the watches the stream's pulse held on the standbys: it opens none while they hold those.
    assert [s.refusal.calls[WATCH_METHOD] for s in standbys] == watches, "the held watches were opened again"
    assert [s.refusal._watchers for s in standbys] == [1, 1], "a standby no longer holds the agent's watch"
    for standby in standbys:
        standby.named = ""  # the lease ran out: an election is under way
    time.sleep(4 * PULSE)
    new_address = f"127.0.0.1:{free_port()}"  # a leader the agent was not given
    new_leader, server = serve_leader(new_address, Credentials.from_dir(tmp_path / "ca", pki.SERVER_CERT,
                                                                         pki.SERVER_KEY).server())
    try:
        named = time.monotonic()
        standbys[1].named = new_address
        wait_until(new_leader.streaming.is_set, 5, interval=0.02, what="the agent's stream with the new leader")
        assert new_leader.registered_at[0] - named < 2 * PULSE, "the agent heard of the new leader late"
        assert new_leader.registrations == 1
        # The standbys were asked with watches, over the connections kept, not with registrations.
        assert [s.refusal.calls[REGISTER_METHOD] for s in standbys] == registrations, "registered with a standby"
        standbys[0].named = new_address
    finally:
        server.stop(0)


def test_an_agent_whose_connection_broke_while_the_standbys_still_name_its_leader_goes_back_to_it(
        cluster, tmp_path, monkeypatch):
    leader, standbys, session, leader_address = cluster
    monkeypatch.setattr(new_leader, "STILL_NAMED_SECONDS", 6 * PULSE)
    both_held(standbys)
    leader.server.stop(0)  # restarted at once at the same address: the standbys name it all along
    again, server = serve_leader(leader_address, Credentials.from_dir(tmp_path / "ca", pki.SERVER_CERT,
                                                                       pki.SERVER_KEY).server())
    try:
        wait_until(again.streaming.is_set, 6 * PULSE + 5, interval=0.02, what="the agent back with its leader")
        assert again.registrations == 1
    finally:
        server.stop(0)
