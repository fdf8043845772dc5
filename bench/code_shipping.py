"""Shipping a job's code to its hosts (a benchmark, not a test; needs root): network-namespace hosts, each agent
with a state dir and a code cache of its own, a real coordinator over mutual TLS.

For each tree size (incompressible files) and host count it packs and uploads a fresh tree (what `tfcluster
start` does: timed apart), then times a job with one task per host from its submission until every task is
RUNNING: each node fetches the archive, checks and unpacks it, and starts its task over it. The baseline,
measured in the same run, is one plain copy of the same archive between two of the hosts (TCP over their
veth links, written to a file, no TLS and no checks); the table says the distribution's time as a fraction of
N such copies one after the other.

It also times a warm start: the same tree again, already cached on every node, from the CLI's code step (the
tree's listing checked, CodeStatus) until all tasks are RUNNING, against the same job with no code (its
workdir on shared storage), rounds alternated; the difference is what code shipping adds to a start.

Here all the hosts share one machine's CPUs, so that the work each node does with the bytes (checking,
unpacking) adds up where between real hosts it would not; the last measurement therefore limits every link
(each host's and the coordinator's, each way) to --link-mbit, as NICs would, and ships the largest tree to the
most hosts again: there the network is what a distribution waits for, and the baseline is the plain copy over
the same limited links.

Usage: python bench/code_shipping.py [--sizes-mb 10,100] [--hosts 1,4,16] [--rounds 2] [--warm-rounds 8]
                                     [--link-mbit 200]
Prints a table and writes bench/code_shipping.json. Run with `make bench` (skipped when not root).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from harness import PYTHON, kill_group, running_cluster  # noqa: E402
from report import show_and_save  # noqa: E402  (bench/, the folder of the script run)
from tfcluster.codeship import ship_code  # noqa: E402
from tfcluster.demo.hosts import TestHosts, unavailable  # noqa: E402
from tfcluster.spec import JobSpec, RoleSpec  # noqa: E402
from tfcluster.views import job_doc  # noqa: E402

FILE_BYTES = 1 << 20
# Room for one 100 MB entry (archive and tree) per agent: the previous round's goes when the next arrives.
CACHE_BYTES = "260M"
COPY_PORT = 29500
START_TIMEOUT_SECONDS = 300.0

# argv: address to listen on, file to write. Prints "ready", then acknowledges with one byte once all is written.
RECEIVER = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    with conn, open(sys.argv[3], "wb") as out:
        while data := conn.recv(1 << 20):
            out.write(data)
        out.flush()
        conn.sendall(b"k")
"""

# argv: host, port, file, rounds. Prints the seconds of each copy (connect .. the receiver's acknowledgement).
SENDER = """
import json, socket, sys, time
times = []
for _ in range(int(sys.argv[4])):
    began = time.perf_counter()
    with socket.create_connection((sys.argv[1], int(sys.argv[2]))) as conn, open(sys.argv[3], "rb") as f:
        conn.sendfile(f)
        conn.shutdown(socket.SHUT_WR)
        assert conn.recv(1) == b"k"
    times.append(time.perf_counter() - began)
print(json.dumps(times))
"""


def plain_copies(hosts: TestHosts, archive: Path, dest: Path, rounds: int) -> list[float]:
    """Seconds of a plain TCP copy of the archive from host 1 to host 2, `rounds` times."""
    server = subprocess.Popen([*hosts.prefix(2), PYTHON, "-c", RECEIVER, hosts.ip(2), str(COPY_PORT), str(dest)],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        sent = subprocess.run([*hosts.prefix(1), PYTHON, "-c", SENDER, hosts.ip(2), str(COPY_PORT), str(archive),
                               str(rounds)], capture_output=True, text=True, timeout=120)
        if sent.returncode != 0:
            raise RuntimeError(f"the plain copy failed:\n{sent.stderr[-2000:]}")
        return json.loads(sent.stdout)
    finally:
        kill_group(server.pid)
        server.wait()
        dest.unlink(missing_ok=True)


def limit_links(hosts: TestHosts, mbit: int) -> None:
    """Every host's link limited to `mbit` each way, and the coordinator's, as NICs would: here, where all hosts
    share one machine's CPUs and memory, that makes the network what a distribution waits for, as it is
    between real hosts. (The limits go with the links at teardown.)"""
    tbf = ["root", "tbf", "rate", f"{mbit}mbit", "burst", "256kb", "latency", "100ms"]
    commands = [["tc", "qdisc", "replace", "dev", hosts.bridge, *tbf]]  # what the coordinator sends
    for i in range(1, hosts.count + 1):
        commands.append(["tc", "qdisc", "replace", "dev", hosts.veths[i - 1], *tbf])  # what host i receives
        commands.append([*hosts.prefix(i), "tc", "qdisc", "replace", "dev", "eth0", *tbf])  # what it sends
    for command in commands:
        subprocess.run(command, check=True, capture_output=True)


def make_tree(directory: Path, megabytes: int) -> Path:
    """A tree of `megabytes` 1 MiB files of random bytes (nothing compresses) and a small program."""
    directory.mkdir(parents=True)
    for i in range(megabytes):
        (directory / f"data-{i:03}.bin").write_bytes(os.urandom(FILE_BYTES))
    (directory / "main.py").write_text("import time\ntime.sleep(600)\n")
    return directory


def job_spec(name: str, workdir: Path, hosts: int, shared: bool = False) -> JobSpec:
    nodes = tuple(f"h{i}" for i in range(1, hosts + 1))
    return JobSpec(name=name, strategy="multi_worker_mirrored", command=("sleep", "600"), workdir=str(workdir),
                   roles={"worker": RoleSpec(count=hosts, nodes=nodes)}, shared_workdir=shared)


def until_running(client, job_id: str, interval: float) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        job = job_doc(client.status(job_id).jobs[0])
        if job["state"] in ("FAILED", "STOPPED", "SUCCEEDED"):
            raise RuntimeError(f"job {job_id} ended {job['state']} before it ran: {job['message']}")
        if job["tasks"] and all(t["state"] == "RUNNING" for t in job["tasks"]):
            return
        time.sleep(interval)
    raise RuntimeError(f"job {job_id} not RUNNING after {START_TIMEOUT_SECONDS:.0f} s")


def stop(client, job_id: str) -> None:
    client.stop(job_id, graceful=False)
    deadline = time.monotonic() + 60
    while job_doc(client.status(job_id).jobs[0])["state"] != "STOPPED" and time.monotonic() < deadline:
        time.sleep(0.1)


def ship(client, spec: JobSpec) -> JobSpec:
    """The CLI's code step (pack, CodeStatus, upload what the coordinator lacks), its line on stderr kept quiet."""
    with contextlib.redirect_stderr(io.StringIO()):
        return ship_code(client, spec)


def timed_start(client, spec: JobSpec, interval: float) -> tuple[float, str]:
    began = time.perf_counter()
    job_id = client.submit(spec)
    until_running(client, job_id, interval)
    return time.perf_counter() - began, job_id


def cold_starts(client, scratch: Path, megabytes: int, hosts: int, rounds: int) -> dict[str, list[float]]:
    """Fresh trees (a new hash each round, so no node holds it): upload and distribution seconds."""
    times: dict[str, list[float]] = {"upload": [], "distribution": []}
    for i in range(rounds):
        tree = make_tree(scratch / f"tree-{megabytes}-{hosts}-{i}", megabytes)
        spec = job_spec(f"ship-{megabytes}mb-{hosts}h", tree, hosts)
        began = time.perf_counter()
        spec = ship(client, spec)
        times["upload"].append(time.perf_counter() - began)
        seconds, job_id = timed_start(client, spec, 0.05)
        times["distribution"].append(seconds)
        stop(client, job_id)
        subprocess.run(["rm", "-rf", str(tree)], check=True)
    return times


def warm_starts(client, scratch: Path, hosts: int, rounds: int) -> dict[str, list[float]]:
    """The same 10 MB tree each time (cached everywhere after the first), against no code at all."""
    tree = make_tree(scratch / "warm", 10)
    times: dict[str, list[float]] = {"code": [], "none": []}
    stop(client, timed_start(client, ship(client, job_spec("warm", tree, hosts)), 0.05)[1])  # fills the caches
    for _ in range(rounds):
        began = time.perf_counter()
        spec = ship(client, job_spec("warm", tree, hosts))
        seconds, job_id = timed_start(client, spec, 0.01)
        times["code"].append(time.perf_counter() - began)
        stop(client, job_id)
        seconds, job_id = timed_start(client, job_spec("none", tree, hosts, shared=True), 0.01)
        times["none"].append(seconds)
        stop(client, job_id)
    return times


def summary(values: list[float]) -> str:
    return f"min {min(values):.2f} s, median {statistics.median(values):.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes-mb", default="10,100")
    parser.add_argument("--hosts", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warm-rounds", type=int, default=8)
    parser.add_argument("--link-mbit", type=int, default=200,
                        help="then again the largest size to the most hosts, every link limited to this (0: not)")
    args = parser.parse_args()
    why = unavailable()
    if why:
        print(f"code shipping benchmarks skipped: {why}")
        return 0
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    host_counts = [int(h) for h in args.hosts.split(",")]
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-code-", dir="/var/tmp") as tmp, \
            TestHosts(max(host_counts)) as hosts:
        scratch = Path(tmp)
        scratch.chmod(0o755)  # a job without code runs in a tree here, as its own user
        os.environ["XDG_CACHE_HOME"] = str(scratch / "client-cache")  # the CLI's memory of packed trees
        agents = {f"h{i}": {"host_prefix": hosts.prefix(i), "extra": ["--cache-bytes", CACHE_BYTES]}
                  for i in range(1, max(host_counts) + 1)}
        with running_cluster(scratch / "cluster", agents, coordinator_host=hosts.coordinator_ip) as cluster, \
                cluster.client() as client:
            for megabytes in sizes:
                results.update(measure_size(client, hosts, scratch, megabytes, host_counts, args.rounds))
            warm = warm_starts(client, scratch, max(host_counts), args.warm_rounds)
            added = (statistics.median(warm["code"]) - statistics.median(warm["none"])) * 1000
            results[f"warm start, {max(host_counts)} hosts"] = \
                f"+{added:.0f} ms (median {statistics.median(warm['code']) * 1000:.0f} ms with cached code, " \
                f"{statistics.median(warm['none']) * 1000:.0f} ms without code; target < 50 ms added)"
            if args.link_mbit:
                limit_links(hosts, args.link_mbit)
                results.update({f"{k} ({args.link_mbit} Mbit/s links)": v for k, v in measure_size(
                    client, hosts, scratch, max(sizes), [max(host_counts)], 1).items()})
    show_and_save(results, "code_shipping.json")
    return 0


def measure_size(client, hosts: TestHosts, scratch: Path, megabytes: int, host_counts: list[int],
                 rounds: int) -> dict[str, str]:
    """One size: the plain copy of its archive, then the cold distribution to each host count."""
    tree = make_tree(scratch / f"copy-{megabytes}", megabytes)
    from tfcluster import codepack
    archive = codepack.pack(tree)
    try:
        copies = plain_copies(hosts, archive.path, scratch / "copied", 3)
    finally:
        archive.remove()
        subprocess.run(["rm", "-rf", str(tree)], check=True)
    copy = statistics.median(copies)
    results = {f"{megabytes} MB: one plain copy": f"{summary(copies)} ({archive.size / 1e6 / copy:.0f} MB/s)"}
    for count in host_counts:
        times = cold_starts(client, scratch, megabytes, count, rounds)
        median = statistics.median(times["distribution"])
        results[f"{megabytes} MB to {count} hosts: upload"] = summary(times["upload"])
        results[f"{megabytes} MB to {count} hosts: submit -> all RUNNING"] = \
            f"{summary(times['distribution'])} = {median / (count * copy):.2f} x ({count} x one copy)"
    return results


if __name__ == "__main__":
    sys.exit(main())
