"""What one user's streams cost everyone else (a benchmark, not a test): on a local cluster (a real coordinator and
two agents over mutual TLS), bob, a user, opens STREAMS WatchJob calls on his own running job at once, spread over
CONNECTIONS connections, and holds those the coordinator lets through for SECONDS (tests/flood.py, in a process
of its own at the lowest priority), while alice's 2-task job runs and an admin starts a status call every 20 ms
(tests/streamflood.py). The baseline, in the same run and alternated with the flood: the same status calls for
the same time without it.

It prints status p50/p99 during the flood against the baseline and their ratio, how bob's calls ended, and
whether any node was declared LOST or alice's job restarted. `--connections N` spreads bob's calls over N
connections; `--per-caller N` starts the coordinator with `--max-streams-per-caller N` (0: no bound, to see what
the bound saves: give bob at least 80 connections then, so that the bound of 64 calls on one connection lets
him hold all of his).

Prints a table and writes bench/streams.json. Run with `make bench` or `python bench/streams.py [--connections N]
[--per-caller N]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from harness import LocalCluster, wait_until  # noqa: E402
from streamflood import StatusSampler, flood_streams, nodes_lost, percentile, write_pems  # noqa: E402
from tfcluster.client import Client  # noqa: E402
from tfcluster.credentials import Credentials  # noqa: E402
from tfcluster.specfile import parse_spec  # noqa: E402

STREAMS = 5000
CONNECTIONS = 16
SECONDS = 10.0
ROUNDS = 2


def submit(cluster: LocalCluster, pems: list[str], name: str, workers: int) -> str:
    """A job of the holder of pems that runs until the bench ends, once every task is RUNNING."""
    spec = parse_spec({"name": name, "strategy": "multi_worker_mirrored", "workdir": "/",
                       "command": ["sleep", "3600"], "roles": {"worker": {"count": workers}}}, source="bench")
    ca, cert, key = (Path(p).read_bytes() for p in pems)
    with Client(cluster.address, Credentials(ca, cert, key)) as client:
        job_id = client.submit(spec)
        wait_until(lambda: all(t.state == "RUNNING" for t in client.job(job_id).tasks), 30, what=f"{name} to run")
    return job_id


def figures(latencies: list[float]) -> dict:
    return {"calls": len(latencies), "p50_ms": round(statistics.median(latencies) * 1000, 1),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 1), "max_ms": round(max(latencies) * 1000, 1)}


def measure(cluster: LocalCluster, bob: list[str], bob_job: str, connections: int) -> dict:
    sampler = StatusSampler(cluster).warm_up()
    quiet, flooded, not_ready, failures, floods = [], [], {}, {}, []
    try:
        for _ in range(ROUNDS):  # alternated, so that a change in the machine's load touches both
            with sampler:
                time.sleep(SECONDS)
            quiet += sampler.latencies
            with sampler:
                floods.append(flood_streams(cluster, bob, bob_job, STREAMS, connections, SECONDS))
            flooded += sampler.latencies
            for kept, seen in ((not_ready, sampler.not_ready), (failures, sampler.failures)):
                for key, count in seen.items():
                    kept[key] = kept.get(key, 0) + count
            time.sleep(1.0)  # the held calls' cancellations reach the coordinator
    finally:
        sampler.close()
    codes: dict[str, int] = {}
    for flood in floods:
        for code, count in flood["codes"].get("watch", {}).items():
            codes[code] = codes.get(code, 0) + count
    return {"baseline": figures(quiet), "flood": figures(flooded), "bob_calls": codes,
            "bob_held": [f["held"] for f in floods],
            "all_answered_seconds": [f["all_answered_seconds"] for f in floods],
            "refusal": next((f["details"]["watch RESOURCE_EXHAUSTED"] for f in floods
                             if "watch RESOURCE_EXHAUSTED" in f["details"]), ""),
            "status_failures": failures, "not_ready_seen": not_ready}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-caller", type=int, default=None, help="--max-streams-per-caller for the coordinator")
    parser.add_argument("--connections", type=int, default=CONNECTIONS,
                        help=f"bob's connections [default: {CONNECTIONS}]")
    args = parser.parse_args()
    extra = [] if args.per_caller is None else ["--max-streams-per-caller", str(args.per_caller)]
    cluster = LocalCluster(root=Path(tempfile.mkdtemp(prefix="tfcluster-streams-")))
    try:
        cluster.start_coordinator(*extra)
        cluster.start_agents({"a": {}, "b": {}})
        alice, bob = write_pems(cluster, "user", "alice"), write_pems(cluster, "user", "bob")
        bob_job = submit(cluster, bob, "bobs", 1)
        alice_job = submit(cluster, alice, "alices", 2)
        result = measure(cluster, bob, bob_job, args.connections)
        result["nodes_lost"] = nodes_lost(cluster)
        result["alice_restarts"] = cluster.job(alice_job)["restarts"]
    finally:
        cluster.teardown()
    result["ratio"] = {k: round(result["flood"][k] / result["baseline"][k], 2) for k in ("p50_ms", "p99_ms")}
    result["per_caller"] = "default" if args.per_caller is None else args.per_caller
    result["connections"] = args.connections
    result["load_average"] = " ".join(f"{x:.2f}" for x in psutil.getloadavg())
    report(result)
    (Path(__file__).parent / "streams.json").write_text(json.dumps(result, indent=2) + "\n")


def report(r: dict) -> None:
    b, f = r["baseline"], r["flood"]
    print(f"bob opens {STREAMS} WatchJob calls over {r['connections']} connections, holds those let through for "
          f"{SECONDS:g} s; {ROUNDS} rounds (--max-streams-per-caller: {r['per_caller']}):")
    print(f"  status without the flood (baseline): p50 {b['p50_ms']} ms, p99 {b['p99_ms']} ms, max {b['max_ms']} ms "
          f"({b['calls']} calls)")
    print(f"  status during the flood:             p50 {f['p50_ms']} ms ({r['ratio']['p50_ms']}x), p99 {f['p99_ms']} "
          f"ms ({r['ratio']['p99_ms']}x), max {f['max_ms']} ms ({f['calls']} calls)")
    print(f"  bob's calls: {r['bob_calls']}, held {r['bob_held']}, all answered within {r['all_answered_seconds']} s")
    print(f"  refusal: {r['refusal'] or '(none)'}")
    print(f"  nodes declared LOST: {r['nodes_lost']}; node states other than READY seen: "
          f"{r['not_ready_seen'] or 'none'}; status calls failed: {r['status_failures'] or 'none'}; "
          f"alice's job restarts: {r['alice_restarts']}")
    print(f"  load average after: {r['load_average']}")


if __name__ == "__main__":
    sys.exit(main())
