"""Where the coordinator's CPU per heartbeat goes (a benchmark, not a test): N fake agents (tests/fleet.py) beat at
1 Hz against a real `tfcluster coordinator` over mutual TLS. Measured in one run:

  1. its CPU per heartbeat over a window, with nothing attached;
  2. a sampling profile of the same process over a second window (py-spy, --nonblocking, every thread), each
     sample put in a stage by the innermost tfcluster frame of its stack (STAGES), or, with none, in gRPC's own
     work (the event loop's callbacks into gRPC's core: transport, TLS records, framing, protobuf parsing);
  3. the floor: the bare grpc.aio server of bench/scale.py over the same TLS, which only counts the heartbeats.

It prints the CPU per heartbeat split by stage (each stage's share of the busy samples times the CPU measured in
window 1) beside the floor, and writes bench/heartbeat_profile.json.

    python bench/heartbeat_profile.py [--agents 2000] [--seconds 15]     (py-spy: the dev extra; root or ptrace)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from scale import READY_TIMEOUT_SECONDS, Fleet, _cpu, measure, start_server  # puts tests/ and the repo on the path
from harness import free_port, kill_group  # noqa: E402

# Stages by the path of the innermost tfcluster frame of a sample (the first that matches).
STAGES = (
    # gRPC hands the guard the raw bytes (security.py): each message is decoded there, once within its bound
    ("decoding each message (protobuf, within its bound)", ("Messages.take (tfcluster/security.py",
                                                            "_Reading.read (tfcluster/security.py",
                                                            "_Reading.requests (tfcluster/security.py")),
    ("identity and authorisation", ("tfcluster/security.py", "rpc/listener.py", "rpc/stream_limits.py",
                                    "core/access/", "rpc/join_port.py")),
    ("decoding and checks (wire)", ("tfcluster/wire/",)),
    ("metrics", ("web/metrics.py",)),
    ("store and change log", ("coordinator/store/", "core/model/changelog.py")),
    ("the core's handling", ("coordinator/core/",)),
    ("tfcluster's RPC handlers and replies", ("coordinator/rpc/", "coordinator/grpc_server.py")),
)
GRPC = "gRPC's own work (transport, TLS, framing, parsing)"
OTHER = "other Python (asyncio, logging)"
# Where a thread waits: the event loop in epoll, the store's and executor's threads on their queues.
IDLE_FRAMES = ("selectors.py", "concurrent/futures/thread.py", "threading.py:3", "queue.py")
# Where Python calls into gRPC's core and the sample lands in native code: the event loop's callbacks into
# gRPC (reading and writing messages, TLS records), and the thread that polls gRPC's completion queue.
GRPC_FRAMES = ("Handle._run (asyncio/events.py", "Thread.run (threading.py")


def stage_of(frames: list[str]) -> str | None:
    """The stage of one sampled stack (outermost frame first); None: the thread was waiting."""
    innermost = frames[-1] if frames else ""
    if any(idle in innermost for idle in IDLE_FRAMES):
        return None
    if innermost.startswith(GRPC_FRAMES) or "grpc" in innermost:
        return GRPC
    # The work of one event-loop callback (or thread task): the frames below the last that runs it. Above them
    # are the process's entry frames (the CLI, asyncio.run), which are not a stage.
    runs = [i for i, f in enumerate(frames) if f.startswith(GRPC_FRAMES) or "concurrent/futures/thread.py" in f]
    ours = [f for f in frames[(runs[-1] + 1) if runs else 0:] if "tfcluster/" in f and "tfcluster/api/" not in f]
    if ours:
        for stage, paths in STAGES:
            if any(p in ours[-1] for p in paths):
                return stage
    return OTHER


OTHERS: Counter = Counter()  # the innermost frames of the samples put in OTHER, for --show-other


def split(profile: Path) -> Counter:
    stages: Counter = Counter()
    for line in profile.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")[1:]  # the first frame is the thread
        stage = stage_of(frames)
        if stage is not None:
            stages[stage] += int(count)
        if stage == OTHER:
            OTHERS[" <- ".join(reversed(frames[-3:]))] += int(count)
    return stages


def ready(client) -> int:
    """READY nodes; 0 while a status call fails (the coordinator busy with the agents' registrations)."""
    from tfcluster.errors import ClusterError
    try:
        return client.status().summary.nodes_by_state.get("READY", 0)
    except ClusterError:
        return 0


def coordinator(agents: int, seconds: float, tmp: Path, py_spy: str) -> dict:
    from tfcluster.client import Client
    from tfcluster.security import Credentials
    address, state = f"127.0.0.1:{free_port()}", tmp / "coordinator"
    state.mkdir()
    server = start_server("coordinator", address, state, tmp / "ca", f"127.0.0.1:{free_port()}")
    fleet, client = None, Client(address, Credentials.from_dir(tmp / "ca" / "admin"))
    try:
        fleet, began = Fleet(address, agents, tmp / "ca"), time.monotonic()
        while ready(client) < agents:
            if time.monotonic() - began > READY_TIMEOUT_SECONDS:
                raise RuntimeError(f"not all {agents} agents READY")
            time.sleep(0.2)
        time.sleep(3.0)
        beats0, cpu0 = fleet.total(fleet.heartbeats), _cpu(server.pid)
        time.sleep(seconds)
        beats, cpu = fleet.total(fleet.heartbeats) - beats0, _cpu(server.pid) - cpu0
        raw = tmp / "profile.txt"
        subprocess.run([py_spy, "record", "-p", str(server.pid), "-d", str(int(seconds)), "-r", "250",
                        "--nonblocking", "--threads", "-f", "raw", "-o", str(raw)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return {"heartbeats": beats, "cpu_us_per_heartbeat": cpu / max(beats, 1) * 1e6, "stages": split(raw),
                "lost": client.status().summary.nodes_by_state.get("LOST", 0)}
    finally:
        client.close()
        if fleet is not None:
            fleet.stop()
        kill_group(server.pid)
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--show-other", type=int, default=0, help="print the N commonest stacks put in 'other'")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        sys.exit("py-spy is not installed: pip install -e '.[dev]'")
    from tfcluster import pki
    with tempfile.TemporaryDirectory(prefix="tfcluster-profile-") as tmp:
        pki.init_ca(Path(tmp) / "ca", [])
        ours = coordinator(args.agents, args.seconds, Path(tmp), py_spy)
        floor = measure("bare", args.agents, Path(tmp))["cpu_us_per_heartbeat"]
    busy = sum(ours["stages"].values()) or 1
    per_beat = ours["cpu_us_per_heartbeat"]
    rows = sorted(ours["stages"].items(), key=lambda kv: -kv[1])
    print(f"{args.agents} agents at 1 Hz over mutual TLS, {ours['heartbeats']} heartbeats in {args.seconds:g} s; "
          f"{ours['lost']} nodes LOST")
    print(f"  coordinator: {per_beat:.0f} us of CPU per heartbeat; the bare TLS server (floor): {floor:.0f} us "
          f"({per_beat / floor:.2f}x)")
    for stage, samples in rows:
        print(f"    {samples / busy * 100:5.1f}%  {samples / busy * per_beat:6.1f} us  {stage}")
    for stack, samples in OTHERS.most_common(args.show_other):
        print(f"      other {samples:5d}: {stack[:220]}")
    result = {"agents": args.agents, "cpu_us_per_heartbeat": round(per_beat, 1), "floor_tls_us": round(floor, 1),
              "ratio": round(per_beat / floor, 2),
              "stages_us": {stage: round(samples / busy * per_beat, 1) for stage, samples in rows}}
    (Path(__file__).parent / "heartbeat_profile.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
