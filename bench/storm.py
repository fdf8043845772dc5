"""Cold starts (a benchmark, not a test): a real `tfcluster coordinator` over mutual TLS, an admin's status call
started every STATUS_EVERY_SECONDS on a thread, and N fake agents (tests/fleet.py, as in bench/scale.py) that all
start at once. Each run, on a new coordinator, measures:

- the seconds until every node is READY;
- how many nodes the coordinator declared lost meanwhile (its log names each one) and the most its status ever
  showed LOST: a node counted lost for being slow to be heard during the storm, not for being gone;
- GetStatus p50/p99 while the agents register (until all are READY) and in the steady state after it: the
  baseline, measured in the same run.

Run with `python bench/storm.py [N] [--runs R]` (default 5,000 agents, 3 runs); writes bench/storm.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psutil

from scale import FLEET_NICE, Fleet, start_server  # puts tests/ and the repo on the path
from harness import free_port, kill_group  # noqa: E402
from streamflood import percentile  # noqa: E402

STATUS_EVERY_SECONDS = 0.05
STEADY_SECONDS = 10.0
READY_TIMEOUT_SECONDS = 180.0
LOST_LINE = " lost (no heartbeat"  # how the coordinator's log says it declared a node lost


class Sampler:
    """Status calls one after another, each with its time, and the READY and LOST counts it showed (READY -1: it
    failed)."""

    def __init__(self, client) -> None:
        self.client, self.samples, self.stopping = client, [], False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping:
            started = time.perf_counter()
            try:
                by_state = self.client.status().summary.nodes_by_state
                ready, lost = by_state.get("READY", 0), by_state.get("LOST", 0)
            except Exception:  # noqa: BLE001 - a failed call counts, with its time
                ready, lost = -1, 0
            self.samples.append((time.monotonic(), time.perf_counter() - started, ready, lost))
            time.sleep(STATUS_EVERY_SECONDS)

    def stop(self) -> None:
        self.stopping = True
        self.thread.join()


def figures(latencies: list[float]) -> dict:
    if not latencies:
        return {"calls": 0}
    return {"calls": len(latencies), "p50_ms": round(statistics.median(latencies) * 1000, 1),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 1), "max_ms": round(max(latencies) * 1000, 1)}


def cold_start(size: int, tmp: Path, paced: bool) -> dict:
    from tfcluster.client import Client
    from tfcluster.security import Credentials
    address, state = f"127.0.0.1:{free_port()}", tmp / f"storm-{size}-{time.monotonic_ns()}"
    state.mkdir()
    log = tmp / "coordinator.log"  # start_server appends each coordinator's output there
    logged = log.stat().st_size if log.exists() else 0
    server = start_server("coordinator", address, state, tmp / "ca", f"127.0.0.1:{free_port()}", paced=paced)
    client, fleet, sampler = Client(address, Credentials.from_dir(tmp / "ca" / "admin")), None, None
    try:
        client.status()
        sampler = Sampler(client)
        began = time.monotonic()
        fleet = Fleet(address, size, tmp / "ca", nice=FLEET_NICE)
        while not sampler.samples or sampler.samples[-1][2] < size:
            if time.monotonic() - began > READY_TIMEOUT_SECONDS:
                raise RuntimeError(f"not all {size} agents READY in {READY_TIMEOUT_SECONDS:g} s")
            time.sleep(0.1)
        ready = time.monotonic()
        time.sleep(STEADY_SECONDS + 2.0)
        sampler.stop()
        during = [s[1] for s in sampler.samples if began <= s[0] < ready]
        steady = [s[1] for s in sampler.samples if s[0] >= ready + 2.0]
        with open(log, "rb") as f:
            f.seek(logged)
            declared_lost = f.read().decode(errors="replace").count(LOST_LINE)
        return {"ready_seconds": round(ready - began, 1), "declared_lost": declared_lost,
                "most_lost_seen": max(s[3] for s in sampler.samples), "storm": figures(during),
                "steady": figures(steady), "status_failed": sum(1 for s in sampler.samples if s[2] < 0)}
    finally:
        if sampler is not None:
            sampler.stop()
        client.close()
        if fleet is not None:
            fleet.stop()
        kill_group(server.pid)
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("size", type=int, nargs="?", default=5000, help="agents [default: 5000]")
    parser.add_argument("--runs", type=int, default=3, help="cold starts, each on a new coordinator [default: 3]")
    parser.add_argument("--unpaced", action="store_true",
                        help="every agent at 1 Hz (--max-heartbeats-per-second 0), not the default bound")
    args = parser.parse_args()
    from tfcluster import pki
    runs = []
    with tempfile.TemporaryDirectory(prefix="tfcluster-storm-") as tmp:
        pki.init_ca(Path(tmp) / "ca", [])
        for i in range(args.runs):
            runs.append(cold_start(args.size, Path(tmp), paced=not args.unpaced))
            print(f"run {i + 1}: {json.dumps(runs[-1])}", flush=True)
    result = {"agents": args.size, "paced": not args.unpaced, "runs": runs, "load_average": " ".join(f"{x:.2f}" for x in psutil.getloadavg()),
              "runs_with_a_node_declared_lost": sum(1 for r in runs if r["declared_lost"] or r["most_lost_seen"])}
    print(f"\n{args.runs} cold starts of {args.size} agents, "
          f"{'heartbeats paced as by default' if result['paced'] else 'every agent at 1 Hz'} "
          f"(load average after: {result['load_average']}):")
    for r in runs:
        print(f"  READY in {r['ready_seconds']} s, declared lost {r['declared_lost']} (most LOST seen "
              f"{r['most_lost_seen']}); status p50 / p99 ms during the storm {r['storm'].get('p50_ms')} / "
              f"{r['storm'].get('p99_ms')}, steady {r['steady'].get('p50_ms')} / {r['steady'].get('p99_ms')}; "
              f"status calls failed {r['status_failed']}")
    print(f"  runs in which a node was declared lost: {result['runs_with_a_node_declared_lost']} of {args.runs}")
    (Path(__file__).parent / "storm.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
