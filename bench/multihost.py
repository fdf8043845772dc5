"""Multi-host benchmarks on network-namespace test hosts (needs root): checkpoint shipping throughput over
a veth link (mutual TLS as agents ship, and plain text in the same run as the baseline), and the time from a
checkpoint's commit on the chief's host to its evaluation on the evaluator's host in a real job with
host-local checkpoints.

Prints a table and writes bench/multihost.json. Run with `make bench` (skipped when not root).
"""

from __future__ import annotations

import datetime
import json
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from harness import PYTHON, kill_group, running_cluster  # noqa: E402
from report import show_and_save  # noqa: E402  (bench/, the folder of the script run)
from tfcluster import pki  # noqa: E402
from tfcluster.demo.hosts import TestHosts, unavailable  # noqa: E402

SHIP_MB = 256
SHIP_ROUNDS = 3

# argv: address, destination, credentials dir ("" for plain text)
RECEIVER = """
import sys, time
from pathlib import Path
from tfcluster import pki
from tfcluster.daemon.agent.peers.server import PeerServer, PeerServicer
from tfcluster.security import Credentials
creds = Credentials.from_dir(Path(sys.argv[3]), pki.NODE_CERT, pki.NODE_KEY) if sys.argv[3] else Credentials()
server = PeerServer(sys.argv[1], PeerServicer(Path(sys.argv[2])), lambda: creds)  # kept: a dropped server stops
server.start()
print("ready", flush=True)
time.sleep(3600)
"""

# argv: address, source dir, rounds, credentials dir ("" for plain text), the receiving node's name
SENDER = """
import os, sys, json
from pathlib import Path
from tfcluster import pki
from tfcluster.daemon.agent.hooks.shipping import Peer, checkpoint_files, put_files
from tfcluster.security import Credentials
creds = Credentials.from_dir(Path(sys.argv[4]), pki.NODE_CERT, pki.NODE_KEY) if sys.argv[4] else Credentials()
d = sys.argv[2]
names = checkpoint_files(d, os.path.join(d, "ckpt-1"))
results = []
for i in range(int(sys.argv[3])):
    size, seconds = put_files(Peer(sys.argv[1], sys.argv[5]), f"bench-{i + 1}", d, names, creds,
                              {"checkpoint": b'model_checkpoint_path: "ckpt-1"\\n'})
    results.append(size / 1e6 / seconds)
print(json.dumps(results))
"""


def node_credentials(ca: "pki.Authority", name: str, ip: str, directory: Path) -> str:
    """A node's credentials directory, as joining would have left it."""
    key, cert = ca.issue(name, pki.NODE, datetime.timedelta(hours=1), [pki.node_server_name(name), ip])
    directory.mkdir()
    (directory / pki.CA_CERT).write_bytes(ca.pem)
    (directory / pki.NODE_CERT).write_bytes(cert)
    pki.write_private(directory / pki.NODE_KEY, key)
    return str(directory)


def shipping_throughput(hosts: TestHosts, tmp: Path) -> dict:
    source = tmp / "source"
    source.mkdir()
    with open(source / "ckpt-1.data-00000-of-00001", "wb") as f:
        for _ in range(SHIP_MB):
            f.write(bytearray(range(256)) * 4096)  # 1 MiB; content does not matter (nothing compresses)
    (source / "ckpt-1.index").write_bytes(b"index")
    ca = pki.init_ca(tmp / "ca", [])
    tls = tuple(node_credentials(ca, f"h{i}", hosts.ip(i), tmp / f"h{i}-tls") for i in (1, 2))
    result = {"ship_checkpoint_mb": round(SHIP_MB * 1.048576)}
    medians = {}
    for mode, (sender, receiver) in (("tls", tls), ("plain", ("", ""))):
        runs = _ship(hosts, source, tmp / f"dest-{mode}", sender, receiver, port=27000 + len(medians))
        medians[mode] = statistics.median(runs)
        result[f"ship_veth_{mode}_mb_per_s"] = f"{medians[mode]:.0f} (runs: {', '.join(f'{v:.0f}' for v in runs)})"
    result["ship_tls_vs_plain"] = f"{medians['tls'] / medians['plain']:.2f}x"
    return result


def _ship(hosts: TestHosts, source: Path, dest: Path, sender: str, receiver: str, port: int) -> list[float]:
    address = f"{hosts.ip(2)}:{port}"
    server = subprocess.Popen([*hosts.prefix(2), PYTHON, "-c", RECEIVER, address, str(dest), receiver],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        sent = subprocess.run([*hosts.prefix(1), PYTHON, "-c", SENDER, address, str(source), str(SHIP_ROUNDS),
                               sender, "h2"], capture_output=True, text=True)
        if sent.returncode != 0:
            raise RuntimeError(f"shipping to {address} failed:\n{sent.stderr[-2000:]}")
        return json.loads(sent.stdout)
    finally:
        kill_group(server.pid)
        server.wait()


SPEC = """
workdir = "{examples}"
name = "latency"
strategy = "multi_worker_mirrored"
command = ["python3", "mwms_fit.py"]
env = {{ EPOCHS = "8", EPOCH_PAUSE_SECONDS = "1.0" }}
[roles.chief]
nodes = ["h1"]
[roles.worker]
count = 1
nodes = ["h2"]
[roles.evaluator]
nodes = ["h3"]
entrypoint = "tfcluster.demo.digits:evaluation"
"""


def commit_to_evaluation(hosts: TestHosts, tmp: Path) -> dict:
    (tmp / "cluster").mkdir()
    agents = {f"h{i}": {"host_prefix": hosts.prefix(i)} for i in (1, 2, 3)}
    with running_cluster(tmp / "cluster", agents, coordinator_host=hosts.coordinator_ip) as cluster:
        spec = tmp / "latency.toml"
        spec.write_text(textwrap.dedent(SPEC.format(examples=ROOT / "examples")))
        result = cluster.cli("start", str(spec), "--wait", timeout=600)
        job = cluster.job(result.stdout.strip())
        assert job["state"] == "SUCCEEDED", job["message"]
        # Commit times, as TensorFlow recorded them in the chief's checkpoint state file.
        state = (cluster.agent_state_dir("h1") / "jobs" / job["id"] / "checkpoints" / "checkpoint").read_text()
        paths = re.findall(r'all_model_checkpoint_paths: "([^"]+)"', state)
        stamps = [float(t) for t in re.findall(r"all_model_checkpoint_timestamps: ([0-9.]+)", state)]
        committed = {Path(p).name: t for p, t in zip(paths, stamps)}
        lags = [e["time"] - committed[Path(e["checkpoint"]).name] for e in job["evaluation"]["history"]
                if Path(e["checkpoint"]).name in committed]
        shipped = [float(m) for m in re.findall(r"shipped ckpt-\d+ to .*?: [\d.]+ MB in ([\d.]+) s",
                                                cluster.agents["h1"].log())]
    return {"commit_to_evaluation_s": f"median {statistics.median(lags):.2f}, max {max(lags):.2f} "
                                      f"({len(lags)} checkpoints)",
            "ship_one_small_checkpoint_s": f"median {statistics.median(shipped):.3f} ({len(shipped)} shipments)"}


def main() -> None:
    why = unavailable()
    if why:
        print(f"multi-host benchmarks skipped: {why}")
        return
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-hosts-") as tmp, TestHosts(3) as hosts:
        results.update(shipping_throughput(hosts, Path(tmp)))
        results.update(commit_to_evaluation(hosts, Path(tmp)))
    show_and_save(results, "multihost.json")


if __name__ == "__main__":
    main()
