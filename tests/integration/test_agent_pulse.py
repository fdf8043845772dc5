"""An agent given several coordinators checks that the one serving its stream still leads by asking another one
(a standby names the leader), so a leader that is merely behind is not given a call per agent per pulse on top of
its load. It asks its own coordinator only when no other can tell, and leaves it as soon as a standby names
another leader. Real gRPC over mutual TLS: a stand-in leader that counts the health checks it is sent, and a
real standby refusal server (tfcluster/daemon/coordinator/ha/standby.py) whose named leader the test changes."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fleet import IdleOwner
from harness import free_port, wait_until
from tfcluster import pki
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.credentials import Credentials
from tfcluster.daemon.agent.session import session as session_module
from tfcluster.daemon.agent.session.liveness import Liveness
from tfcluster.daemon.agent.session.session import Session
from tfcluster.daemon.coordinator.ha.standby import refusal_server

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


class Standby:
    """The real refusal server, on an event loop of its own, naming whichever leader `named` holds."""

    def __init__(self, listen: str, credentials):
        self.named = ""
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

        async def start() -> grpc.aio.Server:  # made on its loop, as gRPC's aio servers must be
            server = refusal_server(listen, lambda: self.named, credentials)
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
