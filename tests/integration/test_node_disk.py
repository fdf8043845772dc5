"""A node's disk never fills, with a real coordinator and agent: the coordinator tells the agent which jobs are
over and the agent's retention pass removes their files (never a running job's); below its disk floor a node
takes no new tasks and `tfcluster status` says why; a long log keeps its start and its end; `tfcluster gc`
lists and removes what retention allows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import grpc
import pytest

from harness import wait_until
from tfcluster import layout, pki
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc

PY = sys.executable
MARKER = re.compile(r"\[tfcluster: (\d+) bytes of output dropped here\]\n")


def start(cluster, *args) -> str:
    return cluster.cli("start", *args, check=True).stdout.strip()


def running(cluster, job_id: str) -> dict:
    return wait_until(lambda: (lambda j: j if j["state"] == "RUNNING" else None)(cluster.job(job_id)), 30,
                      what=f"{job_id} RUNNING")


def ended_jobs(cluster, role: str, job_ids: list[str]) -> list[str]:
    with cluster.channel(role, "a") as channel:
        reply = agent_pb2_grpc.AgentServiceStub(channel).EndedJobs(agent_pb2.EndedJobsRequest(job_ids=job_ids),
                                                                   timeout=10)
    return sorted(reply.ended_job_ids)


def test_the_agent_removes_an_ended_jobs_files_and_never_a_running_ones(make_cluster):
    cluster = make_cluster()
    cluster.start_agent("a", extra=["--retain-for", "0s"])
    done = start(cluster, "--name", "done", "--strategy", "mirrored", "--", PY, "-c", "print('finished')")
    assert cluster.wait_job(done)["state"] == "SUCCEEDED"
    busy = start(cluster, "--name", "busy", "--strategy", "mirrored", "--", "sleep", "300")
    running(cluster, busy)
    jobs = layout.jobs_dir(cluster.agent_state_dir("a"))
    assert (jobs / done).is_dir() and (jobs / busy).is_dir()
    # The coordinator answers a node: over are the ended job and one it made and since removed; not the running
    # one, nor one it never made (another cluster's, or from before its state was restored from a backup).
    tag = done.rsplit("-", 1)[1]
    removed, foreign = f"old-1-{tag}", f"future-99-{tag}"
    assert ended_jobs(cluster, pki.NODE, [done, busy, removed, foreign, "forgotten-7"]) == sorted([done, removed])
    with pytest.raises(grpc.RpcError) as refused:
        ended_jobs(cluster, pki.VIEWER, [done])
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # An agent's pass runs at its start: restarted, it asks, marks the ended job, and removes its files.
    cluster.agents["a"].kill()
    cluster.start_agent("a", extra=["--retain-for", "0s"])
    wait_until(lambda: not (jobs / done).exists(), 30, what=f"{done}'s files to be removed")
    # The pass logs what it removed once all of it is gone, a moment after the directory went.
    wait_until(lambda: f"retention: removed {jobs / done}" in cluster.agents["a"].log(), 10,
               what="the removal in the agent's log")
    assert (jobs / busy).is_dir() and not (jobs / busy / layout.ENDED_MARKER).exists()
    assert cluster.job(busy)["state"] == "RUNNING"
    cluster.cli("stop", busy, "--now", check=True)


def test_below_its_disk_floor_a_node_takes_no_new_tasks_and_status_says_why(make_cluster):
    cluster = make_cluster()
    cluster.start_agent("a", extra=["--min-free-disk", "1000T"])
    state = cluster.agent_state_dir("a")
    why = f"free disk under {state} is "
    floor = "below the floor of 1000 TiB (--min-free-disk)"
    node = wait_until(lambda: (lambda n: n if n["condition"] else None)(cluster.status()["nodes"][0]), 20,
                      what="the node's condition")
    assert node["state"] == "READY" and node["condition"].startswith(why) and node["condition"].endswith(floor)
    job_id = start(cluster, "--name", "waits", "--strategy", "mirrored", "--", "true")
    time.sleep(1.0)  # a few scheduling rounds
    job = cluster.job(job_id)
    assert job["state"] == "PENDING" and "a takes no new tasks: " + why in job["message"], job
    assert not (layout.jobs_dir(state) / job_id).exists()
    table = cluster.cli("status", check=True).stdout
    assert "a takes no new tasks: free disk under" in table


def test_a_long_log_keeps_its_start_and_its_end_with_one_marker_between(make_cluster):
    cluster = make_cluster()
    cluster.start_agent("a", extra=["--max-task-log", "64K"])
    script = "for i in range(30000): print(f'line {i}')\nprint('done', end='')"
    job_id = start(cluster, "--name", "chatty", "--strategy", "mirrored", "--", PY, "-c", script)
    assert cluster.wait_job(job_id)["state"] == "SUCCEEDED"
    full = "".join(f"line {i}\n" for i in range(30000)) + "done"
    shown = cluster.cli("logs", job_id, "worker:0", check=True).stdout
    head, dropped, tail = MARKER.split(shown)
    assert full.startswith(head) and head.endswith("\n") and full.endswith(tail)
    assert len(head) + int(dropped) + len(tail) == len(full) and int(dropped) > len(full) // 2
    assert cluster.cli("logs", job_id, "worker:0", "--tail", "2", check=True).stdout == "line 29999\ndone"


def attempt(state, job: str, number: int, days: float) -> str:
    directory = layout.attempt_dir(state, job, "worker", 0, number)
    directory.mkdir(parents=True)
    (directory / layout.STATUS_FILE).write_text(json.dumps({"phase": "EXITED", "exit_code": 0}))
    (directory / layout.OUTPUT_FILE).write_bytes(b"x" * 300_000)
    when = time.time() - days * 86400
    for name in os.listdir(directory):
        os.utime(directory / name, (when, when))
    return str(directory)


def gc(state, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "tfcluster.cli", "gc", "--state-dir", str(state), *args], capture_output=True,
                          text=True, timeout=60)


def test_gc_dry_run_lists_what_would_go_and_gc_removes_it(tmp_path):
    state = tmp_path / "agent"
    attempt(state, "old-1", 1, days=10)
    attempt(state, "young-2", 1, days=1)
    older = attempt(state, "open-3", 1, days=10)
    newest = attempt(state, "open-3", 2, days=9)
    for job in ("old-1", "young-2"):
        (layout.job_dir(state, job) / layout.ENDED_MARKER).write_text("{}")
    listed = gc(state, "--dry-run", "--retain-for", "7d")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 3, listed.stdout
    assert lines[0].split() == ["293", "KiB", str(layout.job_dir(state, "old-1")), "(ended", "job,", "last",
                                "written", "10d", "ago:", "past", "--retain-for", "7d)"]
    assert f"293 KiB  {older}  (older attempt 1 of worker-0 (attempt 2 is kept), last written 10d ago: past " \
           f"--retain-for 7d)" in lines[1]
    assert lines[2] == "would remove 2 items, 586 KiB (dry run: nothing removed)"
    assert layout.job_dir(state, "old-1").exists() and os.path.isdir(older)
    removed = gc(state, "--retain-for", "7d")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.splitlines()[-1] == "removed 2 items, 586 KiB freed"
    assert not layout.job_dir(state, "old-1").exists() and not os.path.exists(older)
    assert os.path.isdir(newest) and layout.job_dir(state, "young-2").exists()
    bad = gc(state, "--retain-for", "soon")
    assert bad.returncode == 2 and bad.stderr.strip() == \
        "error: --retain-for: expected a duration such as 90s, 30m, 12h or 7d, got 'soon'"
