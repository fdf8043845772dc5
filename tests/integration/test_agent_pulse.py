"""An agent given several coordinators watches another one for the moment the one serving its stream no longer
leads (a standby keeps the watch open while it names that leader, and refuses it naming the new one), so a leader
that is merely behind is not given a call per agent per pulse on top of its load, nor the standbys a health check
per agent per pulse. It asks its own coordinator only when no other can tell, and leaves it as soon as a standby
names another leader. Real gRPC over mutual TLS: a stand-in leader that counts the health checks it is sent, and a
real standby refusal server (tfcluster/daemon/coordinator/ha/standby.py) whose named leader the test changes."""

from __future__ import annotations

import asyncio
import datetime
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
        self.registrations = 0
        self.streaming = threading.Event()  # set while the agent's stream is open

    def Register(self, request, context):
        self.registrations += 1
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
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A leader and a standby naming it, over TLS, and an agent's session given both (the standby listed first)."""
    monkeypatch.setattr(session_module, "PULSE_SECONDS", PULSE)
    pki.init_ca(tmp_path / "ca", ["127.0.0.1"])
    server_credentials = Credentials.from_dir(tmp_path / "ca", pki.SERVER_CERT, pki.SERVER_KEY).server()
    leader_address, standby_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    leader = Leader()
    server = grpc.server(ThreadPoolExecutor(max_workers=8))
    agent_pb2_grpc.add_AgentServiceServicer_to_server(leader, server)
    health_pb2_grpc.add_HealthServicer_to_server(leader, server)
    server.add_secure_port(leader_address, server_credentials)
    server.start()
    standby = Standby(standby_address, server_credentials)
    standby.named = leader_address
    stopped = threading.Event()
    session = Session(f"{standby_address},{leader_address}", IdleOwner(Credentials.from_dir(tmp_path / "ca" / "admin")),
                      stopped, Liveness(["connection"]), on_refused=lambda why: None)
    running = threading.Thread(target=session.run, daemon=True)
    running.start()
    try:
        wait_until(leader.streaming.is_set, 10, what="the agent's stream with the leader the standby named")
        yield leader, standby, session, leader_address
    finally:
        stopped.set()
        session.cancel()
        running.join(10)
        standby.stop()
        server.stop(0)


def test_a_leader_the_standby_names_is_not_asked_and_is_kept(cluster):
    leader, standby, session, leader_address = cluster
    time.sleep(8 * PULSE)
    assert leader.checks == 0, "the pulse asked the leader itself though a standby named it"
    assert leader.streaming.is_set() and leader.registrations == 1, "the agent left a leader the standby named"


def test_during_an_election_the_coordinator_itself_is_asked_and_kept_while_it_answers(cluster):
    leader, standby, session, leader_address = cluster
    standby.named = ""  # "no coordinator leads at the moment": the standby cannot tell
    wait_until(lambda: leader.checks >= 3, 5, what="the agent to ask its coordinator itself")
    assert leader.streaming.is_set() and leader.registrations == 1, "the agent left a coordinator that answers"


def test_an_agent_leaves_as_soon_as_a_standby_names_another_leader(cluster):
    leader, standby, session, leader_address = cluster
    standby.named = f"127.0.0.1:{free_port()}"  # a new leader elsewhere (its address has no server in this test)
    # The old leader still answers: an agent that asked it would stay.
    wait_until(lambda: not leader.streaming.is_set(), 5, interval=0.02, what="the agent to end its stream")
    assert leader.checks == 0, "a standby naming another leader is enough: the old one need not be asked"
    assert session.coordinator != leader_address


def test_the_standby_is_watched_not_asked_and_says_nothing_until_the_leader_changes(cluster):
    leader, standby, session, leader_address = cluster
    time.sleep(8 * PULSE)
    health_calls = {m: n for m, n in standby.refusal.calls.items() if m.startswith("/grpc.health")}
    assert health_calls == {WATCH_METHOD: 1}, "the agent asked the standby again and again"
    assert leader.checks == 0 and leader.streaming.is_set()
    started = time.monotonic()
    standby.named = f"127.0.0.1:{free_port()}"
    wait_until(lambda: not leader.streaming.is_set(), 5, interval=0.02, what="the agent to end its stream")
    assert time.monotonic() - started < 8 * PULSE, "the agent heard of the new leader only at a later pulse"


def test_a_certificate_holder_cannot_hold_more_watches_than_its_share_and_the_agents_watch_stays(cluster, tmp_path):
    leader, standby, session, leader_address = cluster
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
