"""A real agent against a scripted coordinator (real gRPC): an answer lost with a broken stream is delivered
again after the agent registers again, and a repeated command is answered from what the agent kept."""

from __future__ import annotations

import queue
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from harness import free_port, port_block, wait_until
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.daemon.agent.agent import Agent, AgentConfig
from tfcluster.daemon.agent.peers.server import PeerServer, PeerServicer
from tfcluster.daemon.agent.session.discovery import host_info
from tfcluster.security import Credentials

END = object()


class ScriptedCoordinator(agent_pb2_grpc.AgentServiceServicer):
    """Records what arrives on each stream; the test decides what each stream is sent, and ends streams."""

    def __init__(self):
        self.registrations: list[agent_pb2.RegisterRequest] = []
        self.received: queue.Queue = queue.Queue()  # (stream number, message)
        self.outboxes: list[queue.Queue] = []

    def Register(self, request, context):
        self.registrations.append(request)
        return agent_pb2.RegisterResponse(session_id=f"s{len(self.registrations)}", heartbeat_interval_seconds=0.2)

    def Connect(self, request_iterator, context):
        next(request_iterator)  # open
        outbox: queue.Queue = queue.Queue()
        self.outboxes.append(outbox)
        number = len(self.outboxes)

        def read() -> None:
            try:
                for message in request_iterator:
                    self.received.put((number, message))
            except grpc.RpcError:
                pass
        threading.Thread(target=read, daemon=True).start()
        while True:
            item = outbox.get()
            if item is END:
                return
            yield item

    def next_of(self, kind: str, timeout: float = 20.0) -> tuple[int, object]:
        """The next message of a kind (heartbeats and the like in between are skipped)."""
        while True:
            number, message = self.received.get(timeout=timeout)
            if message.WhichOneof("kind") == kind:
                return number, getattr(message, kind)


class CountingPeer(PeerServicer):
    def __init__(self, state_dir: Path):
        super().__init__(state_dir)
        self.calls = 0

    async def PutFiles(self, request_iterator, context):
        self.calls += 1
        return await super().PutFiles(request_iterator, context)


@pytest.fixture
def scripted(tmp_path):
    coordinator = ScriptedCoordinator()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    agent_pb2_grpc.add_AgentServiceServicer_to_server(coordinator, server)
    address = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(address)
    peer = CountingPeer(tmp_path / "peer")
    peer_address = f"127.0.0.1:{free_port()}"
    peer_server = PeerServer(peer_address, peer, Credentials)
    server.start()
    peer_server.start()
    base = port_block()
    agent = Agent(AgentConfig(coordinator=address, name="n1", address="127.0.0.1", port_range=(base + 1, base + 9),
                              gpus=(), host=host_info(), state_dir=tmp_path / "agent", peer_port=base))
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        yield coordinator, agent, peer, peer_address
    finally:
        agent.stop()
        thread.join(timeout=10)
        for outbox in coordinator.outboxes:
            outbox.put(END)
        server.stop(0)
        peer_server.stop(0)


def test_a_sync_answer_lost_with_its_stream_arrives_again_after_registering(scripted, tmp_path):
    coordinator, agent, peer, peer_address = scripted
    checkpoints = tmp_path / "agent" / "jobs" / "job-1" / "checkpoints"
    checkpoints.mkdir(parents=True)
    state = b'model_checkpoint_path: "ckpt-1"\n'
    (checkpoints / "ckpt-1.index").write_bytes(b"index")
    (checkpoints / "checkpoint").write_bytes(state)
    wait_until(lambda: coordinator.outboxes, 20, what="the agent's stream")
    coordinator.outboxes[0].put(agent_pb2.CoordinatorMessage(sync=agent_pb2.SyncCheckpoints(
        job_id="job-1", sync_id=7, targets=[peer_address])))
    number, done = coordinator.next_of("sync_done")
    assert (number, done.sync_id, done.ok, done.bytes) == (1, 7, True, len(b"index") + len(state))
    assert peer.calls == 1 and (tmp_path / "peer" / "jobs" / "job-1" / "checkpoints" / "ckpt-1.index").exists()
    # The stream breaks: as far as the coordinator can tell, that answer never arrived.
    coordinator.outboxes[0].put(END)
    number, again = coordinator.next_of("sync_done")
    assert number == 2 and len(coordinator.registrations) == 2
    assert (again.sync_id, again.ok) == (7, True), "delivered again, unasked"
    # The coordinator asks again (its reconcile does, until it has the answer): answered from what was kept.
    coordinator.outboxes[1].put(agent_pb2.CoordinatorMessage(sync=agent_pb2.SyncCheckpoints(
        job_id="job-1", sync_id=7, targets=[peer_address])))
    number, third = coordinator.next_of("sync_done")
    assert (number, third.sync_id, third.ok) == (2, 7, True)
    assert peer.calls == 1, "the copy was not made twice"


def test_an_unknown_command_from_a_newer_coordinator_is_ignored(scripted):
    coordinator, agent, peer, peer_address = scripted
    wait_until(lambda: coordinator.outboxes, 20, what="the agent's stream")
    coordinator.outboxes[0].put(agent_pb2.CoordinatorMessage())  # no kind this agent knows
    coordinator.next_of("heartbeat")
    coordinator.next_of("heartbeat")
    assert len(coordinator.registrations) == 1 and agent.connected.is_set()
