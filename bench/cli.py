"""How quickly the CLI answers and jobs go through (a benchmark, not a test), each figure beside its floor
measured in the same run, on a local cluster (a real coordinator and two agents over mutual TLS):

- status: `tfcluster status` wall time, alternated with the floor (a Python that imports grpc and typer)
- start: `tfcluster start` of a 2-task job until every task is RUNNING (read with GetStatus every 2 ms),
  beside the floor (a Python that imports grpc and typer, and the store write and launch that no CLI can skip
  are in the figure); and the same job submitted through the client library, which is the store write and
  the launch alone
- throughput: jobs of 2 tasks running `true`, submitted by one client on several threads at once (one thread
  alone waits a round trip per job, and would measure itself), from the first submission to the last job
  SUCCEEDED; the CPU each job costs, by process, beside the floor (its two `true` processes forked and run by
  a bare loop, nothing recorded), and the rate that CPU allows on this machine's cores; three rounds, the median
  round's figures
- sustained (only when named): the throughput's jobs, SUSTAINED_JOBS of them: what a long run of tiny jobs (a sweep)
  costs once the agents keep thousands of ended attempts
- tf: a 2-worker MultiWorkerMirroredStrategy Keras program (TensorFlow's multi-worker tutorial, on synthetic
  data) under `tfcluster start --wait`, against the same program launched by hand with TF_CONFIG, rounds
  alternated (needs the tf extra)

Usage: python bench/cli.py [--quick] [--state-dir DIR] [status|start|throughput|sustained|tf ...]   (all but sustained by default)
Prints a table and writes bench/cli.json.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from harness import PYTHON, LocalCluster, free_port, wait_until  # noqa: E402
from report import filesystem_of, show_and_save  # noqa: E402  (bench/, the folder of the script run)

FLOOR = [PYTHON, "-c", "import grpc, typer"]
FIGURES = ("status", "start", "throughput", "tf")
NAMED_ONLY = ("sustained",)  # run only when named: it takes minutes
SUSTAINED_JOBS = 10_000  # more than an agent kept ended attempts of (4,096) before it bounded its hooks' work
TF_PROGRAM = Path(__file__).resolve().parent / "tf_main.py"
SUBMITTING_THREADS = 4


def wall(argv: list[str], env: dict[str, str] | None = None) -> float:
    began = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True, env={**os.environ, **(env or {})})
    return time.monotonic() - began


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms (min {min(values) * 1000:.0f}, max {max(values) * 1000:.0f})"


def status_figures(cluster: LocalCluster, rounds: int) -> dict[str, str]:
    status, floor = [], []
    for _ in range(rounds):
        status.append(wall([PYTHON, "-m", "tfcluster.cli", "status"], cluster.client_env()))
        floor.append(wall(FLOOR))
    return {"status": ms(status), "status_floor_import_grpc_typer": ms(floor),
            "status_over_floor": f"{statistics.median(status) / statistics.median(floor):.2f}x"}


def start_figures(cluster: LocalCluster, rounds: int) -> dict[str, str]:
    from tfcluster.specfile import parse_spec

    to_running, by_library, floor = [], [], []
    argv = [PYTHON, "-m", "tfcluster.cli", "start", "--name", "quick", "--strategy", "multi_worker_mirrored",
            "--workers", "2", "--", "sleep", "30"]
    spec = parse_spec({"name": "quick", "strategy": "multi_worker_mirrored", "workdir": "/", "command": ["sleep", "30"],
                       "roles": {"worker": {"count": 2}}}, source="bench")
    env = {**os.environ, **cluster.client_env()}
    with cluster.client() as client:
        def until_running(began: float, submit) -> float:
            job_id = submit()
            wait_until(lambda: all(t.state == "RUNNING" for t in client.job(job_id).tasks), 30, interval=0.002,
                       what="every task RUNNING")
            took = time.monotonic() - began
            client.stop(job_id, graceful=False)
            wait_until(lambda: client.job(job_id).state == "STOPPED", 30, interval=0.02, what="STOPPED")
            return took

        for _ in range(rounds):
            to_running.append(until_running(time.monotonic(), lambda: subprocess.run(
                argv, check=True, capture_output=True, text=True, env=env).stdout.strip()))
            by_library.append(until_running(time.monotonic(), lambda: client.submit(spec)))
            floor.append(wall(FLOOR))
    return {"start_to_running": ms(to_running), "start_floor_import_grpc_typer": ms(floor),
            "start_over_floor": f"{statistics.median(to_running) / statistics.median(floor):.2f}x",
            "start_by_client_library_to_running": ms(by_library)}


def cpu_seconds(cluster: LocalCluster) -> dict[str, float]:
    """CPU used so far by the coordinator, the agents, and what the agents started (task launchers, shims and
    the tasks, reaped by the launcher or still alive: a shim serves several attempts, so it may be neither),
    and this process (the client). Each process counts itself and the children it reaped, so none is counted
    twice."""
    def used(process: psutil.Process) -> float:
        try:
            times = process.cpu_times()
            return times.user + times.system + times.children_user + times.children_system
        except psutil.NoSuchProcess:
            return 0.0

    agents = [psutil.Process(agent.proc.pid) for agent in cluster.agents.values()]
    return {"coordinator": used(psutil.Process(cluster.coordinator.proc.pid)),
            "agents": sum(used(agent) for agent in agents),
            "launchers_shims_tasks": sum(used(child) for agent in agents for child in _descendants(agent)),
            "client": used(psutil.Process())}


def _descendants(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def spawn_floor_ms(jobs: int) -> float:
    """CPU per job of running its two `true` processes and nothing else (forked, run and reaped by a loop in a
    small Python): what any launcher pays, however little it records."""
    loop = "import subprocess\nfor _ in range(%d): subprocess.run(['true'])" % (2 * jobs)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([PYTHON, "-S", "-c", "pass"], check=True)  # the interpreter's own start, taken off below
    started = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([PYTHON, "-S", "-c", loop], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)

    def cpu(a, b) -> float:
        return b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime
    return max(0.0, cpu(started, after) - cpu(before, started)) / jobs * 1000


def one_burst(cluster: LocalCluster, jobs: int) -> tuple[float, float, dict[str, float]]:
    """Submits the jobs at once and watches each to its end: the jobs a second, the submissions a second, and the
    CPU per job (ms) by process."""
    from tfcluster.specfile import parse_spec
    from tfcluster.states import ENDED_JOB_STATES, JobState

    spec = parse_spec({"name": "tiny", "strategy": "multi_worker_mirrored", "workdir": "/", "command": ["true"],
                       "roles": {"worker": {"count": 2}}}, source="bench")
    with cluster.client() as client, ThreadPoolExecutor(SUBMITTING_THREADS) as pool:
        cpu_before = cpu_seconds(cluster)
        first = time.time()
        ids = list(pool.map(lambda _: client.submit(spec), range(jobs)))
        submitted = time.time() - first
        ended = [next(j for j in client.watch(job_id, ENDED_JOB_STATES) if j.state in ENDED_JOB_STATES) for job_id in ids]
        cpu = {k: (v - cpu_before[k]) / jobs * 1000 for k, v in cpu_seconds(cluster).items()}
    failed = [j.id for j in ended if j.state != JobState.SUCCEEDED]
    if failed:
        raise RuntimeError(f"{len(failed)} of {jobs} tiny jobs did not succeed, {failed[0]} first")
    return jobs / (max(j.finished for j in ended) - first), jobs / submitted, cpu


def throughput_figures(cluster: LocalCluster, jobs: int, rounds: int, name: str = "throughput") -> dict[str, str]:
    """The tiny jobs in rounds on the same cluster, each figure the median round's. One round swings by a quarter
    on a root filesystem that has just freed many inodes (docs/benchmarks.md, "Tiny jobs and the filesystem")."""
    runs = [one_burst(cluster, jobs) for _ in range(rounds)]
    rates = [rate for rate, _, _ in runs]
    cpu = {k: statistics.median(c[k] for _, _, c in runs) for k in runs[0][2]}
    per_job, floor = statistics.median(sum(c.values()) for _, _, c in runs), spawn_floor_ms(jobs)
    return {f"{name}_jobs": f"{rounds} rounds of {jobs} jobs of 2 tasks running `true`",
            f"{name}_submit_only": f"{statistics.median(s for _, s, _ in runs):.0f} jobs/s",
            f"{name}_jobs_per_second": f"{statistics.median(rates):.1f} jobs/s (first submission to last SUCCEEDED; "
                                       f"rounds {', '.join(f'{r:.1f}' for r in rates)})",
            f"{name}_cpu_per_job": f"{per_job:.1f} ms (" + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
                                   + f"; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f})",
            f"{name}_cpu_floor_two_bare_processes": f"{floor:.1f} ms per job",
            f"{name}_cpu_vs_floor": round(per_job / floor, 1),
            f"{name}_cpu_bound": f"{os.cpu_count() * 1000 / per_job:.1f} jobs/s (the cores' time over the CPU per "
                                 f"job: the rate with nothing else running)"}


def by_hand(workdir: Path, epochs: int) -> float:
    """The two workers started as the tutorial does: the same program, TF_CONFIG in each one's environment."""
    ports = [free_port(), free_port()]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    began = time.monotonic()
    procs = [subprocess.Popen([PYTHON, str(TF_PROGRAM)], cwd=workdir, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL,
                              env={**os.environ, "EPOCHS": str(epochs), "CUDA_VISIBLE_DEVICES": "",
                                   "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker",
                                                                                         "index": i}})})
             for i in range(2)]
    codes = [p.wait() for p in procs]
    if codes != [0, 0]:
        raise RuntimeError(f"the workers started by hand exited {codes}")
    return time.monotonic() - began


def under_tfcluster(cluster: LocalCluster, workdir: Path, epochs: int) -> float:
    began = time.monotonic()
    cluster.cli("start", "--name", "tutorial", "--strategy", "multi_worker_mirrored", "--workers", "2",
                "--max-restarts", "0", "-e", f"EPOCHS={epochs}", "--wait", "--",
                PYTHON, str(TF_PROGRAM), check=True, timeout=600)
    return time.monotonic() - began


def tf_figures(cluster: LocalCluster, rounds: int, epochs: int) -> dict[str, str]:
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-tf-", dir="/var/tmp") as tmp:
        os.chmod(tmp, 0o777)
        hand, managed = [], []
        for r in range(rounds):  # alternated, each first in turn: both meet the same machine
            for run in ((by_hand, under_tfcluster) if r % 2 == 0 else (under_tfcluster, by_hand)):
                if run is by_hand:
                    hand.append(by_hand(Path(tmp), epochs))
                else:
                    managed.append(under_tfcluster(cluster, Path(tmp), epochs))
    ratio = statistics.median(managed) / statistics.median(hand)
    return {"tf_by_hand_with_tf_config": ms(hand), "tf_under_start_wait": ms(managed),
            "tf_start_wait_over_by_hand": f"{ratio:.3f}x ({(ratio - 1) * 100:+.1f}%)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("figures", nargs="*", choices=[*FIGURES, *NAMED_ONLY, []], metavar="FIGURE",
                        help=", ".join([*FIGURES, *NAMED_ONLY]))
    parser.add_argument("--quick", action="store_true", help="Fewer rounds and jobs: a smoke run.")
    parser.add_argument("--state-dir", default="/var/tmp", type=Path,
                        help="Where the cluster's state dirs go (the agents' attempt dirs): /var/tmp, on the root "
                             "filesystem, by default; a tmpfs such as /dev/shm measures without the disk's.")
    options = parser.parse_args()
    figures = options.figures or FIGURES
    rounds = 5 if options.quick else 21
    # An installed tfcluster has its bytecode compiled (pip does it); a checkout run with
    # PYTHONDONTWRITEBYTECODE would compile every module at each command and measure the compiler.
    compileall.compile_dir(ROOT / "tfcluster", quiet=1)
    results: dict[str, str] = {}
    results["state_dir_filesystem"] = f"{filesystem_of(options.state_dir)} ({options.state_dir})"
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-", dir=options.state_dir) as tmp:
        os.chmod(tmp, 0o711)  # tasks run as their jobs' users: they must reach what is under it
        cluster = LocalCluster(root=Path(tmp))
        try:
            # Every job submitted is watched to its end: none may be forgotten before (1,000 are kept by default).
            cluster.start_coordinator("--keep-finished-jobs", str(2 * SUSTAINED_JOBS))
            cluster.start_agents({"a": {}, "b": {}})
            if "status" in figures:
                results.update(status_figures(cluster, rounds))
            if "start" in figures:
                results.update(start_figures(cluster, rounds))
            if "throughput" in figures:
                results.update(throughput_figures(cluster, 20 if options.quick else 200, 1 if options.quick else 3))
            if "sustained" in figures:
                results.update(throughput_figures(cluster, 500 if options.quick else SUSTAINED_JOBS, 1, "sustained"))
            if "tf" in figures:
                results.update(tf_figures(cluster, 2 if options.quick else 6, 2 if options.quick else 5))
        finally:
            cluster.teardown()
    show_and_save(results, "cli.json")


if __name__ == "__main__":
    main()
