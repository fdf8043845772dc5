"""An elastic multi_worker_mirrored job on a real cluster: three agents with one GPU each, a job with
`count = "2..3"` starts at 2 while another job holds the third GPU, grows to 3 once that job is stopped (every
task's TF_CONFIG and TFCLUSTER_NUM_WORKERS then say 3, uncharged), shrinks back to 2, uncharged, when an agent
is killed, and grows again when that agent comes back. The program is plain Python: it prints the size it was
started at and sleeps.

The job has no restart budget (max_restarts = 0): a resize charged to it would fail the job."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpuholder import hold_gpu
from harness import running_cluster, wait_until

PROGRAM = """\
import json, os, time
cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
print(f"workers={len(cluster['worker'])} num_workers={os.environ['TFCLUSTER_NUM_WORKERS']}"
      f" attempt={os.environ['TFCLUSTER_ATTEMPT']}", flush=True)
time.sleep(600)
"""
INTERVAL = 1.0  # resize_interval_seconds


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    path.chmod(0o644)
    return path


@pytest.fixture
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic")
    with running_cluster(root, {name: {"gpus": 1} for name in ("a", "b", "c")}) as cluster:
        yield cluster


def start(cluster, spec: Path) -> str:
    return cluster.cli("start", str(spec), check=True).stdout.strip()


def sizes_seen(cluster, job_id: str, workers: int) -> list[str]:
    """The line each RUNNING worker's current attempt printed (empty for one that printed nothing yet)."""
    job = cluster.job(job_id)
    tasks = [t for t in job["tasks"] if t["type"] == "worker"]
    if len(tasks) != workers or any(t["state"] != "RUNNING" for t in tasks):
        return []
    return [cluster.cli("logs", job_id, f"worker:{t['index']}").stdout.strip() for t in tasks]


def runs_at(cluster, job_id: str, workers: int) -> bool:
    lines = sizes_seen(cluster, job_id, workers)
    return bool(lines) and all(line.startswith(f"workers={workers} num_workers={workers} ") for line in lines)


def nodes_of(cluster, job_id: str) -> set[str]:
    return {t["node"] for t in cluster.job(job_id)["tasks"]}


def resized_to(cluster, job_id: str, workers: int, resizes: int, note: str, nodes: set[str]) -> None:
    """Waits until every worker runs at that size, then checks what status says of it: nothing charged (the job
    has no budget: it would have failed), the resize counted and noted, the workers on those nodes."""
    wait_until(lambda: runs_at(cluster, job_id, workers), 30, what=f"the job to run at {workers} workers")
    job = cluster.job(job_id)
    assert job["state"] == "RUNNING"
    assert job["workers"] == {"min": 2, "max": 3, "current": workers, "resizes": resizes}
    assert job["restarts"] == 0 and job["preemptions"] == 0
    assert note in job["message"]
    assert nodes_of(cluster, job_id) == nodes


def test_elastic_job_starts_small_grows_when_capacity_frees_and_shrinks_when_a_node_is_lost(cluster, tmp_path):
    program = write(tmp_path / "sizes.py", PROGRAM)
    blocker = hold_gpu(cluster, tmp_path, "c")
    elastic = start(cluster, write(tmp_path / "elastic.toml", f"""
        name = "elastic"
        strategy = "multi_worker_mirrored"
        command = ["{sys.executable}", "{program}"]
        stop_grace_seconds = 5
        [roles.worker]
        count = "2..3"
        gpus = 1
        [restart]
        max_restarts = 0
        [elastic]
        resize_interval_seconds = {INTERVAL}
    """))

    resized_to(cluster, elastic, 2, resizes=0, note="started with 2 workers (elastic 2..3)", nodes={"a", "b"})

    time.sleep(INTERVAL)  # it may grow as soon as the capacity frees
    freed = time.monotonic()
    cluster.cli("stop", blocker, check=True)
    resized_to(cluster, elastic, 3, resizes=1, note="resized 2 \u2192 3 workers", nodes={"a", "b", "c"})
    grown = time.monotonic() - freed

    lost = time.monotonic()
    cluster.lose_node("c")  # a shrink above the smallest size is not charged
    resized_to(cluster, elastic, 2, resizes=2, note="resized 3 \u2192 2 workers", nodes={"a", "b"})
    shrunk = time.monotonic() - lost
    print(f"capacity freed -> running at 3: {grown:.1f} s; agent killed -> running at 2: {shrunk:.1f} s")

    cluster.start_agent("c", gpus=1)  # the node comes back: the job grows onto it again
    resized_to(cluster, elastic, 3, resizes=3, note="resized 2 \u2192 3 workers", nodes={"a", "b", "c"})

    cluster.cli("stop", elastic, check=True)
