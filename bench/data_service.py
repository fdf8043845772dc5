"""Steps per second of an input-bound toy job with 0, 1 and 2 tf.data service data workers.

The input pipeline makes each example cost CPU (`--cost` rounds of a 64x64 matmul in a map), the training step is
tiny, so the reader waits on input. With 0 workers the pipeline runs in the reader's process; with N it runs
on N data workers (tfcluster's own programs, `python -m tfcluster.roles.data_service dispatcher|data_worker`,
given the environment tfcluster gives those tasks) and the reader takes batches through `distribute`
("parallel_epochs"). Every server and the reader are separate processes on this machine, so the speedup is
bounded by its cores: the reader and each data worker compete for them. Prints a table with the ratio to 0
workers and writes bench/data_service.json.

    .venv/bin/python bench/data_service.py [--steps 60] [--cost 40] [--workers 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READER = r"""
import json, os, sys, time
import tensorflow as tf
steps, cost, service = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

def heavy(i):
    x = tf.random.stateless_uniform((64, 64), seed=tf.stack([i, i]))
    for _ in range(cost):
        x = tf.tanh(tf.matmul(x, x) / 64.0)
    return x

ds = tf.data.Dataset.range(1 << 30).map(heavy, num_parallel_calls=tf.data.AUTOTUNE).batch(8)
if service:
    ds = ds.apply(tf.data.experimental.service.distribute(processing_mode="parallel_epochs", service=service))
ds = ds.prefetch(2)
w = tf.Variable(tf.zeros((64, 64)))

@tf.function
def step(batch):
    w.assign_add(tf.reduce_mean(batch, axis=0) * 1e-3)

it = iter(ds)
for _ in range(5):  # warm up: the first batches include starting the pipeline
    step(next(it))
start = time.perf_counter()
for _ in range(steps):
    step(next(it))
print(json.dumps({"steps_per_second": steps / (time.perf_counter() - start)}), flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(role: str, port: int, dispatcher: int, state: str) -> subprocess.Popen:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "-1", "TFCLUSTER_PORT": str(port),
           "TFCLUSTER_ADDRESS": f"127.0.0.1:{port}", "TFCLUSTER_CHECKPOINT_DIR": state,
           "TFCLUSTER_DATA_SERVICE": f"grpc://127.0.0.1:{dispatcher}"}
    return subprocess.Popen([sys.executable, "-m", "tfcluster.roles.data_service", role], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def run(workers: int, steps: int, cost: int) -> float:
    servers: list[subprocess.Popen] = []
    try:
        service = ""
        if workers:
            state = tempfile.mkdtemp(prefix="tfcluster-bench-data-")
            dispatcher = free_port()
            servers.append(start_server("dispatcher", dispatcher, dispatcher, state))
            servers += [start_server("data_worker", free_port(), dispatcher, state) for _ in range(workers)]
            service = f"grpc://127.0.0.1:{dispatcher}"
        out = subprocess.run([sys.executable, "-c", READER, str(steps), str(cost), service], capture_output=True,
                             text=True, timeout=600, env={**os.environ, "CUDA_VISIBLE_DEVICES": "-1"})
        if out.returncode:
            raise SystemExit(f"reader with {workers} data workers failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])["steps_per_second"]
    finally:
        for server in servers:
            os.killpg(server.pid, 9)
            server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--cost", type=int, default=40, help="matmul rounds per example")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    started = time.time()
    rates = {n: run(n, args.steps, args.cost) for n in args.workers}
    base = rates.get(0)
    print(f"input-bound toy job, {args.steps} steps, cost {args.cost}, {os.cpu_count()} cores")
    print(f"{'data workers':>12}  {'steps/s':>8}  {'vs 0':>6}")
    for n, rate in rates.items():
        print(f"{n:>12}  {rate:>8.2f}  {(f'{rate / base:.2f}x' if base else '-'):>6}")
    result = {"cores": os.cpu_count(), "steps": args.steps, "cost": args.cost, "seconds": time.time() - started,
              "steps_per_second": {str(n): r for n, r in rates.items()}}
    (ROOT / "bench" / "data_service.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
