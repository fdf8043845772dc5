"""Checkpoints without shared storage (no checkpoint_dir in the spec): each node has its own dir under its
agent's state dir; the chief's agent ships each committed checkpoint to the evaluator's agent, and a
restarted group's nodes get the chief's whole dir before they start. Plain-Python tasks, two agents with
separate state dirs on loopback."""

from __future__ import annotations

import hashlib
import sys
import textwrap
from pathlib import Path

import grpc
import pytest

from harness import wait_until
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc

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


def test_checkpoints_are_shipped_to_the_evaluator_on_another_node(two_nodes, tmp_path):
    cluster = two_nodes
    job_id = cluster.cli("start", spec(tmp_path, f"""
        name = "shipped"
        strategy = "mirrored"
        command = ["{PY}", "-c", '''{TRAINER}''']
        [roles.worker]
        nodes = ["a"]
        [roles.evaluator]
        nodes = ["b"]
        command = ["{PY}", "-c", '''{EVALUATOR}''']
    """), "--wait", check=True).stdout.strip()
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


def test_peer_service_refuses_paths_outside_the_jobs_dir_and_bad_checksums(two_nodes):
    cluster = two_nodes
    peer = next(n for n in cluster.status()["nodes"] if n["name"] == "b")
    port = cluster.port_ranges["b"][0]  # the agent's own port comes first in its range
    with grpc.insecure_channel(f"{peer['address']}:{port}") as channel:
        stub = agent_pb2_grpc.AgentPeerServiceStub(channel)
        for chunks, code, needle in (
            ([agent_pb2.FileChunk(job_id="j-1", path="../../etc/x", data=b"x", end_of_file=True,
                                  sha256=hashlib.sha256(b"x").hexdigest())], grpc.StatusCode.INVALID_ARGUMENT, "path"),
            ([agent_pb2.FileChunk(job_id="../x", path="a", data=b"x")], grpc.StatusCode.INVALID_ARGUMENT, "job_id"),
            ([agent_pb2.FileChunk(job_id="j-1", path="a", data=b"x", end_of_file=True, sha256="0" * 64)],
             grpc.StatusCode.DATA_LOSS, "checksum"),
            ([agent_pb2.FileChunk(job_id="j-1", path="a", data=b"x")], grpc.StatusCode.INVALID_ARGUMENT, "commit"),
        ):
            with pytest.raises(grpc.RpcError) as info:
                stub.PutFiles(iter(chunks), timeout=5)
            assert info.value.code() == code and needle in info.value.details()
    job_dir = cluster.agent_state_dir("b") / "jobs" / "j-1"
    assert not (job_dir / "checkpoints" / "a").exists() and not list(job_dir.glob(".incoming-*"))
