"""What a job's environment adds to a task's start once it is built on the node (a benchmark, not a test): the
time from an agent's launch to the task RUNNING, with a warm environment (built by an earlier job) against the
same task with none, rounds alternated in the same run. Target: under 50 ms added. Also what reading the
requirements file costs: as the task's user (a child process that switches users, code/request_files.py), as every
start with an environment reads it, against a read in the agent's own process.

The environment is built first, with the real uv, from a wheel written here and served with UV_FIND_LINKS
and no index. Runs as root; tasks run as a job's own UID, as they do by default.

Usage: python bench/environments.py [--rounds N]   prints a table and writes bench/environments.json.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tfcluster.commands import Launch  # noqa: E402
from tfcluster.daemon.agent.code.environments import Environments  # noqa: E402
from tfcluster.daemon.agent.code.request_files import read_as, read_files  # noqa: E402
from tfcluster.daemon.agent.tasks.supervisor import Supervisor  # noqa: E402
from tfcluster.daemon.agent.tasks.users import TaskUsers, make_state_dir  # noqa: E402
from tfcluster.model import Attempt, EnvironmentSpec  # noqa: E402
from tfcluster.states import Phase  # noqa: E402
from wheels import write_wheel  # noqa: E402

UID = 61998  # the job's task user


def read_times(work: Path, rounds: int) -> dict[str, float]:
    """Median ms to read the requirements file as the task's user, and in this process."""
    files = [("requirements.txt", False)]
    times: dict[str, list[float]] = {"as the task's user": [], "in the agent": []}
    for _ in range(rounds):
        for how, read in (("as the task's user", lambda: read_as(str(work), files, UID, UID)),
                          ("in the agent", lambda: read_files(str(work), files))):
            began = time.perf_counter()
            read()
            times[how].append(time.perf_counter() - began)
    return {how: statistics.median(t) * 1000 for how, t in times.items()}


def time_to_running(supervisor: Supervisor, running: dict, job: str, work: Path, spec: EnvironmentSpec) -> float:
    attempt = Attempt(job, "worker", 0, 1)
    event = running[attempt] = threading.Event()
    began = time.perf_counter()
    supervisor.launch(Launch("n", attempt, ("true",), {"PATH": os.environ["PATH"]}, str(work), 0, 1.0,
                             uid=UID, gid=UID, environment=spec))
    if not event.wait(60):
        raise RuntimeError(f"{job} did not start: {supervisor.current(attempt).exit}")
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    rounds = parser.parse_args().rounds
    os.environ["UV_NO_INDEX"] = "1"
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        root.chmod(0o755)  # the task's user reads the workdir
        write_wheel(root / "wheels")
        (root / "work").mkdir()
        (root / "work" / "requirements.txt").write_text("tinypkg\n")
        make_state_dir(root / "state")
        running: dict[Attempt, threading.Event] = {}

        def on_report(record) -> None:
            if record.phase == Phase.RUNNING and record.attempt in running:
                running[record.attempt].set()

        environments = Environments(root / "state", find_links=str(root / "wheels"))
        supervisor = Supervisor(root / "state", on_report, task_users=TaskUsers(), environments=environments)
        supervisor.launcher.warm()
        spec = EnvironmentSpec("requirements.txt")
        build = time_to_running(supervisor, running, "build", root / "work", spec)
        times: dict[str, list[float]] = {"none": [], "warm": []}
        for i in range(rounds):
            times["none"].append(time_to_running(supervisor, running, f"none-{i}", root / "work", EnvironmentSpec()))
            times["warm"].append(time_to_running(supervisor, running, f"warm-{i}", root / "work", spec))
        supervisor.launcher.close()
        reads = read_times(root / "work", rounds)
    medians = {k: statistics.median(v) * 1000 for k, v in times.items()}
    result = {"first_build_ms": build * 1000, "median_ms": medians, "added_ms": medians["warm"] - medians["none"],
              "read_ms": reads, "rounds": rounds}
    print(f"{'launch -> RUNNING':<28}{'median ms':>12}")
    print(f"{'no environment':<28}{medians['none']:>12.1f}")
    print(f"{'warm environment':<28}{medians['warm']:>12.1f}")
    print(f"{'added (target < 50)':<28}{result['added_ms']:>12.1f}")
    print(f"{'first build (uv, 1 wheel)':<28}{build * 1000:>12.1f}")
    for how, ms in reads.items():
        print(f"{'read ' + how:<28}{ms:>12.1f}")
    Path(__file__).with_name("environments.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
