"""What a new connection costs (a benchmark, not a test): CALLS Register calls, each over a new mutual-TLS
connection (a channel made, one call, the channel closed), against the floor of the same calls over one open
connection, on the bare grpc.aio server of bench/scale.py with a node certificate per call as the fake agents
use. It prints the CPU per call of the server and of the client (this process) for both, and their ratio.

Why it matters: after a failover thousands of agents call the new leader at once. They do it over the
connections they kept to it while it stood by (tfcluster/daemon/coordinator/rpc/listener.py), so what a new
connection would cost is saved on both sides (docs/ha.md).

Prints a table and writes bench/connections.json. Run with `make bench` or `python bench/connections.py`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import psutil

from scale import _cpu, start_server  # bench/scale.py: puts tests/ and the repository on the path
from fleet import FleetCredentials  # noqa: E402
from harness import free_port  # noqa: E402
from tfcluster import pki  # noqa: E402
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc  # noqa: E402

CALLS = 1000
CONCURRENCY = 50  # calls in flight at once, as agents arriving together
ROUNDS = 3


async def over_new_connections(address: str, credentials: FleetCredentials) -> None:
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> None:
        async with limit:
            channel = credentials.channel(address, f"node{i}", [("grpc.use_local_subchannel_pool", 1)])
            await agent_pb2_grpc.AgentServiceStub(channel).Register(agent_pb2.RegisterRequest(), timeout=30)
            await channel.close()
    await asyncio.gather(*(one(i) for i in range(CALLS)))


async def over_one_connection(address: str, credentials: FleetCredentials) -> None:
    limit = asyncio.Semaphore(CONCURRENCY)
    channel = credentials.channel(address, "node0", [])
    stub = agent_pb2_grpc.AgentServiceStub(channel)

    async def one() -> None:
        async with limit:
            await stub.Register(agent_pb2.RegisterRequest(), timeout=30)
    await stub.Register(agent_pb2.RegisterRequest(), timeout=30)  # the connection made before the clock starts
    await asyncio.gather(*(one() for _ in range(CALLS)))
    await channel.close()


def measure(server_pid: int, run) -> dict:
    """CPU per call (ms) of the server and of this process, and calls per second."""
    me = psutil.Process()
    server, client, started = _cpu(server_pid), sum(me.cpu_times()[:2]), time.monotonic()
    asyncio.run(run())
    seconds = time.monotonic() - started
    return {"server_ms": 1000 * (_cpu(server_pid) - server) / CALLS,
            "client_ms": 1000 * (sum(me.cpu_times()[:2]) - client) / CALLS, "calls_per_second": CALLS / seconds}


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="tfcluster-connections-"))
    pki.init_ca(root / "ca", [])
    address = f"127.0.0.1:{free_port()}"
    server = start_server("bare", address, root / "server", root / "ca")
    credentials = FleetCredentials(root / "ca")
    try:
        runs: dict[str, list[dict]] = {"open": [], "new": []}
        for _ in range(ROUNDS):  # alternated, so that a change in the machine's load touches both
            runs["open"].append(measure(server.pid, lambda: over_one_connection(address, credentials)))
            runs["new"].append(measure(server.pid, lambda: over_new_connections(address, credentials)))
    finally:
        server.kill()
        server.wait()
    result = {kind: {key: round(min(r[key] for r in rs), 3) if key != "calls_per_second" else
                     round(max(r[key] for r in rs), 1) for key in rs[0]} for kind, rs in runs.items()}
    result["ratio"] = {side: round(result["new"][side] / result["open"][side], 2) for side in ("server_ms", "client_ms")}
    result["load_average"] = " ".join(f"{x:.2f}" for x in psutil.getloadavg())
    print(f"{CALLS} Register calls, {CONCURRENCY} at once, best of {ROUNDS} rounds (CPU per call):")
    print(f"  over one open connection (floor): server {result['open']['server_ms']:.2f} ms, "
          f"client {result['open']['client_ms']:.2f} ms, {result['open']['calls_per_second']:.0f} calls/s")
    print(f"  each over a new mutual-TLS one:   server {result['new']['server_ms']:.2f} ms "
          f"({result['ratio']['server_ms']}x), client {result['new']['client_ms']:.2f} ms "
          f"({result['ratio']['client_ms']}x), {result['new']['calls_per_second']:.0f} calls/s")
    (Path(__file__).parent / "connections.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
