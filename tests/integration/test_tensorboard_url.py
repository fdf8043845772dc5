"""`tfcluster tensorboard JOB...` prints a one-time link to the coordinator's own TensorBoard, on a real
LocalCluster over mutual TLS with its HTTPS dashboard: a real TensorFlow job writes tf.summary scalars on two
nodes that share no storage; a browser (here urllib, with the cluster CA and the session cookie the link sets)
reads them back through TensorBoard's HTTP API, runs named JOB/TASK, several jobs side by side, a new scalar
within 5 s; another user gets the same refusal for that job as for none at all, through the CLI, through a
link of their own and on the raw URL; the summaries stay after the job ends and its node is lost, and the
cluster goes on working."""

from __future__ import annotations

import http.client
import importlib.util
import json
import ssl
import time
import urllib.parse

import pytest

from harness import LocalCluster, free_port, wait_until

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None
                                or importlib.util.find_spec("tensorboard") is None, reason="needs the tf extra")

# A scalar `loss` = step / 10 each 0.3 s, with TensorFlow's own tf.summary, flushed at once as a training loop
# configured for live curves does.
TF_WRITER = """
import os, time
import tensorflow as tf
writer = tf.summary.create_file_writer(os.environ["TFCLUSTER_SUMMARY_DIR"])
with writer.as_default():
    for step in range(100000):
        tf.summary.scalar("loss", step / 10, step=step)
        writer.flush()
        time.sleep(0.3)
"""
# A short job's three points, with tensorboard's event writer (no TensorFlow: it starts at once).
SHORT_WRITER = """
import os, time
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
writer = EventFileWriter(os.environ["TFCLUSTER_SUMMARY_DIR"])
for step in range(3):
    value = summary_pb2.Summary.Value(tag="accuracy", simple_value=step / 2)
    writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value])))
writer.flush()
"""


class Browser:
    """What a browser does with the dashboard: trusts the cluster CA, has no client certificate, keeps cookies."""

    def __init__(self, cluster: LocalCluster, address: str):
        self.address = address
        self.context = ssl.create_default_context(cafile=str(cluster.admin_dir / "ca.crt"))
        self.cookie = ""

    def get(self, path: str) -> tuple[int, dict, bytes]:
        host, port = self.address.rsplit(":", 1)
        connection = http.client.HTTPSConnection(host, int(port), context=self.context, timeout=30)
        try:
            connection.request("GET", path, headers={"Cookie": self.cookie} if self.cookie else {})
            reply = connection.getresponse()
            return reply.status, dict(reply.getheaders()), reply.read()
        finally:
            connection.close()

    def open_link(self, url: str) -> str:
        """Opens a one-time link; returns where it leads."""
        parsed = urllib.parse.urlsplit(url)
        status, headers, body = self.get(f"{parsed.path}?{parsed.query}")
        assert status == 302, (status, body)
        self.cookie = headers["Set-Cookie"].split(";", 1)[0]
        return headers["Location"]

    def scalars(self, board: str, run: str, tag: str) -> list:
        status, _, body = self.get(f"{board}data/plugin/scalars/scalars?" + urllib.parse.urlencode(
            {"run": run, "tag": tag}))
        return json.loads(body) if status == 200 else []  # 400 for a run TensorBoard has not loaded yet


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    http = f"127.0.0.1:{free_port()}"
    cluster = LocalCluster(root=tmp_path_factory.mktemp("board"))
    try:
        cluster.start_coordinator("--http-listen", http)
        cluster.start_agents({"a": {"gpus": 2}, "b": {"gpus": 2}})  # 2 tasks of 2 GPUs: one on each node
        cluster.http = http
        yield cluster
    finally:
        cluster.teardown()


def person_cli(cluster: LocalCluster, person: str, *args: str, check: bool = True):
    return cluster.cli(*args, timeout=90, check=check, env={"TFCLUSTER_TLS_DIR": str(cluster.person(person))})


def test_the_coordinator_serves_a_tensorboard_of_a_users_jobs_to_that_user_only(cluster):
    training = person_cli(cluster, "alice", "start", "--name", "train", "--strategy", "multi_worker_mirrored",
                          "--workers", "2", "--gpus-per-task", "2", "--", "python3", "-c", TF_WRITER).stdout.strip()
    short = person_cli(cluster, "alice", "start", "--name", "short", "--strategy", "mirrored", "--wait", "--",
                       "python3", "-c", SHORT_WRITER).stdout.strip()
    assert sorted(t["node"] for t in cluster.job(training)["tasks"]) == ["a", "b"]

    link = person_cli(cluster, "alice", "tensorboard", training, short, "--no-browser").stdout.strip()
    assert link.startswith(f"https://{cluster.http}/login?"), link
    alice = Browser(cluster, cluster.http)
    board = alice.open_link(link)
    assert board == f"/tensorboard/{'+'.join(sorted([training, short]))}/"
    status, headers, page = alice.get(board)  # TensorBoard's own page, started for this view
    assert status == 200 and b"<tb-webapp>" in page, (status, page[:300])
    assert "frame-ancestors 'self'" in headers["Content-Security-Policy"]

    for task in ("worker:0", "worker:1"):  # one run per task, written on two nodes
        wait_until(lambda: len(alice.scalars(board, f"{training}/{task}", "loss")) >= 3, 120,
                   what=f"{task}'s scalars through the URL")
        points = alice.scalars(board, f"{training}/{task}", "loss")
        steps = [step for _, step, _ in points]
        assert steps == list(range(len(steps))), steps
        assert [round(value, 3) for _, _, value in points[:3]] == [0.0, 0.1, 0.2]
    wait_until(lambda: alice.scalars(board, f"{short}/worker:0", "accuracy"), 30, what="the second job's run")
    assert [step for _, step, _ in alice.scalars(board, f"{short}/worker:0", "accuracy")] == [0, 1, 2]
    _, _, runs = alice.get(f"{board}data/runs")
    assert {f"{training}/worker:0", f"{training}/worker:1", f"{short}/worker:0"} <= set(json.loads(runs))

    lags = []  # written on the node (the event's wall time) -> served through the URL
    for _ in range(10):
        newest = max(wall for wall, _, _ in alice.scalars(board, f"{training}/worker:1", "loss"))
        lags.append(time.time() - newest)
        time.sleep(0.5)
    assert max(lags) < 5, lags

    # Bob: the same answer for Alice's job as for a job that is not there, on every way in.
    mine = person_cli(cluster, "bob", "tensorboard", training, "--no-browser", check=False)
    none = person_cli(cluster, "bob", "tensorboard", "nosuch-1", "--no-browser", check=False)
    assert mine.returncode == none.returncode != 0 and mine.stdout == none.stdout == ""
    assert mine.stderr.replace(training, "JOB") == none.stderr.replace("nosuch-1", "JOB"), (mine, none)
    bob = Browser(cluster, cluster.http)
    bob.open_link(person_cli(cluster, "bob", "dashboard").stdout.strip())
    refused, absent = bob.get(f"/tensorboard/{training}/"), bob.get("/tensorboard/nosuch-1/")
    assert refused[0] == absent[0] == 404
    assert refused[2].replace(training.encode(), b"JOB") == absent[2].replace(b"nosuch-1", b"JOB")
    assert bob.get(f"{board}data/plugin/scalars/scalars?run={training}/worker:0&tag=loss")[0] == 404
    assert Browser(cluster, cluster.http).get(board)[0] == 401, "no session, no certificate"

    # The job ends and node b is lost: what it sent stays readable.
    assert person_cli(cluster, "alice", "stop", training).returncode == 0
    held = len(alice.scalars(board, f"{training}/worker:1", "loss"))
    cluster.agents["b"].kill()
    time.sleep(2)
    assert len(alice.scalars(board, f"{training}/worker:1", "loss")) >= held
    again = Browser(cluster, cluster.http)  # a new link, after the job ended
    again.open_link(person_cli(cluster, "alice", "tensorboard", training, "--no-browser").stdout.strip())
    wait_until(lambda: len(again.scalars(f"/tensorboard/{training}/", f"{training}/worker:1", "loss")) >= held, 60,
               what="the ended job's scalars on a new board")

    after = person_cli(cluster, "alice", "start", "--name", "after", "--strategy", "mirrored", "--wait", "--",
                       "true")
    assert cluster.job(after.stdout.strip())["state"] == "SUCCEEDED", "the cluster keeps working"
