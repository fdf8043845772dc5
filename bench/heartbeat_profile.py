"""Where the coordinator's CPU per heartbeat goes, beside two floors (a benchmark, not a test): N fake agents
(tests/fleet.py) beat at 1 Hz against a real `tfcluster coordinator`. For each N, measured in one run, in the
order coordinator over TLS, TLS floor, plain floor, coordinator over plain TCP (so that a change in the machine's
load touches both sides of each ratio):

  - the coordinator over mutual TLS (a certificate per agent) and over plain TCP (--insecure, no token): its CPU
    per heartbeat over a window with nothing attached, then a sampling profile of the same process over a second
    window (bench/profile_stages.py: py-spy, from the dev extra; skipped, saying so, when it is not installed);
  - the floors: the bare grpc.aio server of bench/scale.py, with the coordinator's own server options, which only
    counts the same heartbeats: over the same mutual TLS (the TLS floor) and over plain TCP (the plain floor).

It prints the CPU per heartbeat of each, the ratios (coordinator over TLS / TLS floor, over plain / plain floor)
and the split by stage (each stage's share of the busy samples times the CPU of the window before), with the
load average, and writes bench/heartbeat_profile.json (bench/guard.py checks its ratios against
bench/targets.py).

    python bench/heartbeat_profile.py [--agents 2000 5000] [--seconds 15]     (py-spy: root or ptrace)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from scale import READY_TIMEOUT_SECONDS, Fleet, _cpu, start_server  # puts tests/ and the repo on the path
from harness import free_port, kill_group  # noqa: E402
from profile_stages import OTHERS, find_py_spy, stages_us  # noqa: E402

SETTLE_SECONDS = 3.0  # after the last agent counts: every stream up and beating
# Each run: (server, over TLS); the order alternates the coordinator and the floors, see the docstring.
RUNS = (("coordinator", True), ("bare", True), ("bare", False), ("coordinator", False))
FLOOR = {True: "TLS floor (bare server, mutual TLS)", False: "plain floor (bare server, plain TCP)"}


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def ready(client) -> int:
    """READY nodes; 0 while a status call fails (the coordinator busy with the agents' registrations)."""
    from tfcluster.errors import ClusterError
    try:
        return client.status().summary.nodes_by_state.get("READY", 0)
    except ClusterError:
        return 0


@contextmanager
def serving(kind: str, tls: bool, agents: int, tmp: Path):
    """A server of that kind with every fake agent counted (READY at the coordinator, registered at the bare
    server) and beating: yields (server process, fleet, the coordinator's client or None)."""
    from tfcluster.client import Client
    from tfcluster.credentials import Credentials
    ca_dir = tmp / "ca" if tls else None
    address = f"127.0.0.1:{free_port()}"
    state = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=tmp))
    server = start_server(kind, address, state, ca_dir)
    fleet = client = None
    try:
        fleet, began = Fleet(address, agents, ca_dir), time.monotonic()
        if kind == "coordinator":
            client = Client(address, Credentials.from_dir(ca_dir / "admin") if tls else Credentials())
        while (ready(client) if client else fleet.total(fleet.registered)) < agents:
            if time.monotonic() - began > READY_TIMEOUT_SECONDS:
                raise RuntimeError(f"{kind}: not all {agents} agents counted in {READY_TIMEOUT_SECONDS} s")
            time.sleep(0.2)
        time.sleep(SETTLE_SECONDS)
        yield server, fleet, client
    finally:
        if client is not None:
            client.close()
        if fleet is not None:
            fleet.stop()
        kill_group(server.pid)
        server.wait()


def measure(kind: str, tls: bool, agents: int, seconds: float, tmp: Path, py_spy: str | None) -> dict:
    """CPU per heartbeat of one server over a window; for the coordinator, the stages from a second window's
    profile and the nodes LOST by the end."""
    with serving(kind, tls, agents, tmp) as (server, fleet, client):
        beats0, cpu0 = fleet.total(fleet.heartbeats), _cpu(server.pid)
        time.sleep(seconds)
        beats, cpu = fleet.total(fleet.heartbeats) - beats0, _cpu(server.pid) - cpu0
        result = {"heartbeats": beats, "cpu_us_per_heartbeat": round(cpu / max(beats, 1) * 1e6, 1)}
        if client is not None:
            if py_spy:
                result["stages_us"] = stages_us(py_spy, server.pid, seconds, tmp / "profile.txt",
                                                result["cpu_us_per_heartbeat"])
            result["lost"] = client.status().summary.nodes_by_state.get("LOST", 0)
        return result


def one_size(agents: int, seconds: float, tmp: Path, py_spy: str | None) -> dict:
    """The four runs at one fleet size, and the two ratios."""
    before = load_average()
    runs = {(kind, tls): measure(kind, tls, agents, seconds, tmp, py_spy) for kind, tls in RUNS}
    result = {"load_average_before": before, "load_average_after": load_average()}
    for tls, transport in ((True, "tls"), (False, "plain")):
        ours, floor = runs[("coordinator", tls)], runs[("bare", tls)]["cpu_us_per_heartbeat"]
        result[transport] = {**ours, "floor_us_per_heartbeat": floor}
        result[f"coordinator_vs_{transport}_floor"] = round(ours["cpu_us_per_heartbeat"] / max(floor, 1e-9), 2)
    return result


def report(agents: int, seconds: float, result: dict, show_other: int) -> None:
    print(f"{agents} agents at 1 Hz, {seconds:g} s windows; load average {result['load_average_before']} before, "
          f"{result['load_average_after']} after (1, 5, 15 min)")
    for tls, transport, label in ((True, "tls", "mutual TLS"), (False, "plain", "plain TCP")):
        r = result[transport]
        print(f"  coordinator over {label}: {r['cpu_us_per_heartbeat']:.0f} us of CPU per heartbeat "
              f"({r['heartbeats']} heartbeats, {r['lost']} nodes LOST); {FLOOR[tls]}: "
              f"{r['floor_us_per_heartbeat']:.0f} us; {result[f'coordinator_vs_{transport}_floor']:.2f}x")
        if "stages_us" not in r:
            print("    (no split by stage: py-spy is not installed; pip install -e '.[dev]')")
        for stage, us in r.get("stages_us", {}).items():
            print(f"    {us / max(r['cpu_us_per_heartbeat'], 1e-9) * 100:5.1f}%  {us:6.1f} us  {stage}")
    for stack, samples in OTHERS.most_common(show_other):
        print(f"      other {samples:5d}: {stack[:220]}")
    OTHERS.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[2000, 5000], help="fleet sizes, one run each")
    parser.add_argument("--seconds", type=float, default=15.0, help="each window (the profile takes another)")
    parser.add_argument("--show-other", type=int, default=0, help="print the N commonest stacks put in 'other'")
    args = parser.parse_args()
    py_spy = find_py_spy()
    if py_spy is None:
        print("py-spy is not installed (pip install -e '.[dev]'): measuring the coordinator and the floors "
              "without the split by stage")
    from tfcluster import pki
    results = {"seconds": args.seconds, "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="tfcluster-profile-") as tmp:
        pki.init_ca(Path(tmp) / "ca", [])
        for agents in args.agents:
            results["sizes"][str(agents)] = result = one_size(agents, args.seconds, Path(tmp), py_spy)
            report(agents, args.seconds, result, args.show_other)
    (Path(__file__).parent / "heartbeat_profile.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
