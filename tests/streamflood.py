"""One user's streams against a real cluster, and what everyone else gets meanwhile: a user opens thousands of
WatchJob calls on his own job from a process of its own (flood.py, so that its threads do not slow the
measuring side), while an admin's status calls are timed on a thread here and every node state other than
READY in their answers is noted. Used by tests/integration/test_stream_limits.py and bench/streams.py.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

from tfcluster.api.v1 import control_pb2, control_pb2_grpc

FLOOD = Path(__file__).resolve().parent / "flood.py"
LOST = " lost (no heartbeat for "  # how the coordinator logs a node it declares LOST (cluster.py)


def write_pems(cluster, role: str, name: str) -> list[str]:
    """A certificate of the cluster's CA for name, as [ca, cert, key] PEM files under the cluster's root."""
    credentials = cluster.credentials(role, name)
    directory = cluster.root / "people" / name
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for part, data in (("ca", credentials.ca), ("cert", credentials.cert), ("key", credentials.key)):
        (directory / f"{part}.pem").write_bytes(data)
        paths.append(str(directory / f"{part}.pem"))
    return paths


class StatusSampler:
    """An admin's GetStatus, one call started every `interval` seconds until stopped, whether the ones before
    were answered or not (a client that waited for each answer would ask less often while the coordinator
    stalls, and miss the stall it measures): how long each took, how those that failed failed, and the node
    states other than READY their answers showed."""

    def __init__(self, cluster, interval: float = 0.02):
        self.channel = cluster.channel()
        self.stub = control_pb2_grpc.ControlServiceStub(self.channel)
        self.interval = interval
        self.latencies: list[float] = []
        self.failures: collections.Counter[str] = collections.Counter()
        self.not_ready: collections.Counter[str] = collections.Counter()  # "node STATE" -> answers showing it
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def warm_up(self, calls: int = 20) -> "StatusSampler":
        """The connection made and the first answers given before anything is counted."""
        for _ in range(calls):
            self.stub.GetStatus(control_pb2.GetStatusRequest(), timeout=30)
        return self

    def _answered(self, future, started: float) -> None:
        seconds = time.monotonic() - started
        with self.lock:
            try:
                response = future.result()
            except grpc.RpcError as e:
                self.failures[e.code().name] += 1
                return
            self.latencies.append(seconds)
            self.not_ready.update(f"{n.name} {n.state}" for n in response.nodes if n.state != "READY")

    def _run(self) -> None:
        calls = []
        next_at = time.monotonic()
        while not self.stopping.is_set():
            started = time.monotonic()
            call = self.stub.GetStatus.future(control_pb2.GetStatusRequest(), timeout=30)
            call.add_done_callback(lambda future, started=started: self._answered(future, started))
            calls.append(call)
            next_at += self.interval
            self.stopping.wait(max(0.0, next_at - time.monotonic()))
        for call in calls:  # every call started is answered (or fails) before the figures are read
            try:
                call.result()
            except grpc.RpcError:
                pass

    def __enter__(self) -> "StatusSampler":
        self.latencies, self.failures, self.not_ready = [], collections.Counter(), collections.Counter()
        self.stopping.clear()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join()

    def close(self) -> None:
        self.channel.close()


def flood_streams(cluster, user: list[str], job_id: str, streams: int, connections: int, seconds: float) -> dict:
    """flood.py as the holder of the user PEMs: streams WatchJob calls on job_id over connections connections,
    those let through held for seconds. Returns what it printed: the codes the calls got ("watch": code ->
    count), the first details of each code, how many were held, and how long until every call was answered."""
    config = {"main": cluster.address, "ca": user[0], "user": user, "job": job_id, "streams": streams,
              "connections": connections, "seconds": seconds}
    path = cluster.root / "streams.json"
    path.write_text(json.dumps(config))
    # At the lowest priority: bob's client would run on a machine of its own, not take the coordinator's CPU.
    flood = subprocess.run(["nice", "-n", "19", sys.executable, str(FLOOD), str(path)], capture_output=True,
                           text=True, timeout=seconds + 180)
    if flood.returncode != 0:
        raise AssertionError(f"flood.py exited {flood.returncode}:\n{flood.stderr}")
    return json.loads(flood.stdout)


def nodes_lost(cluster) -> int:
    """How many times the coordinator has declared a node LOST so far."""
    return cluster.coordinator.log().count(LOST)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]
