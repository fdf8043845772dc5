"""GPU conditions from an agent to placement and status, over the real wire: the agent's own session
(tfcluster/daemon/agent/session/session.py) registers and heartbeats with a real node certificate over mutual
TLS with a real coordinator, carrying the conditions its GPU check would have found. NVML cannot run here (no
GPU), so the conditions are those of the session's owner: the one piece that stands in is the NVML reading,
which tests/unit/test_gpu_health.py covers as a pure function."""

from __future__ import annotations

import json
import threading

import pytest

from fleet import IdleOwner
from harness import wait_until
from tfcluster import __version__, pki
from tfcluster.conditions import ECC_UNCORRECTABLE, THROTTLED, NodeCondition
from tfcluster.daemon.agent.session.liveness import Liveness
from tfcluster.daemon.agent.session.session import Session
from tfcluster.model import Gpu, NodeInfo

ECC = NodeCondition(1, ECC_UNCORRECTABLE, "uncorrectable ECC errors: 2 since the driver loaded", 1767000000.0)
HOT = NodeCondition(0, THROTTLED, "clocks throttled: HW thermal slowdown", 1767000001.0)


class GpuNode(IdleOwner):
    """What the agent gives its session: a node of two GPUs whose last GPU check found `conditions`."""

    def __init__(self, credentials, conditions):
        super().__init__(credentials)
        self.found = tuple(conditions)
        self.launched = threading.Event()

    def node_info(self):
        return NodeInfo(name="b", address="127.0.0.1", port_range=(29100, 29199), agent_version=__version__,
                        gpus=tuple(Gpu(i, uuid=f"GPU-b-{i}", name="Test GPU", memory_mib=1024) for i in range(2)),
                        state_dir="/var/lib/tfcluster/b")

    def conditions(self):
        return self.found

    def handle(self, message):
        if message.WhichOneof("kind") == "launch":
            self.launched.set()


@pytest.fixture
def gpu_node(make_cluster):
    cluster = make_cluster()
    node = GpuNode(cluster.credentials(pki.NODE, "b"), [ECC, HOT])
    stopped = threading.Event()
    session = Session(cluster.address, node, stopped, Liveness(["connection"]), on_refused=lambda why: None)
    running = threading.Thread(target=session.run, daemon=True)
    running.start()
    try:
        wait_until(session.registered.is_set, 30, what="the node to register")
        yield cluster, node
    finally:
        stopped.set()
        session.cancel()
        running.join(10)


def node_doc(cluster) -> dict:
    return json.loads(cluster.cli("status", "--json", check=True).stdout)["nodes"][0]


def test_a_sick_gpu_is_left_out_with_its_reason_shown_until_its_condition_clears(gpu_node):
    cluster, node = gpu_node
    doc = node_doc(cluster)
    assert [(c["gpu"], c["kind"], c["excludes"]) for c in doc["conditions"]] == \
        [(1, "ecc-uncorrectable", True), (0, "throttled", False)]
    assert doc["conditions"][0]["since"] == ECC.since and doc["schedulable"] is True
    text = cluster.cli("status", check=True).stdout
    assert "0:Test GPU!, 1:Test GPU!" in text and "! b GPU 1: uncorrectable ECC errors" in text

    job = cluster.cli("start", "--name", "both", "--strategy", "mirrored", "--gpus-per-task", "2", "--", "true",
                      check=True).stdout.strip()
    wait_until(lambda: "GPU 1 of node b excluded: uncorrectable ECC errors" in cluster.job(job)["message"], 30,
               what="the waiting job's reason")
    assert cluster.job(job)["state"] == "PENDING" and not node.launched.is_set()

    node.found = (HOT,)  # the GPU was reset: its next heartbeat no longer lists the ECC errors
    wait_until(node.launched.is_set, 30, what="the job placed on both GPUs")
    assert [t["gpus"] for t in cluster.job(job)["tasks"]][0] == [
        {"index": i, "uuid": f"GPU-b-{i}", "name": "Test GPU", "memory_mib": 1024} for i in range(2)]
    wait_until(lambda: [c["kind"] for c in node_doc(cluster)["conditions"]] == ["throttled"], 10,
               what="status to show the throttling alone")
