"""A standby down (a benchmark, not a test): N fake agents (tests/fleet.py, over mutual TLS) on two `tfcluster
coordinator` processes sharing one three-member etcd on loopback; kill -9 of the standby.

What it costs the leader that its only standby is down: every agent's watch of the standby then fails at once,
every pulse (tfcluster/daemon/agent/session/pulse.py), and must not turn into a call per agent per pulse on the
leader. For each N it measures the leader's cores while every agent heartbeats, with the standby up (the floor,
in the same run) and then down, and the ratio; besides, that every node stays READY and none is declared lost.

Needs Debian's `etcd` (package etcd-server). Prints a table and writes bench/standby_down.json.
Run with `make bench` or `python bench/standby_down.py [N ...]`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from failover import AGENTS_PER_PROCESS, READY_TIMEOUT_SECONDS, SETTLE_SECONDS, WINDOW_SECONDS, Coordinators, \
    CpuMeter, all_ready, cpu_groups, each_size, lost_nodes, wait  # bench/failover.py: puts tests/ on the path
from scale import FLEET_NICE, Fleet
from tfcluster.demo.etcd import EtcdCluster, etcd_binary  # noqa: E402

SIZES = (2000,)


def measure(size: int, root: Path, etcd: EtcdCluster, ca_dir: Path) -> dict:
    coordinators = Coordinators(root / f"n{size}", etcd.url(f"/standby-down-{size}"), ca_dir, 2)
    fleet = None
    try:
        leader = coordinators.wait_serving([0, 1], 60)
        fleet = Fleet(",".join(coordinators.addresses), size, ca_dir, AGENTS_PER_PROCESS, nice=FLEET_NICE)
        wait(lambda: all_ready(coordinators, leader, fleet, size), READY_TIMEOUT_SECONDS, f"{size} agents READY")
        time.sleep(SETTLE_SECONDS)
        up = window(coordinators, etcd, fleet)
        coordinators.daemons[1 - leader].kill()
        time.sleep(SETTLE_SECONDS)  # every agent's watch of it has failed once by now (a pulse is 2 s)
        down = window(coordinators, etcd, fleet)
        name = f"coordinator{leader}"
        return {"leader_cores_standby_up": up[name], "leader_cores_standby_down": down[name],
                "fleet_cores_standby_up": up["fleet"], "fleet_cores_standby_down": down["fleet"],
                "leader_down_vs_up": round(down[name] / max(up[name], 0.01), 2),
                "all_ready_after": all_ready(coordinators, leader, fleet, size),
                "nodes_lost": lost_nodes(coordinators, leader)}
    finally:
        if fleet is not None:
            fleet.stop()
        coordinators.stop()


def window(coordinators: Coordinators, etcd: EtcdCluster, fleet: Fleet) -> dict[str, float]:
    """Cores each process group used over one measuring window."""
    cpu = CpuMeter(cpu_groups(coordinators, etcd, fleet))
    time.sleep(WINDOW_SECONDS)
    return cpu.cores()


def main(sizes: tuple[int, ...]) -> None:
    if etcd_binary() is None:
        print("skipped: no etcd binary (apt-get install etcd-server)")
        return
    results = each_size(sizes, measure, "tfcluster-standby-down-")
    print()
    print("agents  leader cores standby up | down (ratio)  fleet cores up | down  all READY after  lost")
    for size, r in results.items():
        if "error" in r:
            print(f"{size:<6}  {r['error']}")
            continue
        print(f"{size:<6}  {r['leader_cores_standby_up']} | {r['leader_cores_standby_down']} "
              f"({r['leader_down_vs_up']}x)".ljust(44) +
              f"{r['fleet_cores_standby_up']} | {r['fleet_cores_standby_down']}".ljust(23) +
              f"{r['all_ready_after']}".ljust(17) + f"{r['nodes_lost']}")
    (Path(__file__).resolve().parent / "standby_down.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main(tuple(int(n) for n in sys.argv[1:]) or SIZES)
