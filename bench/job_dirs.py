"""What making a job's dirs and files on a node costs right after earlier jobs' were removed (a benchmark, not a
test): the agent's own code (`make_state_dir`, `prepare_job`, `prepare_summary_dir`, `prepare_attempt`) makes
one task's dirs per job, and the files an attempt gets, in a state dir whose jobs dir is marked as the top of a
hierarchy (`chattr +T`, as the agent marks it), against a jobs dir left unmarked (the floor: what the agent did
before). Each round first removes the round before's jobs, as a retention pass or `tfcluster gc` does; the
figure is the kernel CPU per job (what creating inodes costs), median of the rounds, and the ratio.

Where the state dir's filesystem has no such mark (tmpfs, XFS, btrfs) the two are the same code and the figure
says so. On ext4 without a journal the kernel passes over every inode freed in the last minutes at each create
(docs/benchmarks.md, "Tiny jobs and the filesystem").

Usage: python bench/job_dirs.py [--jobs N] [--rounds N] [--state-dir DIR]   (default /var/tmp, the root filesystem)
Prints a table and writes bench/job_dirs.json.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from report import filesystem_of, show_and_save  # noqa: E402

from tfcluster import layout  # noqa: E402
from tfcluster.daemon.agent.shim.taskfiles import write_json_atomic  # noqa: E402
from tfcluster.daemon.agent.tasks import users  # noqa: E402

ATTEMPT_FILES = (layout.LAUNCH_FILE, layout.EVENTS_NAME, layout.SHIM_LOG_FILE, layout.OUTPUT_FILE)


def one_job(state: Path, job_id: str, user: users.TaskUser) -> None:
    """A job's first task on this node, as the agent and its shim make them: the job's dirs (its own, home, tmp,
    checkpoints), the task's summary dir, the attempt's dirs, its files, and the status written twice."""
    users.prepare_job(state, job_id, user)
    users.prepare_summary_dir(Path(layout.task_summary_dir(state, job_id, "worker", 0)), user)
    attempt = layout.attempt_dir(state, job_id, "worker", 0, 1)
    users.prepare_attempt(attempt, user)
    for name in ATTEMPT_FILES:
        users.create_file(attempt / name, 0o600)
    for phase in ("RUNNING", "EXITED"):
        write_json_atomic(attempt / layout.STATUS_FILE, {"phase": phase})


def one_round(state: Path, jobs: int, user: users.TaskUser, round_number: int) -> float:
    """Removes the earlier round's jobs, then makes this round's: µs of kernel CPU per job."""
    for job in os.scandir(layout.jobs_dir(state)):
        shutil.rmtree(job.path)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    for number in range(jobs):
        one_job(state, f"job-{round_number}-{number}", user)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_stime - before) / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--state-dir", type=Path, default=Path("/var/tmp"))
    options = parser.parse_args()
    user = users.TaskUser(os.getuid(), os.getgid())
    results: dict = {"jobs": f"{options.rounds} rounds of {options.jobs} jobs, each after removing the round before's"}
    figures: dict[str, list[float]] = {"marked": [], "unmarked": []}
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-dirs-", dir=options.state_dir) as tmp:
        marked, unmarked = Path(tmp) / "marked", Path(tmp) / "unmarked"
        for state in (marked, unmarked):
            users.make_dir(state, users.STATE_DIR_MODE)
            users.make_dir(layout.jobs_dir(state), users.STATE_DIR_MODE)
        has_mark = users.spread_subdirs(layout.jobs_dir(marked))  # as make_state_dir marks an agent's
        for number in range(options.rounds + 1):  # alternated; the first round of each only fills what the next removes
            for name, state in (("unmarked", unmarked), ("marked", marked)):
                cost = one_round(state, options.jobs, user, number)
                if number:
                    figures[name].append(cost)
    results["state_dir_filesystem"] = f"{filesystem_of(options.state_dir)} ({options.state_dir}); " + (
        "the jobs dir takes the mark" if has_mark else "no top-of-hierarchy mark here: both are the same")
    for name, costs in figures.items():
        results[f"{name}_kernel_us_per_job"] = f"{statistics.median(costs):.0f} µs (rounds " + ", ".join(
            f"{c:.0f}" for c in costs) + ")"
    results["marked_vs_unmarked"] = round(statistics.median(figures["marked"]) / statistics.median(figures["unmarked"]), 2)
    show_and_save(results, "job_dirs.json")


if __name__ == "__main__":
    main()
