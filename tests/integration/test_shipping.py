"""Checkpoints without shared storage (no checkpoint_dir in the spec): each node has its own dir under its
agent's state dir; the chief's agent ships each committed checkpoint to the evaluator's agent, and a
restarted group's nodes get the chief's whole dir before they start. Plain-Python tasks, two agents with
separate state dirs on loopback."""

from __future__ import annotations

import hashlib
import sys
import textwrap
import threading
import time
from pathlib import Path

import grpc
import pytest

from harness import wait_until
from tfcluster import pki
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.security import Credentials

PY = sys.executable

# Writes three checkpoints (2 MB of data each) the way TensorFlow does: files, then the state file.
TRAINER = """
import os, time
d = os.environ["TFCLUSTER_CHECKPOINT_DIR"]
for n in range(1, 4):
    time.sleep(0.3)
    with open(os.path.join(d, f"ckpt-{n}.data-00000-of-00001"), "wb") as f:
        f.write(os.urandom(2 * 1024 * 1024))
    open(os.path.join(d, f"ckpt-{n}.index"), "wb").write(b"index %d" % n)
    with open(os.path.join(d, "checkpoint.tmp"), "w") as f:
        f.write(f'model_checkpoint_path: "ckpt-{n}"\\n')
    os.replace(os.path.join(d, "checkpoint.tmp"), os.path.join(d, "checkpoint"))
"""

EVALUATOR = """
import hashlib, os
from tfcluster import task
for path in task.checkpoints(poll_seconds=0.05):
    digest = hashlib.sha256(open(path + ".data-00000-of-00001", "rb").read()).hexdigest()
    task.report_evaluation(path, task.checkpoint_step(path), {"sha": int(digest[:8], 16)})
"""


@pytest.fixture
def two_nodes(make_cluster):
    cluster = make_cluster()
    cluster.start_agent("a", wait=False)
    cluster.start_agent("b")
    wait_until(lambda: cluster.node_state("a") == "READY", 20, what="agent a")
    return cluster


def spec(tmp_path, text: str) -> str:
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shipping_job(cluster, tmp_path, name: str, trainer: str = TRAINER) -> str:
    """Runs a job (to its end) that trains on node a and evaluates on node b: the checkpoints are shipped."""
    return cluster.cli("start", spec(tmp_path, f"""
        name = "{name}"
        strategy = "mirrored"
        command = ["{PY}", "-c", '''{trainer}''']
        [roles.worker]
        nodes = ["a"]
        [roles.evaluator]
        nodes = ["b"]
        command = ["{PY}", "-c", '''{EVALUATOR}''']
    """), "--wait", check=True, timeout=120).stdout.strip()


def test_checkpoints_are_shipped_to_the_evaluator_on_another_node(two_nodes, tmp_path):
    cluster = two_nodes
    job_id = shipping_job(cluster, tmp_path, "shipped")
    job = cluster.job(job_id)
    assert job["state"] == "SUCCEEDED", job["message"]
    source = cluster.agent_state_dir("a") / "jobs" / job_id / "checkpoints"
    copy = cluster.agent_state_dir("b") / "jobs" / job_id / "checkpoints"
    assert (copy / "ckpt-3.index").exists(), "the final checkpoint reached the evaluator's node"
    assert sha(copy / "ckpt-3.data-00000-of-00001") == sha(source / "ckpt-3.data-00000-of-00001")
    assert (copy / "checkpoint").read_text() == 'model_checkpoint_path: "ckpt-3"\n'
    latest = job["evaluation"]["latest"]
    assert latest["checkpoint"] == str(copy / "ckpt-3"), "evaluated from its own node's copy"
    assert latest["metrics"]["sha"] == int(sha(source / "ckpt-3.data-00000-of-00001")[:8], 16)
    assert not list(copy.parent.glob(".incoming-*")), "no half-received files left"


RESTARTER = """
import os, sys
d = os.environ["TFCLUSTER_CHECKPOINT_DIR"]
attempt = os.environ["TFCLUSTER_ATTEMPT"]
me = os.environ["TFCLUSTER_TASK_TYPE"] + ":" + os.environ["TFCLUSTER_TASK_INDEX"]
seen = os.path.exists(os.path.join(d, "backup", "chief", "epoch"))
print(me, "attempt", attempt, "sees the backup:", seen, flush=True)
if me == "worker:0" and attempt == "1":
    os.makedirs(os.path.join(d, "backup", "chief"), exist_ok=True)
    open(os.path.join(d, "backup", "chief", "epoch"), "w").write("3")
if me == "worker:1" and attempt == "1":
    import time; time.sleep(1); sys.exit(1)
"""


def test_a_restarted_group_gets_the_chiefs_checkpoint_dir_on_every_node(two_nodes, tmp_path):
    cluster = two_nodes
    job_id = cluster.cli("start", spec(tmp_path, f"""
        name = "restored"
        strategy = "multi_worker_mirrored"
        command = ["{PY}", "-c", '''{RESTARTER}''']
        [roles.worker]
        count = 2
        [restart]
        max_restarts = 1
    """), "--wait", check=True).stdout.strip()
    job = cluster.job(job_id)
    assert job["state"] == "SUCCEEDED" and job["restarts"] == 1
    nodes = {t["index"]: t["node"] for t in job["tasks"]}
    assert nodes[0] != nodes[1], "one worker per node"
    second = cluster.cli("logs", job_id, "worker:1", check=True).stdout
    assert second == "worker:1 attempt 2 sees the backup: True\n", "copied before the restarted group began"
    first = cluster.cli("logs", job_id, "worker:1", "--attempt", "1", check=True).stdout
    assert "sees the backup: False" in first


def _put(stub, job_id: str, path: str, data: bytes, sha256: str = ""):
    chunks = [agent_pb2.FileChunk(job_id=job_id, path=path, data=data, end_of_file=True,
                                  sha256=sha256 or hashlib.sha256(data).hexdigest()),
              agent_pb2.FileChunk(job_id=job_id, commit=True)]
    return stub.PutFiles(iter(chunks), timeout=10)


def _expected(cluster, sender: str, receiver: str) -> str:
    """A job that trained on sender and evaluated on receiver: receiver's agent takes that job's checkpoint
    files from sender's alone."""
    return cluster.cli("start", spec(cluster.root, f'''
        name = "here"
        strategy = "mirrored"
        command = ["true"]
        [roles.worker]
        nodes = ["{sender}"]
        [roles.evaluator]
        nodes = ["{receiver}"]
    '''), "--wait", check=True).stdout.strip()


def _peer(cluster, sender: str, receiver: str) -> grpc.Channel:
    """A channel to receiver's peer port with a certificate of node sender, checking it reaches receiver."""
    address = f"127.0.0.1:{cluster.port_ranges[receiver][0]}"  # the agent's own port comes first in its range
    return cluster.credentials("node", sender).channel(address, server_name=pki.node_server_name(receiver))


def test_peer_port_refuses_paths_outside_the_jobs_dir_bad_checksums_and_strangers(two_nodes):
    cluster = two_nodes
    job_id = _expected(cluster, "a", "b")
    peer = f"127.0.0.1:{cluster.port_ranges['b'][0]}"
    with _peer(cluster, "a", "b") as channel:
        stub = agent_pb2_grpc.AgentPeerServiceStub(channel)
        for chunks, code, needle in (
            ([agent_pb2.FileChunk(job_id=job_id, path="../../etc/x", data=b"x", end_of_file=True,
                                  sha256=hashlib.sha256(b"x").hexdigest())], grpc.StatusCode.INVALID_ARGUMENT, "path"),
            ([agent_pb2.FileChunk(job_id="../x", path="a", data=b"x")], grpc.StatusCode.INVALID_ARGUMENT, "job_id"),
            ([agent_pb2.FileChunk(job_id=job_id + "\n", path="a", data=b"x")], grpc.StatusCode.INVALID_ARGUMENT,
             "job_id"),
            ([agent_pb2.FileChunk(job_id=job_id, path="a", data=b"x", end_of_file=True, sha256="0" * 64)],
             grpc.StatusCode.DATA_LOSS, "checksum"),
            ([agent_pb2.FileChunk(job_id=job_id, path="a", data=b"x")], grpc.StatusCode.INVALID_ARGUMENT, "commit"),
            ([agent_pb2.FileChunk(job_id="never-7-abc", path="a", data=b"x" * 1000)],
             grpc.StatusCode.PERMISSION_DENIED, "has not told this node"),
            *(([agent_pb2.FileChunk(job_id=job_id, path=path, data=b"x", end_of_file=True,
                                    sha256=hashlib.sha256(b"x").hexdigest())], grpc.StatusCode.INVALID_ARGUMENT, why)
              for path, why in ((".", "the checkpoint dir itself"), ("", "empty"), ("..", "leads out"),
                                ("/etc/x", "absolute"), ("a\0b", "NUL byte"), ("./", "the checkpoint dir itself"))),
        ):
            with pytest.raises(grpc.RpcError) as info:
                stub.PutFiles(iter(chunks), timeout=5)
            assert info.value.code() == code and needle in info.value.details(), info.value.details()
        assert _put(stub, job_id, "ok/file", b"fine").bytes == 4
    job_dir = cluster.agent_state_dir("b") / "jobs" / job_id
    assert (job_dir / "checkpoints" / "ok" / "file").read_bytes() == b"fine"
    assert not (job_dir / "checkpoints" / "a").exists() and not list(job_dir.glob(".incoming-*"))
    assert not (cluster.agent_state_dir("b") / "jobs" / "never-7-abc").exists()
    # Only agents of the cluster: an admin's certificate is not a node's, no certificate is no connection.
    for credentials in (cluster.credentials(), None):
        channel = credentials.channel(peer, server_name=pki.node_server_name("b")) if credentials \
            else grpc.insecure_channel(peer)
        with channel, pytest.raises(grpc.RpcError) as info:
            _put(agent_pb2_grpc.AgentPeerServiceStub(channel), job_id, "x", b"x")
        assert info.value.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAVAILABLE)
    assert not (job_dir / "checkpoints" / "x").exists()


def test_peer_port_never_writes_through_a_symbolic_link(two_nodes, tmp_path):
    cluster = two_nodes
    job_id = _expected(cluster, "a", "b")
    checkpoints = cluster.agent_state_dir("b") / "jobs" / job_id / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (checkpoints / "escape").symlink_to(outside)
    (checkpoints / "file-link").symlink_to(outside / "target")
    with _peer(cluster, "a", "b") as channel:
        stub = agent_pb2_grpc.AgentPeerServiceStub(channel)
        for path in ("escape/x", "file-link"):
            with pytest.raises(grpc.RpcError) as info:
                _put(stub, job_id, path, b"payload")
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "symbolic link" in info.value.details()
    assert list(outside.iterdir()) == [], "nothing written outside the job's dir"


def test_peer_port_bounds_what_one_job_may_receive(make_cluster):
    cluster = make_cluster()
    cluster.start_agent("a")
    cluster.start_agent("small", extra=["--peer-quota", "1M"])
    job_id = _expected(cluster, "a", "small")
    with _peer(cluster, "a", "small") as channel:
        stub = agent_pb2_grpc.AgentPeerServiceStub(channel)
        assert _put(stub, job_id, "first", b"x" * 700_000).bytes == 700_000
        with pytest.raises(grpc.RpcError) as info:
            _put(stub, job_id, "second", b"x" * 700_000)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "quota" in info.value.details()
    checkpoints = cluster.agent_state_dir("small") / "jobs" / job_id / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["first"]
    assert not list(checkpoints.parent.glob(".incoming-*"))


def _node_credentials(cluster, node: str) -> Credentials:
    """The certificate node's agent joined with."""
    return Credentials.from_dir(cluster.agent_state_dir(node) / "tls", pki.NODE_CERT, pki.NODE_KEY)


def test_peer_port_takes_a_jobs_files_from_the_node_the_coordinator_named_alone(make_cluster):
    cluster = make_cluster()
    cluster.start_agents({"a": {}, "b": {}, "c": {}})
    job_id = _expected(cluster, "a", "b")
    address = f"127.0.0.1:{cluster.port_ranges['b'][0]}"
    with _node_credentials(cluster, "c").channel(address, server_name=pki.node_server_name("b")) as channel:
        with pytest.raises(grpc.RpcError) as info:
            _put(agent_pb2_grpc.AgentPeerServiceStub(channel), job_id, "intruder", b"x" * 1000)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert all(name in info.value.details() for name in (job_id, "node c", "node a")), info.value.details()
    job_dir = cluster.agent_state_dir("b") / "jobs" / job_id
    assert not (job_dir / "checkpoints" / "intruder").exists() and not list(job_dir.glob(".incoming-*"))
    with _node_credentials(cluster, "a").channel(address, server_name=pki.node_server_name("b")) as channel:
        assert _put(agent_pb2_grpc.AgentPeerServiceStub(channel), job_id, "fine", b"ok").bytes == 2
    assert (job_dir / "checkpoints" / "fine").read_bytes() == b"ok"


def test_a_removed_nodes_certificate_is_refused_at_the_peer_ports_and_shipping_goes_on(make_cluster, tmp_path):
    cluster = make_cluster()
    cluster.start_agents({"a": {}, "b": {}, "c": {}})
    removed = _node_credentials(cluster, "c")
    address = f"127.0.0.1:{cluster.port_ranges['b'][0]}"

    def attempt() -> grpc.RpcError:
        with removed.channel(address, server_name=pki.node_server_name("b")) as channel:
            with pytest.raises(grpc.RpcError) as info:
                agent_pb2_grpc.AgentPeerServiceStub(channel).PutFiles(
                    iter([agent_pb2.FileChunk(job_id="../x", path="a")]), timeout=5)
        return info.value
    assert attempt().code() == grpc.StatusCode.INVALID_ARGUMENT, "let in while c belongs to the cluster"
    cluster.cli("node", "remove", "c", check=True)
    refused = wait_until(lambda: (lambda e: e if e.code() == grpc.StatusCode.PERMISSION_DENIED else None)(attempt()),
                         10, what="c's certificate to be refused at b's peer port")
    assert "node c" in refused.details() and "revoked" in refused.details(), refused.details()
    job_id = shipping_job(cluster, tmp_path, "after")
    assert cluster.job(job_id)["state"] == "SUCCEEDED"
    assert (cluster.agent_state_dir("b") / "jobs" / job_id / "checkpoints" / "ckpt-3.index").exists()


def test_stalled_transfers_of_a_hostile_node_neither_block_the_sender_nor_last(two_nodes, tmp_path):
    cluster = two_nodes
    address = f"127.0.0.1:{cluster.port_ranges['b'][0]}"
    release = threading.Event()

    def stalled():
        release.wait(120)
        yield agent_pb2.FileChunk(job_id="never-1", commit=True)
    hostile = cluster.credentials("node", "hostile").channel(address, server_name=pki.node_server_name("b"))
    try:
        stub = agent_pb2_grpc.AgentPeerServiceStub(hostile)
        opened = time.monotonic()
        calls = [stub.PutFiles.future(stalled(), timeout=120) for _ in range(20)]
        refused = wait_until(lambda: [c for c in calls if c.done()], 10, what="transfers beyond the limit refused")
        assert all(c.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "hostile" in c.details() for c in refused)
        job_id = shipping_job(cluster, tmp_path, "despite")
        job = cluster.job(job_id)
        copy = cluster.agent_state_dir("b") / "jobs" / job_id / "checkpoints"
        assert job["state"] == "SUCCEEDED" and job["evaluation"]["latest"]["checkpoint"] == str(copy / "ckpt-3")
        for call in calls:
            try:
                call.result(timeout=max(1.0, opened + 40 - time.monotonic()))
            except grpc.RpcError:
                pass
        codes = [c.code() for c in calls]
        assert set(codes) == {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED}, codes
        ended = [c for c in calls if c.code() == grpc.StatusCode.DEADLINE_EXCEEDED]
        assert len(ended) == 8 and all("nothing arrived for" in c.details() for c in ended)
    finally:
        release.set()
        hostile.close()
