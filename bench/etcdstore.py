"""The etcd store against the SQLite store, measured in the same run on this machine.

1. The latency and rate of writing a typical batch: a job submitted (its job document and its four tasks'),
   then its four tasks' state changes in one batch, written one batch after another as the coordinator's single
   writer does. etcd: a three-member cluster on loopback, every member on this machine's disk (fsync on).
2. A coordinator's start with N jobs in the store: opening the store and building the cluster from it.

Needs Debian's `etcd` (package etcd-server). Usage: python bench/etcdstore.py [--jobs 1000,5000] [--batches 300]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from etcdcluster import ETCD, EtcdCluster  # noqa: E402
from tfcluster import __version__  # noqa: E402
from tfcluster.daemon.coordinator.core.cluster import Cluster  # noqa: E402
from tfcluster.daemon.coordinator.rpc.coordinator import build  # noqa: E402
from tfcluster.daemon.coordinator.store.api import Put, Store  # noqa: E402
from tfcluster.daemon.coordinator.store.etcd_gateway import EtcdTls  # noqa: E402
from tfcluster.daemon.coordinator.store.open import open_store  # noqa: E402
from tfcluster.daemon.coordinator.store.records import Writer  # noqa: E402
from tfcluster.model import NodeInfo  # noqa: E402
from tfcluster.specfile import parse_spec  # noqa: E402

PLAIN_HTTP = EtcdTls(insecure=True)  # the bench's etcd serves loopback alone
SPEC = parse_spec({"name": "bench", "strategy": "multi_worker_mirrored", "command": ["python", "train.py"],
                   "roles": {"chief": {"count": 1}, "worker": {"count": 3}}, "workdir": "/work/job",
                   "env": {"DATA": "/data/imagenet", "BATCH": "256"}}, "bench")


def submissions(jobs: int) -> list[list[Put]]:
    """The batches a coordinator writes when `jobs` jobs of four tasks are submitted one after another."""
    cluster = Cluster()
    for n in range(40):  # room for every job: none waits in the queue
        cluster.register(NodeInfo(name=f"n{n}", address=f"10.0.0.{n}", port_range=(20000, 20999), gpus=(),
                                  state_dir="/state", agent_version=__version__), [], f"s{n}", 1.0)
    for i in range(jobs):
        cluster.submit(replace(SPEC, name=f"bench{i}"), 1.0 + i)
    # Collected once and cut by job (collecting after each submission looks at every live job each time)
    by_job: dict[str, list[Put]] = {}
    for (kind, key), write in Writer().collect(cluster.changes).writes.items():
        if kind in ("job", "task"):
            by_job.setdefault(key.partition("/")[0], []).append(write)
    return list(by_job.values())


def write_all(store: Store, batches: list[list[Put]], changed_tasks: bool = False) -> list[float]:
    """Each submission's batch (and, changed_tasks, then a batch of its four tasks changed), with the revisions
    the store gave; the latency of each write."""
    latencies, revisions = [], {}
    for batch in batches:
        for writes in ([batch, [w for w in batch if w.kind == "task"]] if changed_tasks else [batch]):
            writes = [replace(w, expect=revisions.get((w.kind, w.key), 0)) for w in writes]
            t = time.perf_counter()
            revisions.update(store.write(writes))
            latencies.append(time.perf_counter() - t)
    return latencies


def start_time(url: str, state_dir: Path) -> tuple[float, int]:
    t = time.perf_counter()
    coordinator = build(state_dir, 3.0, 1.0, 100_000, 1e9, store_url=url,
                        etcd_tls=PLAIN_HTTP if url.startswith("etcd://") else None)
    elapsed = time.perf_counter() - t
    jobs = len(coordinator.cluster.jobs)
    coordinator.store.close()
    return elapsed, jobs


def summary(latencies: list[float]) -> str:
    ms = sorted(x * 1000 for x in latencies)
    return f"p50 {statistics.median(ms):.2f} ms, p99 {ms[int(len(ms) * 0.99) - 1]:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", default="1000,5000")
    parser.add_argument("--batches", type=int, default=300)
    args = parser.parse_args()
    if ETCD is None:
        print("skipped: no etcd binary (apt-get install etcd-server)")
        return
    # Plain HTTP to an etcd on loopback is meant here: the warning each store opened gives would bury the figures
    logging.getLogger("tfcluster.coordinator").setLevel(logging.ERROR)
    root = Path(tempfile.mkdtemp(prefix="tfcluster-bench-etcd-"))
    etcd = EtcdCluster(root / "etcd").start_all()
    try:
        stores = {"sqlite": f"sqlite://{root}/latency.sqlite3", "etcd": etcd.url("/latency")}
        batches = submissions(args.batches)
        for name, url in stores.items():
            store = open_store(url, root, PLAIN_HTTP if name == "etcd" else None)
            started = time.perf_counter()
            latencies = write_all(store, batches, changed_tasks=True)
            rate = len(latencies) / (time.perf_counter() - started)
            store.close()
            print(f"write a batch ({name}): {summary(latencies)}, {rate:.0f} batches/s one after another")
        for jobs in (int(n) for n in args.jobs.split(",")):
            many = submissions(jobs)
            for name, url in {"sqlite": f"sqlite://{root}/start-{jobs}.sqlite3",
                              "etcd": etcd.url(f"/start-{jobs}")}.items():
                store = open_store(url, root, PLAIN_HTTP if name == "etcd" else None)
                write_all(store, many)
                store.close()
                elapsed, loaded = start_time(url, root / "state")
                print(f"start with {loaded} jobs ({name}): {elapsed:.2f} s")
    finally:
        etcd.stop_all()


if __name__ == "__main__":
    main()
