"""Summary lag (a benchmark, not a test): from a scalar written on a node to the same scalar served by the
coordinator's TensorBoard through the URL `tfcluster tensorboard` prints, against the same event file read on
the node itself, both measured in the same run.

A real LocalCluster over mutual TLS with its HTTPS dashboard: a task writes the scalar `loss` every --every
seconds with tensorboard's event writer, flushed at once, each event carrying the wall time it was written at.
Meanwhile this script (1) reads the task's event file where it lies on the node (its TFCLUSTER_SUMMARY_DIR)
with TensorBoard's own event loader, and (2) asks the board's scalars API through the URL, logged in by the
one-time link, both every --poll seconds; the lag of a step is when it was first seen minus its wall time. The
local read is the floor: what any reader polling as often would see; the ratio says what the way through the
agent, the coordinator and TensorBoard adds.

Usage: python bench/summary_lag.py [--seconds 60] [--every 0.25] [--poll 0.1]
Prints a table and writes bench/summary_lag.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]

from harness import LocalCluster, free_port, wait_until  # noqa: E402
from test_tensorboard_url import Browser  # noqa: E402

from tfcluster import layout  # noqa: E402

sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))  # as the board

WRITER = """
import os, sys, time
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
writer = EventFileWriter(os.environ["TFCLUSTER_SUMMARY_DIR"])
for step in range(10**6):
    value = summary_pb2.Summary.Value(tag="loss", simple_value=step)
    writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value])))
    writer.flush()
    time.sleep(float(sys.argv[1]))
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def read_locally(folder: Path, poll: float, seen: dict[int, float], stop: threading.Event) -> None:
    """Step -> its lag when first read from the node's own event file (the newest), polled as the URL is, with
    the reader the board uses (TensorBoard's, without TensorFlow)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    loader = EventFileLoader(str(max(folder.glob("events.out.tfevents.*"))))
    while not stop.is_set():
        for event in loader.Load():
            if event.summary.value:
                seen.setdefault(event.step, time.time() - event.wall_time)
        time.sleep(poll)


def read_through_url(browser: Browser, board: str, run: str, poll: float, seen: dict[int, float],
                     stop: threading.Event) -> None:
    while not stop.is_set():
        now = time.time()
        for wall, step, _ in browser.scalars(board, run, "loss"):
            seen.setdefault(step, now - wall)
        time.sleep(poll)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--every", type=float, default=0.25)
    parser.add_argument("--poll", type=float, default=0.1)
    args = parser.parse_args()
    http = f"127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-lag-") as root:
        os.chmod(root, 0o711)  # the task runs as its job's user: it must reach its summary dir under here
        cluster = LocalCluster(root=Path(root))
        try:
            cluster.start_coordinator("--http-listen", http)
            cluster.start_agents({"a": {}})
            job_id = cluster.cli("start", "--name", "lag", "--strategy", "mirrored", "--", "python3", "-c", WRITER,
                                 str(args.every), check=True).stdout.strip()
            link = cluster.cli("tensorboard", job_id, "--no-browser", check=True).stdout.strip()
            browser = Browser(cluster, http)
            board, run = browser.open_link(link), f"{job_id}/worker:0"
            wait_until(lambda: browser.scalars(board, run, "loss"), 120, what="the first scalars through the URL")
            local_folder = Path(layout.task_summary_dir(cluster.agent_state_dir("a"), job_id, "worker", 0))
            local, served, stop = {}, {}, threading.Event()
            first_step = max(step for _, step, _ in browser.scalars(board, run, "loss")) + 1
            readers = [threading.Thread(target=read_locally, args=(local_folder, args.poll, local, stop)),
                       threading.Thread(target=read_through_url, args=(browser, board, run, args.poll, served, stop))]
            for reader in readers:
                reader.start()
            time.sleep(args.seconds)
            stop.set()
            for reader in readers:
                reader.join()
        finally:
            cluster.teardown()
    steps = sorted(s for s in served if s >= first_step and s in local)
    report(args, [local[s] for s in steps], [served[s] for s in steps])


def report(args, local: list[float], served: list[float]) -> None:
    rows = {name: {"p50": percentile(lags, 50), "p99": percentile(lags, 99), "max": max(lags)}
            for name, lags in (("on the node", local), ("through the URL", served))}
    print(f"summary lag, {len(served)} steps written every {args.every} s, each reader polling every {args.poll} s")
    print(f"{'read':<18}{'p50 s':>8}{'p99 s':>8}{'max s':>8}")
    for name, row in rows.items():
        print(f"{name:<18}{row['p50']:>8.3f}{row['p99']:>8.3f}{row['max']:>8.3f}")
    ratio = {q: rows["through the URL"][q] / max(rows["on the node"][q], 1e-6) for q in ("p50", "p99")}
    print(f"through the URL / on the node: p50 {ratio['p50']:.1f}x, p99 {ratio['p99']:.1f}x; "
          f"mean {statistics.mean(served):.3f} s")
    (ROOT / "bench" / "summary_lag.json").write_text(json.dumps({"steps": len(served), "every": args.every,
                                                                 "poll": args.poll, **rows, "ratio": ratio},
                                                                indent=2) + "\n")


if __name__ == "__main__":
    main()
