"""The peer port on its own, over real mutual TLS on loopback: a PeerServer with a node's certificate, and
senders with theirs (shipping.put_files, or raw streams). What needs a whole cluster is in test_shipping.py."""

from __future__ import annotations

import datetime
import os
import threading
import time

import grpc
import pytest

from harness import free_port, wait_until
from tfcluster import pki
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.daemon.agent.hooks.shipping import Peer, ShipError, put_files
from tfcluster.daemon.agent.peers.server import Expectation, Limits, PeerServer, PeerServicer
from tfcluster.security import Credentials

JOB = "train-3-ab12"


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return pki.init_ca(tmp_path_factory.mktemp("ca"), [])


def node(ca, name: str) -> Credentials:
    key, cert = ca.issue(name, pki.NODE, datetime.timedelta(hours=1), [pki.node_server_name(name), "127.0.0.1"])
    return Credentials(ca.pem, cert, key)


@pytest.fixture
def serve(ca, tmp_path):
    """Starts a peer port on node "b" with a servicer's settings; stopped afterwards."""
    servers = []

    def start(credentials: Credentials | None = None, **settings) -> tuple[str, PeerServicer]:
        servicer = PeerServicer(tmp_path / "state", **settings)
        address = f"127.0.0.1:{free_port()}"
        server = PeerServer(address, servicer, lambda: credentials or node(ca, "b"))
        server.start()
        servers.append(server)
        return address, servicer
    yield start
    for server in servers:
        server.stop(0)


def source(tmp_path, size: int = 3 * 1024 * 1024 + 5):
    directory = tmp_path / "source"
    (directory / "sub").mkdir(parents=True)
    (directory / "sub" / "ckpt-1.data-00000-of-00001").write_bytes(os.urandom(size))
    (directory / "ckpt-1.index").write_bytes(b"index")
    return str(directory), ["sub/ckpt-1.data-00000-of-00001", "ckpt-1.index"]


def test_the_sender_accepts_only_the_node_the_coordinator_named(ca, serve, tmp_path):
    address, _ = serve(credentials=node(ca, "c"))  # node c's certificate serves where b was expected
    directory, names = source(tmp_path)
    with pytest.raises(ShipError) as info:
        put_files(Peer(address, "b"), JOB, directory, names, node(ca, "a"))
    assert "b (" in str(info.value)
    assert not (tmp_path / "state" / "jobs" / JOB / "checkpoints" / "ckpt-1.index").exists()
    size, _ = put_files(Peer(address, "c"), JOB, directory, names, node(ca, "a"))
    assert size == 3 * 1024 * 1024 + 5 + len(b"index")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gives files away")
def test_received_files_and_the_dirs_made_for_them_go_to_the_jobs_task_user(ca, serve, tmp_path):
    address, _ = serve(expects=lambda job: Expectation("a", uid=54321, gid=54322))
    directory, names = source(tmp_path)
    put_files(Peer(address, "b"), JOB, directory, names, node(ca, "a"), {"checkpoint": b"state"})
    checkpoints = tmp_path / "state" / "jobs" / JOB / "checkpoints"
    for path in (checkpoints, checkpoints / "sub", checkpoints / names[0], checkpoints / "ckpt-1.index",
                 checkpoints / "checkpoint"):
        info = os.lstat(path)
        assert (info.st_uid, info.st_gid) == (54321, 54322), path
    assert os.stat(checkpoints.parent).st_uid == os.geteuid(), "the job's own dir is left to whoever made it"
    # Without a task user the files stay the agent's.
    address, _ = serve(expects=lambda job: Expectation("a"))
    put_files(Peer(address, "b"), "other-4", directory, names, node(ca, "a"))
    assert os.lstat(tmp_path / "state" / "jobs" / "other-4" / "checkpoints" / "ckpt-1.index").st_uid == os.geteuid()


def test_files_that_come_before_the_coordinators_word_wait_for_it_and_a_job_never_expected_is_refused(
        ca, serve, tmp_path):
    """The coordinator tells the receiver to expect a job's files and the sender to send them at once, on two
    streams: the sender may be first. Its transfer waits for the word; one for a job never named is refused."""
    told: dict[str, Expectation] = {}
    address, _ = serve(expects=told.get, limits=Limits(expect_wait_seconds=1.5))
    directory, names = source(tmp_path, size=1000)
    timer = threading.Timer(0.4, lambda: told.setdefault(JOB, Expectation("a")))
    timer.start()
    try:
        began = time.monotonic()
        size, _ = put_files(Peer(address, "b"), JOB, directory, names, node(ca, "a"))
        assert size == 1000 + len(b"index") and time.monotonic() - began >= 0.35
    finally:
        timer.cancel()
    assert (tmp_path / "state" / "jobs" / JOB / "checkpoints" / "ckpt-1.index").read_bytes() == b"index"
    began = time.monotonic()
    with pytest.raises(ShipError) as info:
        put_files(Peer(address, "b"), "never-7-abc", directory, names, node(ca, "a"))
    assert "has not told this node" in str(info.value) and "waited 1.5 s" in str(info.value)
    assert 1.4 <= time.monotonic() - began < 10
    assert not (tmp_path / "state" / "jobs" / "never-7-abc").exists()
    told["other-4-abc"] = Expectation("a")  # the port still takes what it was told of
    assert put_files(Peer(address, "b"), "other-4-abc", directory, names, node(ca, "a"))[0] == 1000 + len(b"index")


def _stalled(release: threading.Event, first: agent_pb2.FileChunk | None = None):
    if first is not None:
        yield first
    release.wait(60)
    yield agent_pb2.FileChunk(job_id=JOB, commit=True)


def test_a_transfer_is_ended_at_its_deadline_and_the_port_bounds_transfers_in_total(ca, serve, tmp_path):
    address, _ = serve(limits=Limits(deadline_seconds=2.0, idle_seconds=1.0, per_sender=2, total=3))
    release = threading.Event()
    trickle = threading.Event()

    def trickling():  # a chunk every half second: never idle for long, yet never done
        while not trickle.wait(0.5):
            yield agent_pb2.FileChunk(job_id=JOB, path="slow", data=b"x")
    channels = [node(ca, name).channel(address, server_name=pki.node_server_name("b")) for name in ("a", "c", "d")]
    try:
        stubs = [agent_pb2_grpc.AgentPeerServiceStub(c) for c in channels]
        started = time.monotonic()
        slow = stubs[0].PutFiles.future(trickling(), timeout=30)
        idle = [stubs[1].PutFiles.future(_stalled(release), timeout=30) for _ in range(2)]
        time.sleep(0.3)
        with pytest.raises(grpc.RpcError) as info:
            stubs[2].PutFiles(_stalled(release), timeout=30)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "3 transfers" in info.value.details()
        for call in idle:
            assert call.exception(timeout=10).code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "nothing arrived for 1 s" in call.details()
        assert slow.exception(timeout=10).code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "took longer than 2 s" in slow.details() and time.monotonic() - started < 5
        wait_until(lambda: not list((tmp_path / "state" / "jobs" / JOB).glob(".incoming-*")), 5,
                   what="the ended transfers' files removed")
    finally:
        release.set()
        trickle.set()
        for channel in channels:
            channel.close()
