"""Summaries travel from a task's node to the coordinator as they are written, and `tfcluster tensorboard --local`
serves them through a real TensorBoard on the caller's machine, on a real LocalCluster over mutual TLS: a task
writes a scalar with tensorboard's own event writer into TFCLUSTER_SUMMARY_DIR; the coordinator holds it within
seconds; the URL the command prints answers TensorBoard's scalars API with it under the run JOB/worker:0;
another user is refused; the summaries stay after the job has ended."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from harness import PYTHON, LocalCluster, kill_group, running_cluster, wait_until
from tfcluster import Cluster

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs the tf extra")

# Writes the scalar `loss` = step / 10 at steps 0, 1, 2, ... every 0.3 s, each flushed at once, as a training loop
# does; the wall time in each event is when it was written on the node.
WRITER = """
import os, time
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
writer = EventFileWriter(os.environ["TFCLUSTER_SUMMARY_DIR"])
print("summary dir", os.environ["TFCLUSTER_SUMMARY_DIR"], flush=True)
for step in range(1000):
    value = summary_pb2.Summary.Value(tag="loss", simple_value=step / 10)
    writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value])))
    writer.flush()
    time.sleep(0.3)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("tensorboard"), {"a": {}}) as cluster:
        yield cluster


def stored_steps(cluster: LocalCluster, job_id: str) -> dict[int, float]:
    """Step -> the wall time it was written at, of the worker's events the coordinator holds."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    found = {}
    for path in (cluster.root / "coordinator" / "summaries" / job_id / "worker-0").glob("events.out.tfevents.*"):
        for record in RawEventFileLoader(str(path)).Load():
            event = event_pb2.Event.FromString(record)
            if event.summary.value:
                found[event.step] = event.wall_time
    return found


def scalars(url: str, run: str, tag: str) -> list:
    query = urllib.parse.urlencode({"run": run, "tag": tag})
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/data/plugin/scalars/scalars?{query}", timeout=5) as reply:
            return json.loads(reply.read())
    except OSError:
        return []  # not loaded yet: TensorBoard answers 400 for a run it does not know


def test_a_scalar_written_on_a_node_is_served_by_tensorboard_to_its_owner_alone(cluster):
    with Cluster(cluster.address, cluster.person("alice")) as alice:
        job = alice.start({"name": "curves", "strategy": "mirrored", "workdir": "/",
                           "command": ["python3", "-c", WRITER]})
        wait_until(lambda: len(stored_steps(cluster, job.id)) >= 2, 30, what="the summaries at the coordinator")
        lags = []
        for _ in range(5):  # written on the node -> held by the coordinator
            newest = max(stored_steps(cluster, job.id).values())
            lags.append(time.time() - newest)
            time.sleep(0.5)
        assert max(lags) < 5, lags
        assert "summary dir" in job.log_text("worker:0")

        board = subprocess.Popen([PYTHON, "-m", "tfcluster.cli", "tensorboard", job.id, "--local", "--no-browser"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                 env={**os.environ, **cluster.client_env(),
                                      "TFCLUSTER_TLS_DIR": str(cluster.person("alice"))})
        try:
            url = board.stdout.readline().strip()
            if not url.startswith("http://127.0.0.1:"):
                kill_group(board.pid)
                pytest.fail(f"no URL ({url!r}): {board.stderr.read()[-3000:]}")
            run = f"{job.id}/worker:0"
            wait_until(lambda: scalars(url, run, "loss"), 30, what="the scalars through TensorBoard")
            points = scalars(url, run, "loss")
            assert [(step, round(value, 3)) for _, step, value in points[:2]] == [(0, 0.0), (1, 0.1)]
            # Written on the node -> served through the URL, once TensorBoard's first reload is behind it (on a
            # busy machine that one can take seconds longer: it loads its plugins).
            time.sleep(3)
            served = []
            for _ in range(10):
                served.append(time.time() - max(wall for wall, _, _ in scalars(url, run, "loss")))
                time.sleep(0.5)
            assert max(served) < 5, served
            print(f"lag to the coordinator: {[round(x, 2) for x in lags]} s; through the URL: "
                  f"{[round(x, 2) for x in served]} s")

            refused = cluster.cli("tensorboard", job.id, "--local", "--no-browser", timeout=60,
                                  env={"TFCLUSTER_TLS_DIR": str(cluster.person("bob"))})
            assert refused.returncode != 0 and f"job {job.id} belongs to alice" in refused.stderr, refused
            assert refused.stdout == "", "no URL for another user's job"
        finally:
            kill_group(board.pid)
            board.wait(10)
        assert job.stop() == "STOPPED"
        held = stored_steps(cluster, job.id)
        time.sleep(1.5)
        assert stored_steps(cluster, job.id) == held and len(held) >= 10, "kept after the job ended"
