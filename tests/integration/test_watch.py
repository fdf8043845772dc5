"""Following a job: WatchJob streams a job's status at each change until it ends, `tfcluster start --wait` and
`--follow` use it instead of asking again and again, and a coordinator without it is polled as before."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest

from harness import LocalCluster, free_port, scrape, value
from tfcluster.api.v1 import control_pb2
from tfcluster.client import Client
from tfcluster.credentials import Credentials
from tfcluster.errors import ClusterError
from tfcluster.specfile import parse_spec
from tfcluster.states import ENDED_JOB_STATES


@pytest.fixture(scope="module")
def watched_cluster(tmp_path_factory):
    """A coordinator with its /metrics (calls counted by method) and two agents."""
    http = f"127.0.0.1:{free_port()}"
    cluster = LocalCluster(root=tmp_path_factory.mktemp("watch"))
    try:
        cluster.start_coordinator("--http-listen", http)
        cluster.start_agents({"a": {}, "b": {}})
        cluster.http = http
        yield cluster
    finally:
        cluster.teardown()


def rpc_count(cluster, method: str) -> float:
    admin = {"ca": str(cluster.admin_dir / "ca.crt"), "cert": str(cluster.admin_dir / "client.crt"),
             "key": str(cluster.admin_dir / "client.key")}
    return value(scrape(f"https://{cluster.http}/metrics", admin), "tfcluster_rpc_requests", method=method,
                 code="OK") or 0


def test_the_stream_sends_each_change_once_and_ends_with_the_job(watched_cluster):
    with watched_cluster.client() as client:
        job_id = client.submit(parse_spec({"name": "streamed", "strategy": "multi_worker_mirrored", "workdir": "/",
                                           "command": ["sh", "-c", "sleep 1"], "roles": {"worker": {"count": 2}}},
                                          source="test"))
        views = list(client.watch(job_id, ENDED_JOB_STATES))
    states = [v.state for v in views]
    assert states[-1] == "SUCCEEDED" and "RUNNING" in states, states
    assert all(a != b for a, b in zip(views, views[1:])), "a status is sent only when it changed"
    assert [t.state for t in views[-1].tasks] == ["SUCCEEDED", "SUCCEEDED"]


def test_start_wait_follows_the_stream_without_polling(watched_cluster):
    polls_before = rpc_count(watched_cluster, "GetStatus")
    result = watched_cluster.cli("start", "--name", "waited", "--strategy", "multi_worker_mirrored", "--workers", "2",
                                 "--wait", "--", "sh", "-c", "sleep 2")
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    lines = [line for line in result.stderr.splitlines() if line.startswith(job_id)]
    assert lines[-1] == f"{job_id}: SUCCEEDED" and f"{job_id}: RUNNING" in lines, result.stderr
    assert rpc_count(watched_cluster, "GetStatus") == polls_before, "no status asked for while waiting"
    assert rpc_count(watched_cluster, "WatchJob") >= 1
    failed = watched_cluster.cli("start", "--name", "waitfail", "--strategy", "mirrored", "--max-restarts", "0",
                                 "--wait", "--", "sh", "-c", "exit 3")
    assert failed.returncode == 1 and "FAILED" in failed.stderr.splitlines()[-1]


def test_follow_prints_the_primary_log_and_the_outcome(watched_cluster):
    result = watched_cluster.cli("start", "--name", "followed", "--strategy", "multi_worker_mirrored", "--workers",
                                 "2", "--follow", "--", "sh", "-c", "echo from-$TFCLUSTER_TASK_INDEX")
    assert result.returncode == 0, result.stderr
    job_id, *printed = result.stdout.split()
    assert printed == ["from-0"], result.stdout
    assert result.stderr.splitlines()[-1] == f"{job_id}: SUCCEEDED"


def test_watching_an_unknown_job_is_not_found(watched_cluster):
    with watched_cluster.client() as client, pytest.raises(ClusterError, match="unknown job"):
        list(client.watch("nosuch-1-x", ENDED_JOB_STATES))


class StatusOnly(grpc.GenericRpcHandler):
    """A coordinator of a release before WatchJob: it answers GetStatus (a job that ends on the third call)."""

    def __init__(self):
        self.calls = 0
        self.lock = threading.Lock()

    def service(self, details):
        if details.method != "/tfcluster.v1.ControlService/GetStatus":
            return None  # gRPC answers UNIMPLEMENTED, as an older server does
        return grpc.unary_unary_rpc_method_handler(self.status, control_pb2.GetStatusRequest.FromString,
                                                   control_pb2.GetStatusResponse.SerializeToString)

    def status(self, request, context):
        with self.lock:
            self.calls += 1
            state = ("STARTING", "RUNNING", "SUCCEEDED")[min(self.calls, 3) - 1]
        return control_pb2.GetStatusResponse(jobs=[control_pb2.JobStatus(id=request.job_id, state=state)])


def test_a_coordinator_without_watch_is_polled(monkeypatch):
    monkeypatch.setattr("tfcluster.client.POLL_SECONDS", 0.01)
    handler = StatusOnly()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with Client(f"127.0.0.1:{port}", Credentials()) as client:
            states = [job.state for job in client.watch("old-1-x", ENDED_JOB_STATES)]
    finally:
        server.stop(0)
    assert states == ["STARTING", "RUNNING", "SUCCEEDED"] and handler.calls == 3
