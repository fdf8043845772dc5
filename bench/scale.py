"""Fleet scale (a benchmark, not a test): N fake agents (tests/fleet.py: the real wire API over real gRPC,
one connection each, spread over a few client processes) against a real `tfcluster coordinator` process,
over mutual TLS as a cluster runs (a CA made for the run; each fake node has a certificate of its own).

For N = 100, 1,000 and 5,000 it measures: the time until all are READY; GetStatus latency (p50/p99) while
they heartbeat at 1 Hz; submit of a 2-task job until both launches have reached their agents; coordinator
CPU (cores) and CPU per heartbeat; RSS. In the same run it measures the floor: a bare grpc.aio server that
only counts the same heartbeats over the same TLS, and prints the coordinator's CPU per heartbeat as a ratio to it.
It also times, over HTTPS with a client certificate, a Prometheus scrape of /metrics and the dashboard's API
pages (one refresh's worth), and prints a dashboard page's latency as a ratio to GetStatus's.

Prints a table and writes bench/scale.json. Run with `make bench` or `python bench/scale.py [N ...]`.
"""

from __future__ import annotations

import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from harness import free_port, kill_group  # noqa: E402

SIZES = (100, 1000, 5000)
AGENTS_PER_CLIENT = 1250
READY_TIMEOUT_SECONDS = 120
WINDOW_SECONDS = 15.0
STATUS_EVERY_SECONDS = 0.1
SUBMISSIONS = 10
WEB_READS = 20
# The fake agents stand for thousands of hosts but share this machine's cores with the coordinator (and etcd): run
# at their default priority, their processes and threads outnumber the coordinator's and the kernel gives it a
# tenth of a core while they wait on it. Real agents run on hosts of their own. (bench/failover.py, bench/storm.py)
FLEET_NICE = 10


class Fleet:
    """Client processes of fake agents, and what they report on stdout. address: HOST:PORT[,HOST:PORT...];
    ca_dir None: plain text, to a coordinator run with --insecure (no token) or a bare server without TLS;
    timeline_dir: where each process writes its agents' timeline (tests/fleet.py --timeline), a file each."""

    def __init__(self, address: str, size: int, ca_dir: Path | None, per_process: int = AGENTS_PER_CLIENT,
                 nice: int = 0, timeline_dir: Path | None = None):
        self.lock = threading.Lock()
        self.registered: dict[int, int] = {}
        self.registered_with: dict[int, dict[str, int]] = {}  # process -> coordinator -> its agents registered last there
        self.errors: dict[int, dict[str, int]] = {}  # process -> gRPC status code -> failed calls of its agents
        self.heartbeats: dict[int, int] = {}
        self.watches_held: dict[int, int] = {}  # process -> the pulse watches standbys hold open for its agents
        self.launches: dict[str, list[float]] = {}  # job id -> times its launches arrived
        self.procs = []
        self.timeline_dir = timeline_dir
        if timeline_dir is not None:
            timeline_dir.mkdir(parents=True, exist_ok=True)
        per = -(-size // -(-size // per_process))  # spread evenly over ceil(size / per_process) processes
        for first in range(0, size, per):
            # Niced by nice(1) rather than in the forked child: Python code between fork and exec in this
            # process, which has threads, can deadlock the child before it ever runs the fleet.
            proc = subprocess.Popen([*(["nice", "-n", str(nice)] if nice else []), sys.executable,
                                     str(ROOT / "tests" / "fleet.py"), address, str(first),
                                     str(min(per, size - first)), "--exit-after", "0.5",
                                     *(["--ca-dir", str(ca_dir)] if ca_dir else []),
                                     *(["--timeline", str(timeline_dir / f"{first}.tsv")] if timeline_dir else [])],
                                    stdout=subprocess.PIPE, text=True, start_new_session=True)
            if nice:
                lower_group_priority(proc.pid, nice)
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(len(self.procs) - 1, proc), daemon=True).start()

    def _read(self, i: int, proc) -> None:
        for line in proc.stdout:
            event = json.loads(line)
            with self.lock:
                if "registered" in event:
                    self.registered[i] = event["registered"]
                elif "heartbeats" in event:
                    self.heartbeats[i] = event["heartbeats"]
                    self.watches_held[i] = event.get("watches_held", 0)
                    self.errors[i] = event.get("errors", {})
                elif "registered_with" in event:
                    self.registered_with[i] = event["registered_with"]
                elif "launch" in event:
                    self.launches.setdefault(event["launch"][0], []).append(event["launch"][3])

    def total(self, counts: dict[int, int]) -> int:
        with self.lock:
            return sum(counts.values())

    def registered_last_with(self, coordinator: str) -> int:
        """How many agents registered with the coordinator at that address last."""
        with self.lock:
            return sum(counts.get(coordinator, 0) for counts in self.registered_with.values())

    def where_registered(self) -> dict[str, int]:
        """How many agents registered last with each coordinator."""
        with self.lock:
            return {a: sum(c.get(a, 0) for c in self.registered_with.values())
                    for a in sorted({a for c in self.registered_with.values() for a in c})}

    def error_counts(self) -> dict[str, int]:
        """Failed calls of all the agents so far, by gRPC status code."""
        with self.lock:
            return {code: sum(e.get(code, 0) for e in self.errors.values())
                    for code in sorted({c for e in self.errors.values() for c in e})}

    def cpu_seconds(self) -> float:
        return sum(_cpu(p.pid) for p in self.procs)

    def stop(self) -> None:
        for proc in self.procs:
            kill_group(proc.pid)
            proc.wait()


def lower_group_priority(pid: int, nice: int) -> None:
    """The nice of the scheduling group of the session that process pid leads: with the kernel's autogroups, each
    session shares the cores as one group, and a process's own nice counts only within its session."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:  # no autogroups on this kernel: its own nice is all there is
        pass


def _cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def bare_server(address: str, ca_dir: Path | None) -> None:
    """The floor: the same Register and Connect, doing nothing but count heartbeats, on a server with the
    coordinator's own options (listener.OPTIONS: without them HTTP/2's BDP probing costs the floor more than the
    coordinator's whole work), over mutual TLS with the CA in ca_dir, or plain TCP with none."""
    import grpc

    from tfcluster import pki
    from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
    from tfcluster.security import Credentials

    class Bare(agent_pb2_grpc.AgentServiceServicer):
        heartbeats = 0

        async def Register(self, request, context):
            return agent_pb2.RegisterResponse(session_id="bare", heartbeat_interval_seconds=1.0)

        async def Connect(self, request_iterator, context):
            async for message in request_iterator:
                if message.HasField("heartbeat"):
                    Bare.heartbeats += 1

    async def main() -> None:
        from tfcluster.daemon.coordinator.rpc.listener import OPTIONS  # the coordinator's own: no BDP probing
        server = grpc.aio.server(options=OPTIONS)
        agent_pb2_grpc.add_AgentServiceServicer_to_server(Bare(), server)
        if ca_dir is None:
            server.add_insecure_port(address)
        else:
            server.add_secure_port(address, Credentials.from_dir(ca_dir, pki.SERVER_CERT, pki.SERVER_KEY).server())
        await server.start()
        await server.wait_for_termination()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(main())


def start_server(kind: str, address: str, state: Path, ca_dir: Path | None, http: str = "",
                 paced: bool = False) -> subprocess.Popen:
    """The coordinator or the bare server (kind "bare"), over mutual TLS with the CA in ca_dir, or plain TCP with
    none (the coordinator with --insecure and no token). paced: the coordinator with its default bound on
    heartbeats a second (as operators run it), not every agent at 1 Hz."""
    if kind == "bare":
        argv = [sys.executable, __file__, "--bare", address, *([str(ca_dir)] if ca_dir else [])]
    else:
        trust = ["--tls-dir", str(ca_dir), "--join-listen", f"127.0.0.1:{free_port()}"] if ca_dir else ["--insecure"]
        argv = [sys.executable, "-m", "tfcluster.cli", "coordinator", "--listen", address, "--state-dir", str(state),
                *trust, "--log-level", "warning", *(["--http-listen", http] if http else []),
                # Every agent at 1 Hz, as the bare server is measured: the cost per heartbeat, not the bound on them.
                *([] if paced else ["--max-heartbeats-per-second", "0"])]
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=open(state.parent / f"{kind}.log", "ab"))
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + 30
    import socket
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) == 0:
                return proc
        time.sleep(0.05)
    raise RuntimeError(f"{kind} server did not listen on {address}")


def measure(kind: str, size: int, tmp: Path) -> dict:
    address = f"127.0.0.1:{free_port()}"
    state = tmp / f"{kind}-{size}"
    state.mkdir()
    ca_dir = tmp / "ca"
    http = f"127.0.0.1:{free_port()}"
    server = start_server(kind, address, state, ca_dir, http)
    fleet = None
    client = None
    try:
        began = time.monotonic()
        fleet = Fleet(address, size, ca_dir)
        if kind == "coordinator":
            from tfcluster.client import Client
            from tfcluster.security import Credentials
            client = Client(address, Credentials.from_dir(ca_dir / "admin"))
        while fleet.total(fleet.registered) < size or (client and _ready(client) < size):
            if time.monotonic() - began > READY_TIMEOUT_SECONDS:
                raise RuntimeError(f"only {fleet.total(fleet.registered)} of {size} registered")
            time.sleep(0.05)
        result = {"ready_seconds": round(time.monotonic() - began, 2)}
        time.sleep(3.0)  # every stream up and beating
        beats0, cpu0, clients0 = fleet.total(fleet.heartbeats), _cpu(server.pid), fleet.cpu_seconds()
        t0 = time.monotonic()
        latencies = []
        while time.monotonic() - t0 < WINDOW_SECONDS:
            if client is not None:
                started = time.perf_counter()
                client.status()
                latencies.append(time.perf_counter() - started)
            time.sleep(STATUS_EVERY_SECONDS)
        seconds = time.monotonic() - t0
        beats, cpu = fleet.total(fleet.heartbeats) - beats0, _cpu(server.pid) - cpu0
        result.update({"heartbeats_per_second": round(beats / seconds), "server_cores": round(cpu / seconds, 3),
                       "cpu_us_per_heartbeat": round(cpu / max(beats, 1) * 1e6, 1),
                       "client_cores": round((fleet.cpu_seconds() - clients0) / seconds, 2),
                       "rss_mb": round(psutil.Process(server.pid).memory_info().rss / 1e6)})
        if client is not None:
            latencies.sort()
            result["status_p50_ms"] = round(statistics.median(latencies) * 1000, 1)
            result["status_p99_ms"] = round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 1)
            result["submit_to_launch_ms"] = _submissions(client, fleet)
            result["nodes_lost_before_web"] = client.status().summary.nodes_by_state.get("LOST", 0)
            result["web_ms"] = _web(http, ca_dir / "admin")
            result["dashboard_page_vs_status"] = round(result["web_ms"]["/api/nodes"] / result["status_p50_ms"], 2)
            result["nodes_lost"] = client.status().summary.nodes_by_state.get("LOST", 0)
        return result
    finally:
        if client is not None:
            client.close()
        if fleet is not None:
            fleet.stop()
        kill_group(server.pid)
        server.wait()


def _web(listen: str, credentials: Path) -> dict:
    """p50 of each HTTP read a dashboard refresh or a Prometheus scrape makes, over HTTPS with a certificate
    (one connection, as a browser keeps one), and the size of /metrics."""
    import http.client
    import ssl
    context = ssl.create_default_context(cafile=str(credentials / "ca.crt"))
    context.load_cert_chain(str(credentials / "client.crt"), str(credentials / "client.key"))
    host, port = listen.rsplit(":", 1)
    connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=30)
    result = {}
    for path in ("/metrics", "/api/summary", "/api/nodes", "/api/nodes?state=READY&name=fleet-1", "/api/jobs"):
        times, size = [], 0
        for _ in range(WEB_READS):
            started = time.perf_counter()
            connection.request("GET", path)
            response = connection.getresponse()
            size = len(response.read())
            times.append(time.perf_counter() - started)
            if response.status != 200:
                raise RuntimeError(f"GET {path}: {response.status}")
        result[path] = round(statistics.median(times) * 1000, 1)
        if path == "/metrics":
            result["metrics_kb"] = round(size / 1000)
    connection.close()
    return result


def _ready(client) -> int:
    return client.status().summary.nodes_by_state.get("READY", 0)


def _submissions(client, fleet: Fleet) -> dict:
    from tfcluster.specfile import parse_spec

    spec = parse_spec({"name": "scale", "strategy": "multi_worker_mirrored", "command": ["train"], "gpus": 1,
                       "workdir": "/srv", "roles": {"worker": {"count": 2}}})
    times = []
    for _ in range(SUBMISSIONS):
        started = time.time()
        job_id = client.submit(spec)
        deadline = time.monotonic() + 10
        while len(fleet.launches.get(job_id, ())) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        arrived = fleet.launches.get(job_id, [])
        if len(arrived) < 2:
            raise RuntimeError(f"{job_id}: {len(arrived)} of 2 launches arrived")
        times.append(max(arrived) - started)
        time.sleep(0.2)
    return {"p50": round(statistics.median(times) * 1000, 1), "max": round(max(times) * 1000, 1)}


def main(sizes: tuple[int, ...]) -> None:
    results = {}
    with tempfile.TemporaryDirectory(prefix="tfcluster-scale-") as tmp:
        from tfcluster import pki
        pki.init_ca(Path(tmp) / "ca", [])
        for size in sizes:
            coordinator = measure("coordinator", size, Path(tmp))
            bare = measure("bare", size, Path(tmp))
            coordinator["bare_cpu_us_per_heartbeat"] = bare["cpu_us_per_heartbeat"]
            coordinator["bare_rss_mb"] = bare["rss_mb"]
            coordinator["cpu_per_heartbeat_vs_bare"] = round(coordinator["cpu_us_per_heartbeat"] /
                                                             max(bare["cpu_us_per_heartbeat"], 1e-9), 2)
            results[size] = coordinator
            print(f"N={size}: {json.dumps(coordinator)}", flush=True)
    print()
    rows = [("agents", "READY s", "status p50/p99 ms", "submit->launch ms", "cores", "us/heartbeat",
             "bare us/hb", "ratio", "RSS MB", "/metrics ms (KB)", "/api/nodes ms", "vs status")]
    for size, r in results.items():
        web = r["web_ms"]
        rows.append((str(size), f"{r['ready_seconds']}", f"{r['status_p50_ms']} / {r['status_p99_ms']}",
                     f"{r['submit_to_launch_ms']['p50']} (max {r['submit_to_launch_ms']['max']})",
                     f"{r['server_cores']}", f"{r['cpu_us_per_heartbeat']}", f"{r['bare_cpu_us_per_heartbeat']}",
                     f"{r['cpu_per_heartbeat_vs_bare']}x", f"{r['rss_mb']}", f"{web['/metrics']} ({web['metrics_kb']})",
                     f"{web['/api/nodes']}", f"{r['dashboard_page_vs_status']}x"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    (Path(__file__).resolve().parent / "scale.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--bare"]:
        bare_server(sys.argv[2], Path(sys.argv[3]) if sys.argv[3:] else None)
    else:
        main(tuple(int(n) for n in sys.argv[1:]) or SIZES)
