"""Failover (a benchmark, not a test): N fake agents (tests/fleet.py, as in bench/scale.py, over mutual TLS) on
three `tfcluster coordinator` processes that share one three-member etcd on loopback; kill -9 of the leader.

For N = 100, 1,000 and 5,000 it measures:
- the seconds from the kill until a standby serves (GetStatus answered by it, naming itself in summary.leader),
  until every agent has registered with that new leader again, and until, besides, the new leader counts every
  node READY and none LOST (a node that registered but whose heartbeats came late is lost and registers again);
- how many nodes each leader declared lost meanwhile, and the agents' failed calls by gRPC status code;
- GetStatus latency p50/p99 on the new leader in a window after all are back;
- etcd's write rate from one member's /metrics: keys put or deleted per second, bytes written to its WAL per
  second and raft proposals per second, at registration, during steady heartbeating (once every agent is READY and
  its pulse holds a watch on each standby) and during the failover.
  Heartbeats write nothing: the steady rate of keys written is expected to be 0, and so is nearly that of raft
  proposals (a standby reads the leader key every POLL_SECONDS; the leader's lease renewals are not proposals);
- how many times a leader lost its lease during the run (a renewal that came too late: leadership.py);
- where the seconds after the kill went, agent by agent (bench/failover_timeline.py): when agents noticed the
  loss, found the new leader (their search named it), sent the registration that succeeded, were registered by the
  new leader (its log, so the coordinators log at info, as they do by default) and read the answer, and how many a
  standby refused first.
- the cores each group of processes used in the failover and in the window after it: after it, the fake agents
  took about ten times the cores they took before the kill while their pulses and gRPC kept dialling the dead
  leader; since agents rest a coordinator they cannot reach, two to three times (docs/ha.md, Limits). Real
  agents pay their share on hosts of their own.

Floors, measured or fixed in the same run: the time to a serving standby against the lease TTL (no lease-based
failover is faster); the time until all are READY again against the time the same fleet took to become READY at
the start; the new leader's GetStatus p99 against the old leader's, measured before the kill with the same fleet.

A size that does not get all READY within READY_TIMEOUT_SECONDS says how far it got, and the next size still runs.
Needs Debian's `etcd` (package etcd-server). Prints a table and writes bench/failover.json.
Run with `make bench` or `python bench/failover.py [N ...]`.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
import psutil

import failover_timeline
from scale import FLEET_NICE, Fleet, _cpu  # bench/scale.py: puts tests/ and the repository on the path
from harness import Daemon, free_port, scrape, value  # noqa: E402
from tfcluster import pki  # noqa: E402
from tfcluster.api.v1 import control_pb2, control_pb2_grpc  # noqa: E402
from tfcluster.daemon.coordinator.ha.leadership import TTL_SECONDS  # noqa: E402
from tfcluster.demo.etcd import EtcdCluster, etcd_binary  # noqa: E402
from tfcluster.security import Credentials  # noqa: E402

SIZES = (100, 1000, 5000)
COORDINATORS = 3
READY_TIMEOUT_SECONDS = 120
SETTLE_SECONDS = 3.0   # after all are READY: registration's last batched writes are stored, every stream beats
WINDOW_SECONDS = 10.0  # each measuring window: steady heartbeating; GetStatus after the failover
STATUS_EVERY_SECONDS = 0.1
POLL_SECONDS = 0.02    # how often a surviving coordinator is asked whether it serves, after the kill
# Fewer fake agents per client process than bench/scale.py puts there: when all of them reconnect at once (TLS
# handshakes, standbys' refusals) 1,000 agents in one Python process fell behind on their own heartbeats, and the
# coordinator rightly declared hundreds of nodes lost. Real agents are one process each; more processes than
# this (250 each: 20 for 5,000) overload a small machine with their threads.
AGENTS_PER_PROCESS = 500
# etcd's counters (one member's: every member applies every write): keys put and deleted, WAL bytes, proposals.
# Family names as prometheus-client's parser gives them: etcd declares the last two gauges, so they keep "_total".
COUNTERS = {"keys": ("etcd_mvcc_put", "etcd_mvcc_delete"), "wal_bytes": ("etcd_disk_wal_write_bytes_total",),
            "proposals": ("etcd_server_proposals_committed_total",)}


class Counters:
    """A snapshot of one etcd member's write counters, and when it was taken."""

    def __init__(self, endpoint: str):
        metrics = scrape(f"http://{endpoint}/metrics", None)
        self.at = time.monotonic()
        self.values = {name: sum(value(metrics, family) or 0.0 for family in families)
                       for name, families in COUNTERS.items()}

    def since(self, earlier: "Counters") -> dict:
        """Per second since the earlier snapshot, and in all."""
        seconds = self.at - earlier.at
        done = {name: self.values[name] - earlier.values[name] for name in COUNTERS}
        return {"seconds": round(seconds, 2), **{f"{n}_per_second": round(v / seconds, 1) for n, v in done.items()},
                **{n: int(v) for n, v in done.items()}}


class Coordinators:
    """Coordinator processes on one etcd prefix; a channel to each, to ask it directly."""

    def __init__(self, root: Path, store_url: str, ca_dir: Path, count: int):
        self.addresses = [f"127.0.0.1:{free_port()}" for _ in range(count)]
        root.mkdir()
        self.daemons = [Daemon(f"coordinator{i}", [
            "coordinator", "--listen", address, "--join-listen", f"127.0.0.1:{free_port()}",
            "--state-dir", str(root / f"c{i}"), "--tls-dir", str(ca_dir), "--store", store_url, "--etcd-insecure",
            "--log-level", "info"], root / f"coordinator{i}.log").start()
            for i, address in enumerate(self.addresses)]
        credentials = Credentials.from_dir(ca_dir / "admin")
        self.channels = [credentials.channel(address) for address in self.addresses]
        self.stubs = [control_pb2_grpc.ControlServiceStub(channel) for channel in self.channels]

    def status(self, i: int, timeout: float = 10.0) -> control_pb2.GetStatusResponse:
        return self.stubs[i].GetStatus(control_pb2.GetStatusRequest(), timeout=timeout)

    def serving(self, among: list[int], timeout: float) -> int | None:
        """The one of these that answers GetStatus naming itself the leader; None when none does (yet)."""
        for i in among:
            try:
                if self.status(i, timeout=timeout).summary.leader == self.addresses[i]:
                    return i
            except Exception:  # a standby refuses, a dead one does not answer
                pass
        return None

    def wait_serving(self, among: list[int], timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while (i := self.serving(among, 0.5)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no coordinator served within {timeout:.0f} s")
            time.sleep(POLL_SECONDS)
        return i

    def stop(self) -> None:
        for channel in self.channels:
            channel.close()
        for daemon in self.daemons:
            if daemon.alive:
                daemon.kill()


def status_latencies(coordinators: Coordinators, i: int, seconds: float) -> list[float]:
    """GetStatus on coordinator i every STATUS_EVERY_SECONDS for that long; each answer's latency."""
    latencies = []
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        started = time.perf_counter()
        coordinators.status(i)
        latencies.append(time.perf_counter() - started)
        time.sleep(STATUS_EVERY_SECONDS)
    return latencies


def percentiles(latencies: list[float]) -> dict:
    ms = sorted(x * 1000 for x in latencies)
    return {"p50_ms": round(statistics.median(ms), 1), "p99_ms": round(ms[max(int(len(ms) * 0.99) - 1, 0)], 1)}


def wait(condition, timeout: float, what: str, progress=lambda: "") -> float:
    """Seconds until condition() holds, polled every 20 ms; at the timeout, the error says what progress() says."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > timeout:
            raise RuntimeError(f"not within {timeout:.0f} s: {what} ({progress()})")
        time.sleep(0.02)
    return time.monotonic() - began


class CpuMeter:
    """Cores used by groups of processes since it was made."""

    def __init__(self, pids: dict[str, list[int]]):
        self.pids, self.at = pids, time.monotonic()
        self.start = self._seconds()

    def _seconds(self) -> dict[str, float]:
        return {name: sum(_cpu(pid) for pid in group if psutil.pid_exists(pid)) for name, group in self.pids.items()}

    def cores(self) -> dict[str, float]:
        elapsed = time.monotonic() - self.at
        return {name: round((seconds - self.start[name]) / elapsed, 2) for name, seconds in self._seconds().items()}


def progress(coordinators: Coordinators, i: int, fleet: Fleet) -> str:
    """How far the fleet got with coordinator i: for the error when it did not get there in time."""
    try:
        nodes = dict(coordinators.status(i).summary.nodes_by_state)
    except grpc.RpcError as e:
        nodes = f"no answer to GetStatus ({e.code().name})"
    return (f"{fleet.registered_last_with(coordinators.addresses[i])} registered there last "
            f"({fleet.where_registered()} by address, {fleet.total(fleet.registered)} ever registered; per process "
            f"{dict(fleet.registered)}, heartbeats {dict(fleet.heartbeats)}), it counts {nodes}, "
            f"{lost_nodes(coordinators, i)} declared lost, the agents' failed calls: {fleet.error_counts()}, "
            f"leaders that lost their lease: {leaderships_lost(coordinators)}")


def leaderships_lost(coordinators: Coordinators) -> int:
    """How many times a coordinator lost the leadership it held (each one's log says so)."""
    return sum(d.log().count("this coordinator no longer leads") for d in coordinators.daemons)


def all_ready(coordinators: Coordinators, i: int, fleet: Fleet, size: int) -> bool:
    """Every agent's last registration was with coordinator i, and it counts every node READY (none LOST)."""
    return fleet.registered_last_with(coordinators.addresses[i]) == size and \
        coordinators.status(i).summary.nodes_by_state.get("READY", 0) == size


def lost_nodes(coordinators: Coordinators, i: int) -> int:
    """How many times coordinator i declared a node lost (its log says so for each)."""
    return coordinators.daemons[i].log().count(" lost (no heartbeat")


def cpu_groups(coordinators: Coordinators, etcd: EtcdCluster, fleet: Fleet) -> dict[str, list[int]]:
    return {**{f"coordinator{i}": [d.proc.pid] for i, d in enumerate(coordinators.daemons) if d.alive},
            "etcd": [m.process.pid for m in etcd.members], "fleet": [p.pid for p in fleet.procs]}


def measure(size: int, root: Path, etcd: EtcdCluster, ca_dir: Path) -> dict:
    member = etcd.members[0].endpoint
    coordinators = Coordinators(root / f"n{size}", etcd.url(f"/bench-{size}"), ca_dir, COORDINATORS)
    fleet = None
    try:
        leader = coordinators.wait_serving(list(range(COORDINATORS)), 60)
        start = Counters(member)
        fleet = Fleet(",".join(coordinators.addresses), size, ca_dir, AGENTS_PER_PROCESS, nice=FLEET_NICE,
                      timeline_dir=root / f"timeline{size}")
        cpu = CpuMeter(cpu_groups(coordinators, etcd, fleet))
        ready = wait(lambda: all_ready(coordinators, leader, fleet, size), READY_TIMEOUT_SECONDS,
                     f"{size} agents READY", lambda: progress(coordinators, leader, fleet))
        registration = {**Counters(member).since(start), "cores": _named(cpu.cores(), leader),
                        "nodes_lost": lost_nodes(coordinators, leader), "agent_errors": fleet.error_counts()}
        # Steady means every agent's pulse holds its watch on each standby too: each agent opens its first watches
        # up to a heartbeat interval after it registered (stretched to seconds at 5,000), each over a new TLS
        # connection, and a window opened before they are all held measured those handshakes, not a steady cluster.
        watches = size * (COORDINATORS - 1)
        held = wait(lambda: fleet.total(fleet.watches_held) >= watches, READY_TIMEOUT_SECONDS,
                    f"{watches} pulse watches held", lambda: f"{fleet.total(fleet.watches_held)} held")
        time.sleep(SETTLE_SECONDS)
        steady_start, beats = Counters(member), fleet.total(fleet.heartbeats)
        steady_cpu = CpuMeter(cpu_groups(coordinators, etcd, fleet))
        before = percentiles(status_latencies(coordinators, leader, WINDOW_SECONDS))
        steady = {**Counters(member).since(steady_start), "cores": _named(steady_cpu.cores(), leader)}
        steady["heartbeats_per_second"] = round((fleet.total(fleet.heartbeats) - beats) / steady["seconds"])
        result = failover(coordinators, leader, fleet, size, etcd)
        result.update(ready_seconds=round(ready, 2), watches_held_after_ready_seconds=round(held, 2),
                      status_before=before, registration=registration,
                      steady=steady, lease_ttl_seconds=TTL_SECONDS, leaderships_lost=leaderships_lost(coordinators))
        result["served_vs_ttl"] = round(result["served_seconds"] / TTL_SECONDS, 2)
        result["back_vs_ready"] = round(result["back_seconds"] / ready, 2)
        result["status_p99_vs_before"] = round(result["status_after"]["p99_ms"] / before["p99_ms"], 2)
        return result
    finally:
        if fleet is not None:
            fleet.stop()
        coordinators.stop()


def _named(cores: dict[str, float], leader: int) -> dict[str, float]:
    """The leader's cores under "leader", the others' summed under "standbys"."""
    named = {"leader": cores.pop(f"coordinator{leader}")}
    named["standbys"] = round(sum(cores.pop(k) for k in [k for k in cores if k.startswith("coordinator")]), 2)
    return {**named, **cores}


def failover(coordinators: Coordinators, leader: int, fleet: Fleet, size: int, etcd: EtcdCluster) -> dict:
    """kill -9 of the leader; until a standby serves, until every agent registered with it and it counts them all
    READY; then GetStatus on it. Meanwhile: etcd's writes, and the cores each process group used."""
    member = etcd.members[0].endpoint
    standbys = [i for i in range(COORDINATORS) if i != leader]
    killed_at, errors = Counters(member), fleet.error_counts()
    killed = time.time()
    coordinators.daemons[leader].kill()
    cpu = CpuMeter(cpu_groups(coordinators, etcd, fleet))
    new = coordinators.wait_serving(standbys, 30)
    served = time.monotonic() - killed_at.at
    address = coordinators.addresses[new]
    registered = served + wait(lambda: fleet.registered_last_with(address) == size, READY_TIMEOUT_SECONDS,
                               f"{size} agents registered with the new leader",
                               lambda: progress(coordinators, new, fleet))
    wait(lambda: all_ready(coordinators, new, fleet, size), READY_TIMEOUT_SECONDS,
         f"{size} agents READY on the new leader", lambda: progress(coordinators, new, fleet))
    failed_over = {**Counters(member).since(killed_at), "cores": _named(cpu.cores(), new),
                   "nodes_lost": lost_nodes(coordinators, new),
                   "agent_errors": {code: n - errors.get(code, 0) for code, n in fleet.error_counts().items()}}
    timeline = failover_timeline.phases(fleet.timeline_dir, coordinators.daemons[new].log(), address, killed)
    time.sleep(SETTLE_SECONDS)
    cpu = CpuMeter(cpu_groups(coordinators, etcd, fleet))
    after = percentiles(status_latencies(coordinators, new, WINDOW_SECONDS))
    return {"served_seconds": round(served, 2), "all_registered_seconds": round(registered, 2),
            "back_seconds": failed_over["seconds"], "status_after": after, "failover": failed_over,
            "timeline": timeline, "cores_after": _named(cpu.cores(), new)}


def table(results: dict) -> None:
    rows = [("agents", "READY s", "standby serves s (vs TTL)", "all READY again s (vs start)",
             "status p50/p99 ms after (p99 vs before)", "etcd keys/s reg | steady | failover",
             "WAL KB/s reg | steady | failover", "steady cores leader/standbys", "failover cores leader/etcd/fleet",
             "fleet cores steady | after", "lost reg | failover", "load avg")]
    for size, r in results.items():
        if "error" in r:
            continue
        phases = [r["registration"], r["steady"], r["failover"]]
        cores = r["failover"]["cores"]
        rows.append((str(size), f"{r['ready_seconds']}", f"{r['served_seconds']} ({r['served_vs_ttl']}x)",
                     f"{r['back_seconds']} ({r['back_vs_ready']}x)",
                     f"{r['status_after']['p50_ms']} / {r['status_after']['p99_ms']} ({r['status_p99_vs_before']}x)",
                     " | ".join(f"{p['keys_per_second']}" for p in phases),
                     " | ".join(f"{p['wal_bytes_per_second'] / 1000:.1f}" for p in phases),
                     f"{r['steady']['cores']['leader']} / {r['steady']['cores']['standbys']}",
                     f"{cores['leader']} / {cores['etcd']} / {cores['fleet']}",
                     f"{r['steady']['cores']['fleet']} | {r['cores_after']['fleet']}",
                     f"{r['registration']['nodes_lost']} | {r['failover']['nodes_lost']}", r["load_average"]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    for size, r in results.items():
        if "error" in r:
            print(f"N={size}: {r['error']} (load average {r['load_average']})")
        elif r.get("timeline"):
            print(f"N={size} after the kill, p50/p90/last agent: {failover_timeline.shown(r['timeline'])}")


def each_size(sizes: tuple[int, ...], measure, prefix: str) -> dict[int, dict]:
    """measure(size, root, etcd, ca_dir) for each size, on one CA and one three-member etcd; a size that fails says
    why in its result, and the next still runs."""
    results = {}
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        root = Path(tmp)
        pki.init_ca(root / "ca", [])
        etcd = EtcdCluster(root / "etcd").start_all()
        try:
            for size in sizes:
                try:
                    result = measure(size, root, etcd, root / "ca")
                except RuntimeError as e:  # said in the table and the json, and the other sizes still run
                    result = {"error": str(e)}
                result["load_average"] = " ".join(f"{x:.2f}" for x in psutil.getloadavg())
                results[size] = result
                print(f"N={size}: {json.dumps(result)}", flush=True)
        finally:
            etcd.stop_all()
    return results


def main(sizes: tuple[int, ...]) -> None:
    if etcd_binary() is None:
        print("skipped: no etcd binary (apt-get install etcd-server)")
        return
    results = each_size(sizes, measure, "tfcluster-failover-")
    print()
    table(results)
    (Path(__file__).resolve().parent / "failover.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main(tuple(int(n) for n in sys.argv[1:]) or SIZES)
