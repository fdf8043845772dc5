"""Retention on a node: which files go and why, from a state dir built here with aged files (os.utime).

Ended jobs go whole after --retain-for, or oldest first under byte pressure; a job with a running task keeps
everything; a job not known to be over keeps the newest attempt of each task and its newest checkpoint."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from harness import old_style_shim
from tfcluster import layout
from tfcluster.commands import Launch
from tfcluster.daemon.agent.node.retention import (Policy, RetentionPass, disk_condition, mark_ended, plan, remove,
                                              scan)
from tfcluster.daemon.agent.tasks.supervisor import Supervisor
from tfcluster.model import Attempt, Phase

NOW = time.time()
DAY = 86400.0
PLENTY = 1 << 50
KEEP_ALL = Policy(retain_for=365 * DAY, retain_bytes=PLENTY, min_free_bytes=0)


def age(path: Path, days: float) -> None:
    when = NOW - days * DAY
    for root, _, files in os.walk(path):
        for name in files:
            os.utime(os.path.join(root, name), (when, when))


def attempt(state: Path, job: str, task: str = "worker-0", number: int = 1, size: int = 10_000,
            days: float = 0.0, status: dict | None = None) -> Path:
    task_type, index = task.rsplit("-", 1)
    directory = layout.attempt_dir(state, job, task_type, int(index), number)
    directory.mkdir(parents=True)
    (directory / layout.LAUNCH_FILE).write_text("{}")
    (directory / layout.STATUS_FILE).write_text(json.dumps(status or {"phase": Phase.EXITED, "exit_code": 0}))
    (directory / layout.OUTPUT_FILE).write_bytes(b"x" * size)
    age(directory, days)
    return directory


def checkpoint(state: Path, job: str, step: int, days: float, committed: bool = True) -> Path:
    directory = Path(layout.host_checkpoint_dir(str(state), job))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"ckpt-{step}.index").write_bytes(b"i" * 100)
    (directory / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"d" * 5000)
    when = NOW - days * DAY
    for name in (f"ckpt-{step}.index", f"ckpt-{step}.data-00000-of-00001"):
        os.utime(directory / name, (when, when))
    if committed:
        (directory / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{step}"\n')
        os.utime(directory / "checkpoint", (when, when))
    return directory


def job_dir(state: Path, job: str) -> Path:
    return layout.job_dir(state, job)


def shown(removals) -> list[str]:
    return [r.shown for r in removals]


def test_ended_jobs_go_past_retain_for_and_younger_ones_stay(tmp_path):
    attempt(tmp_path, "old-1", days=8)
    attempt(tmp_path, "young-2", days=1)
    attempt(tmp_path, "open-3", days=30)  # not known to be over: its only attempt is its newest
    for job in ("old-1", "young-2"):
        mark_ended(tmp_path, job, NOW)
    policy = Policy(retain_for=7 * DAY, retain_bytes=PLENTY, min_free_bytes=0)
    removals = plan(scan(tmp_path, now=NOW), policy, NOW, PLENTY)
    assert shown(removals) == [str(job_dir(tmp_path, "old-1"))]
    assert removals[0].reason == "ended job, last written 8d ago: past --retain-for 7d"
    assert removals[0].size == sum(f.stat().st_size for f in job_dir(tmp_path, "old-1").rglob("*") if f.is_file())
    freed, errors = remove(removals)
    assert (freed, errors) == (removals[0].size, [])
    assert not job_dir(tmp_path, "old-1").exists()
    assert job_dir(tmp_path, "young-2").exists() and job_dir(tmp_path, "open-3").exists()


def test_byte_pressure_takes_the_oldest_ended_jobs_first(tmp_path):
    for job, days in (("c-3", 1), ("a-1", 3), ("b-2", 2)):
        attempt(tmp_path, job, days=days)
        mark_ended(tmp_path, job, NOW)
    attempt(tmp_path, "open-4", number=1, days=5)
    attempt(tmp_path, "open-4", number=2, days=4)
    jobs = scan(tmp_path, now=NOW)
    total = sum(j.size for j in jobs)
    one_job = next(j.size for j in jobs if j.id == "a-1")
    # Room for all but two ended jobs: the two oldest go, nothing of the job that may restart.
    policy = Policy(retain_for=30 * DAY, retain_bytes=total - one_job - 1, min_free_bytes=0)
    removals = plan(jobs, policy, NOW, PLENTY)
    assert shown(removals) == [str(job_dir(tmp_path, "a-1")), str(job_dir(tmp_path, "b-2"))]
    assert "ended job, last written 3d ago: over --retain-bytes" in removals[0].reason
    # With no room at all, every ended job goes first, then the older attempt of the other job; its newest stays.
    removals = plan(jobs, Policy(retain_for=30 * DAY, retain_bytes=1, min_free_bytes=0), NOW, PLENTY)
    older = layout.attempt_dir(tmp_path, "open-4", "worker", 0, 1)
    assert shown(removals) == [str(job_dir(tmp_path, j)) for j in ("a-1", "b-2", "c-3")] + [str(older)]
    assert removals[-1].reason.startswith("older attempt 1 of worker-0 (attempt 2 is kept), last written 5d ago")


def test_low_free_disk_counts_as_byte_pressure(tmp_path):
    attempt(tmp_path, "done-1", days=1)
    mark_ended(tmp_path, "done-1", NOW)
    policy = Policy(retain_for=7 * DAY, retain_bytes=PLENTY, min_free_bytes=1 << 30)
    assert plan(scan(tmp_path, now=NOW), policy, NOW, 2 << 30) == []
    removals = plan(scan(tmp_path, now=NOW), policy, NOW, 500 << 20)
    assert shown(removals) == [str(job_dir(tmp_path, "done-1"))]
    assert removals[0].reason.endswith("free disk 500 MiB is below --min-free-disk 1 GiB")


def test_a_job_running_here_keeps_everything(tmp_path):
    attempt(tmp_path, "live-1", number=1, days=60)
    attempt(tmp_path, "live-1", number=2, days=60)
    checkpoint(tmp_path, "live-1", 1, days=60)
    checkpoint(tmp_path, "live-1", 2, days=60)
    mark_ended(tmp_path, "live-1", NOW)  # even when the coordinator says it is over: a task still runs here
    greedy = Policy(retain_for=0, retain_bytes=1, min_free_bytes=PLENTY)
    assert plan(scan(tmp_path, {"live-1"}, now=NOW), greedy, NOW, 0) == []


def test_a_job_not_known_to_be_over_keeps_its_newest_attempt_and_checkpoint(tmp_path):
    attempt(tmp_path, "open-1", "worker-0", 1, days=20)
    attempt(tmp_path, "open-1", "worker-0", 2, days=10)
    attempt(tmp_path, "open-1", "ps-0", 1, days=20)
    for step, days in ((1, 20), (2, 15), (3, 10)):
        directory = checkpoint(tmp_path, "open-1", step, days)
    policy = Policy(retain_for=7 * DAY, retain_bytes=PLENTY, min_free_bytes=0)
    removals = plan(scan(tmp_path, now=NOW), policy, NOW, PLENTY)
    assert sorted(shown(removals)) == sorted([str(layout.attempt_dir(tmp_path, "open-1", "worker", 0, 1)),
                                              f"{directory}/ckpt-1.*", f"{directory}/ckpt-2.*"])
    assert any(r.reason.startswith("older checkpoint ckpt-1 (ckpt-3 kept), last written 20d ago") for r in removals)
    # Under any pressure the same, never more: the newest of each task and the newest checkpoint stay.
    greedy = plan(scan(tmp_path, now=NOW), Policy(retain_for=365 * DAY, retain_bytes=1, min_free_bytes=0), NOW,
                  PLENTY)
    assert sorted(shown(greedy)) == sorted(shown(removals))
    remove(greedy)
    assert sorted(os.listdir(directory)) == ["checkpoint", "ckpt-3.data-00000-of-00001", "ckpt-3.index"]
    assert layout.attempt_dir(tmp_path, "open-1", "worker", 0, 2).is_dir()
    assert layout.attempt_dir(tmp_path, "open-1", "ps", 0, 1).is_dir()


def test_a_checkpoint_newer_than_the_committed_one_is_kept_too(tmp_path):
    checkpoint(tmp_path, "open-1", 1, days=30)
    checkpoint(tmp_path, "open-1", 2, days=20)
    directory = checkpoint(tmp_path, "open-1", 3, days=10, committed=False)  # written, its state not yet
    removals = plan(scan(tmp_path, now=NOW), Policy(retain_for=DAY, retain_bytes=1, min_free_bytes=0), NOW, PLENTY)
    assert shown(removals) == [f"{directory}/ckpt-1.*"]


def test_gc_beside_a_running_agent_leaves_a_job_whose_shim_is_alive(tmp_path):
    directory = attempt(tmp_path, "busy-1", days=30)
    mark_ended(tmp_path, "busy-1", NOW)
    shim = old_style_shim(directory, 60)  # its status file says nothing of when it started
    try:
        (directory / layout.STATUS_FILE).write_text(json.dumps({"phase": Phase.RUNNING, "shim_pid": shim.pid}))
        age(directory, 30)
        assert plan(scan(tmp_path, now=NOW), KEEP_ALL, NOW, 0) == []
        assert plan(scan(tmp_path, now=NOW), Policy(0, 1, 0), NOW, 0) == []
    finally:
        shim.kill()
        shim.wait()
    # Its shim gone (killed without writing an exit), the job is not running any more.
    assert shown(plan(scan(tmp_path, now=NOW), Policy(0, 1, 0), NOW, 0)) == [str(job_dir(tmp_path, "busy-1"))]


def test_a_pass_marks_what_the_coordinator_says_is_over_and_heals_when_it_cannot_be_asked(tmp_path):
    attempt(tmp_path, "over-1", days=1)
    attempt(tmp_path, "open-2", days=1)
    attempt(tmp_path, "live-3", days=1)
    asked: list[list[str]] = []
    answer: set[str] = set()

    def ask(job_ids: list[str]) -> set[str]:
        asked.append(sorted(job_ids))
        return answer & set(job_ids)

    retention = RetentionPass(tmp_path, Policy(retain_for=2 * DAY, retain_bytes=PLENTY, min_free_bytes=0),
                              lambda: {"live-3"}, ask)
    assert retention.once(NOW) == []  # the coordinator could not be asked: nothing counts as over
    assert asked == [["open-2", "over-1"]]  # never about a job running here
    answer = {"over-1"}
    assert retention.once(NOW) == []  # over, but written a day ago only: kept for --retain-for
    assert (job_dir(tmp_path, "over-1") / layout.ENDED_MARKER).exists()
    assert not (job_dir(tmp_path, "open-2") / layout.ENDED_MARKER).exists()
    removals = retention.once(NOW + 2 * DAY)
    assert shown(removals) == [str(job_dir(tmp_path, "over-1"))]
    assert asked[-1] == ["open-2"]  # a job already known to be over is not asked about again
    assert not job_dir(tmp_path, "over-1").exists() and job_dir(tmp_path, "open-2").exists()


def test_below_the_disk_floor_a_launch_fails_to_start_with_the_reason(tmp_path):
    condition = disk_condition(tmp_path, 400 << 20, 1 << 30)
    assert condition == f"free disk under {tmp_path} is 400 MiB, below the floor of 1 GiB (--min-free-disk)"
    assert disk_condition(tmp_path, 2 << 30, 1 << 30) == ""
    reports = []
    supervisor = Supervisor(tmp_path, reports.append, launch_refusal=lambda: condition)
    attempt_ = Attempt("full-1", "worker", 0, 1)
    supervisor.launch(Launch("n", attempt_, ("sleep", "60"), {}, "", 0, 1.0))
    report = reports[-1].report()
    assert report.phase == Phase.FAILED_TO_START and report.exit.message == condition
    assert not layout.job_dir(tmp_path, "full-1").exists()


def test_what_a_job_marked_over_takes_is_measured_once_until_its_folder_changes(tmp_path, monkeypatch):
    """A node keeps days of ended jobs: walking every file of each at every pass took seconds. Their sizes still
    count, and a job that is not over is measured at every pass."""
    from tfcluster.daemon.agent.node import retention
    attempt(tmp_path, "over-1", size=1000, days=3)
    attempt(tmp_path, "over-2", size=2000, days=2)
    attempt(tmp_path, "live-3", size=3000, days=1)
    for job in ("over-1", "over-2"):
        mark_ended(tmp_path, job, NOW)
    walked = []
    real_measure = retention.measure
    monkeypatch.setattr(retention, "measure", lambda directory, timeless=None: walked.append(Path(directory).name)
                        or real_measure(directory, timeless))
    measured: dict = {}
    first = {j.id: (j.size, j.written, j.ended) for j in scan(tmp_path, now=NOW, measured=measured)}
    assert sorted(walked) == ["live-3", "over-1", "over-2"]
    walked.clear()
    assert {j.id: (j.size, j.written, j.ended) for j in scan(tmp_path, now=NOW, measured=measured)} == first
    assert walked == ["live-3"]
    assert first["over-1"][0] > 1000 and first["over-2"][0] > 2000 and first["over-1"][1] < first["over-2"][1]
    (job_dir(tmp_path, "over-2") / "left.bin").write_bytes(b"x" * 500)  # its folder changed: measured again
    walked.clear()
    again = {j.id: j.size for j in scan(tmp_path, now=NOW, measured=measured)}
    assert sorted(walked) == ["live-3", "over-2"] and again["over-2"] == first["over-2"][0] + 500
