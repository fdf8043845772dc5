"""What handing work from one thread or process to another costs on this machine (a benchmark, not a test): the
price of each of the context switches that `perf stat` counts in the daemons per tiny job (docs/benchmarks.md,
"What a tiny job's CPU is made of"), beside the same work done without a switch, measured in the same run.

- thread: two threads of one Python process pass a token back and forth through `queue.SimpleQueue`, as an agent
  hands a launch to an attempt's thread and a report to its stream's thread; the floor is the same put and get
  in one thread;
- process: two processes pass a byte back and forth through a pair of pipes, as an agent, its launcher and a shim
  hand an attempt on; the floor is the same write and read in one process.

Each figure is the CPU of both sides (threads: the process's; processes: the parent's and the child's, reaped)
over the number of handoffs, the median of the rounds.

Usage: python bench/handoff.py [--handoffs N] [--rounds N]   Prints a table and writes bench/handoff.json.
"""

from __future__ import annotations

import argparse
import os
import queue
import resource
import statistics
import threading
import time

from report import show_and_save


def thread_handoffs(round_trips: int) -> float:
    """µs of CPU per handoff between two threads (two handoffs a round trip)."""
    there, back = queue.SimpleQueue(), queue.SimpleQueue()

    def peer() -> None:
        for _ in range(round_trips):
            back.put(there.get())

    thread = threading.Thread(target=peer)
    thread.start()
    began = time.process_time()
    for i in range(round_trips):
        there.put(i)
        back.get()
    thread.join()
    return (time.process_time() - began) / (2 * round_trips) * 1e6


def thread_floor(round_trips: int) -> float:
    """µs of CPU for the same put and get, in one thread (no switch)."""
    same = queue.SimpleQueue()
    began = time.process_time()
    for i in range(round_trips):
        same.put(i)
        same.get()
    return (time.process_time() - began) / round_trips * 1e6  # a handoff's share of a round trip: a put and a get


def process_handoffs(round_trips: int) -> float:
    """µs of CPU per handoff between two processes over pipes, both sides counted."""
    there_r, there_w = os.pipe()
    back_r, back_w = os.pipe()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.process_time()
    pid = os.fork()
    if pid == 0:
        try:
            for _ in range(round_trips):
                os.write(back_w, os.read(there_r, 1))
        finally:
            os._exit(0)
    for _ in range(round_trips):
        os.write(there_w, b"x")
        os.read(back_r, 1)
    os.waitpid(pid, 0)
    mine = time.process_time() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    for fd in (there_r, there_w, back_r, back_w):
        os.close(fd)
    return (mine + child) / (2 * round_trips) * 1e6


def process_floor(round_trips: int) -> float:
    """µs of CPU for the same write and read, in one process (no switch)."""
    read_end, write_end = os.pipe()
    began = time.process_time()
    for _ in range(round_trips):
        os.write(write_end, b"x")
        os.read(read_end, 1)
    spent = time.process_time() - began
    os.close(read_end)
    os.close(write_end)
    return spent / round_trips * 1e6  # a handoff's share of a round trip: a write and a read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handoffs", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    trips = options.handoffs // 2
    figures: dict[str, list[float]] = {"thread": [], "thread_floor": [], "process": [], "process_floor": []}
    for _ in range(options.rounds):  # alternated, so a change in the machine's speed touches each side alike
        figures["thread"].append(thread_handoffs(trips))
        figures["thread_floor"].append(thread_floor(trips))
        figures["process"].append(process_handoffs(trips))
        figures["process_floor"].append(process_floor(trips))
    median = {name: statistics.median(values) for name, values in figures.items()}
    results = {"handoffs": f"{options.rounds} rounds of {2 * trips} handoffs each way of working",
               "cores": os.cpu_count(), "load_average_1min": round(os.getloadavg()[0], 1)}
    for kind in ("thread", "process"):
        values = figures[kind]
        results[f"{kind}_handoff_us"] = (f"{median[kind]:.1f} µs of CPU a handoff (rounds {min(values):.1f}-"
                                         f"{max(values):.1f})")
        results[f"{kind}_floor_us"] = f"{median[f'{kind}_floor']:.2f} µs (the same work, no switch)"
        results[f"{kind}_handoff_vs_floor"] = round(median[kind] / median[f"{kind}_floor"], 1)
    show_and_save(results, "handoff.json")


if __name__ == "__main__":
    main()
