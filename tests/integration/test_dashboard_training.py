"""A job's live curves and usage, and the sweeps, through the dashboard's JSON API on a real LocalCluster over
mutual TLS: alice's task writes scalars with tensorboard's event writer; the curves grow while it runs and are
thinned past their limit; its usage has samples from heartbeats; bob's own user certificate is refused both, a
viewer reads them; bob's sweep list leaves out alice's sweep."""

from __future__ import annotations

import importlib.util
import json
import ssl
import urllib.error
import urllib.request

import pytest

from harness import LocalCluster, free_port, wait_until
from tfcluster import Cluster

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs the tf extra")

# 1200 steps at once (past the 500 points a curve keeps), then one step every 0.3 s.
WRITER = """
import os, time
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
writer = EventFileWriter(os.environ["TFCLUSTER_SUMMARY_DIR"])
for step in range(100000):
    value = summary_pb2.Summary.Value(tag="loss", simple_value=1 / (step + 1))
    writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value])))
    if step >= 1200:
        writer.flush()
        time.sleep(0.3)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    http = f"127.0.0.1:{free_port()}"
    cluster = LocalCluster(root=tmp_path_factory.mktemp("training"))
    try:
        cluster.start_coordinator("--http-listen", http)
        cluster.start_agents({"a": {}})
        cluster.http = f"https://{http}"
        yield cluster
    finally:
        cluster.teardown()


def fetch(cluster: LocalCluster, person: str, path: str, role: str = "user") -> tuple[int, object]:
    tls = cluster.person(person, role)
    context = ssl.create_default_context(cafile=str(tls / "ca.crt"))
    context.load_cert_chain(str(tls / "client.crt"), str(tls / "client.key"))
    try:
        with urllib.request.urlopen(cluster.http + path, context=context, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def loss(cluster: LocalCluster, job_id: str) -> dict | None:
    status, doc = fetch(cluster, "alice", f"/api/jobs/{job_id}/scalars")
    assert status == 200, doc
    return next((s for s in doc["series"] if s["tag"] == "loss" and s["run"] == "worker:0"), None)


def test_curves_and_usage_grow_while_the_job_runs_for_its_owner_and_viewers_only(cluster):
    with Cluster(cluster.address, cluster.person("alice")) as alice:
        job = alice.start({"name": "curves", "strategy": "mirrored", "workdir": "/",
                           "command": ["python3", "-c", WRITER]})
        wait_until(lambda: (loss(cluster, job.id) or {}).get("written", 0) > 1200, 60, what="the loss curve")
        first = loss(cluster, job.id)
        steps = [p[0] for p in first["points"]]
        assert len(steps) <= 501 and first["stride"] >= 4 and steps == sorted(steps) and steps[0] == 0
        assert all(len(p) == 3 for p in first["points"]) and first["points"][0][1] == 1.0
        wait_until(lambda: loss(cluster, job.id)["written"] > first["written"] + 3, 20, what="the curve to grow")
        assert loss(cluster, job.id)["points"][-1][0] > steps[-1]

        def usage_points() -> list:
            return [p for t in fetch(cluster, "alice", f"/api/jobs/{job.id}/usage")[1]["tasks"] for p in t["points"]]
        wait_until(lambda: len(usage_points()) >= 2, 40, what="usage samples from heartbeats")
        _, usage = fetch(cluster, "alice", f"/api/jobs/{job.id}/usage")
        [task] = usage["tasks"]
        assert task["task"] == "worker:0" and task["node"] == "a"
        when, cores, rss, gpu = task["points"][-1]
        assert cores >= 0 and rss > 10 << 20 and when > 0
        assert gpu is None, "no GPU use where the agent does not read its GPUs through NVML"

        for path in (f"/api/jobs/{job.id}/scalars", f"/api/jobs/{job.id}/usage"):
            status, body = fetch(cluster, "bob", path)
            assert status == 403 and f"job {job.id} belongs to alice" in body, (path, status, body)
            status, _ = fetch(cluster, "grafana", path, role="viewer")
            assert status == 200, path
        assert job.stop() == "STOPPED"


def test_sweeps_are_listed_with_their_trials_to_whom_they_may_be_shown(cluster):
    with Cluster(cluster.address, cluster.person("alice")) as alice:
        sweep = alice.sweep({"name": "grid", "strategy": "mirrored", "workdir": "/", "command": ["true"],
                             "sweep": {"method": "grid", "max_concurrent": 1, "metric": "accuracy", "goal": "max",
                                       "parameters": {"A": [1, 2]}}})
        sweep.wait(timeout=90)
    status, doc = fetch(cluster, "alice", "/api/sweeps")
    [row] = [s for s in doc["sweeps"] if s["id"] == sweep.id]
    assert (row["name"], row["owner"], row["total"], row["done"], row["metric"]) == ("grid", "alice", 2, 2, "accuracy")
    assert row["best"] is None and len(row["trials"]) == 2 and all(t["job"] and t["kept"] for t in row["trials"])
    assert sweep.id not in [s["id"] for s in fetch(cluster, "bob", "/api/sweeps")[1]["sweeps"]]
    assert sweep.id in [s["id"] for s in fetch(cluster, "grafana", "/api/sweeps", role="viewer")[1]["sweeps"]]
