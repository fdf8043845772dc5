"""Tasks are never root: a job's tasks run under a UID of its own, and from there reach nothing of the node, of
the cluster's CA or of other jobs, only their own files. Real agents and real tasks; as an attacker would try.

Switching users needs root: as another user these tests are skipped.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from harness import running_cluster, wait_until
from tfcluster import layout, pki
from tfcluster.commands import Launch
from tfcluster.daemon.agent.tasks.supervisor import Supervisor
from tfcluster.daemon.agent.tasks.users import TaskUsers, make_state_dir
from tfcluster.model import Attempt

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tasks switch to their job's UID only under a root agent")

PY = sys.executable
# With --private-tmp a task writes /tmp/backup as TensorFlow's tutorials do, without meeting another job's; it also
# hides the host's /tmp, so it is tried only where this interpreter and checkout do not live there.
PRIVATE_TMP = not any(Path(path).resolve().is_relative_to("/tmp")
                      for path in (sys.executable, Path(__file__).resolve().parents[2]))
TMP_TARGET = "/tmp/backup" if PRIVATE_TMP else "$TMPDIR/backup"

# Tries every target: "read" ones must be refused, "write" and "readable" ones must work. Prints one JSON line.
PROBE = textwrap.dedent("""
    import json, os, sys
    targets = json.loads(open(sys.argv[1]).read())
    found = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "home": os.environ["HOME"]}
    for name, path in targets["read"].items():
        try:
            open(path, "rb").read(1)
            found[name] = "read"
        except OSError as e:
            found[name] = type(e).__name__
    checkpoint = os.path.join(os.environ["TFCLUSTER_CHECKPOINT_DIR"], "probe")
    own = (("checkpoint_dir", checkpoint, "w"), ("events_file", os.environ["TFCLUSTER_EVENTS_FILE"], "a"),
           ("tmp", os.path.expandvars(sys.argv[2]), "w"))
    for name, path, mode in own:
        try:
            with open(path, mode) as f:
                f.write("")
            found[name] = "ok"
        except OSError as e:
            found[name] = type(e).__name__
    # Written when training has finished (for an evaluator): until then there is none, which says training runs.
    found["control_file"] = os.path.exists(os.environ["TFCLUSTER_CONTROL_FILE"])
    print(json.dumps(found), flush=True)
""")


def start(cluster, *args: str) -> str:
    return cluster.cli("start", *args, check=True).stdout.strip()


def probe_result(cluster, job_id: str, task: str) -> dict:
    return json.loads(cluster.cli("logs", job_id, task, check=True).stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    private = {"extra": ["--private-tmp"]} if PRIVATE_TMP else {}
    with running_cluster(tmp_path_factory.mktemp("users"), {"a": {"gpus": 1, **private},
                                                            "b": {"gpus": 1, **private}}) as cluster:
        yield cluster


def test_a_task_reaches_nothing_but_its_own_jobs_files(cluster, tmp_path):
    victim = start(cluster, "--name", "victim", "--strategy", "mirrored", "--env", "SECRET=hunter2", "--",
                   "sleep", "300")
    wait_until(lambda: cluster.job(victim)["state"] == "RUNNING", 30, what="the victim job to run")
    task = cluster.job(victim)["tasks"][0]
    victim_attempt = layout.attempt_dir(cluster.agent_state_dir(task["node"]), victim, "worker", 0, task["attempt"])
    targets = {"read": {
        "node_key_a": str(cluster.agent_state_dir("a") / "tls" / pki.NODE_KEY),
        "node_key_b": str(cluster.agent_state_dir("b") / "tls" / pki.NODE_KEY),
        "ca_key": str(cluster.ca_dir / pki.CA_KEY),
        "other_launch": str(victim_attempt / layout.LAUNCH_FILE),
        "other_output": str(victim_attempt / layout.OUTPUT_FILE),
        "other_environ": f"/proc/{task['pid']}/environ",
        "agent_environ": f"/proc/{cluster.agents['a'].proc.pid}/environ",
    }}
    (tmp_path / "targets.json").write_text(json.dumps(targets))
    (tmp_path / "probe.py").write_text(PROBE)
    probe = start(cluster, "--name", "probe", "--strategy", "multi_worker_mirrored", "--workers", "2",
                  "--gpus-per-task", "1", "--wait", "--", PY, str(tmp_path / "probe.py"),
                  str(tmp_path / "targets.json"), TMP_TARGET)
    job = cluster.job(probe)
    assert job["state"] == "SUCCEEDED", job
    assert {t["node"] for t in job["tasks"]} == {"a", "b"}
    results = [probe_result(cluster, probe, f"worker:{i}") for i in (0, 1)]
    for found in results:
        assert {name: found[name] for name in targets["read"]} == {name: "PermissionError" for name in targets["read"]}
        assert (found["checkpoint_dir"], found["events_file"], found["tmp"]) == ("ok",) * 3
        assert found["control_file"] is False
        assert found["groups"] == [] and found["uid"] == found["gid"] == job["uid"] != 0
    assert results[0]["home"] != results[1]["home"], "each node keeps the job's home in its own state dir"
    victim_uid = cluster.job(victim)["uid"]
    assert victim_uid not in (0, job["uid"])
    # The victim's secret stayed where it was, and the cluster goes on: the victim still runs, a job still runs.
    assert cluster.job(victim)["state"] == "RUNNING"
    cluster.cli("stop", victim, check=True)
    after = start(cluster, "--name", "after", "--strategy", "mirrored", "--wait", "--", "id", "-u")
    assert cluster.job(after)["state"] == "SUCCEEDED"
    assert cluster.cli("logs", after, "worker:0", check=True).stdout.strip() == str(cluster.job(after)["uid"])


def owner_and_mode(path: Path) -> tuple[int, int, str]:
    found = path.stat()
    return found.st_uid, found.st_gid, oct(stat.S_IMODE(found.st_mode))


def test_a_nodes_files_are_the_jobs_own_or_root_s(cluster):
    job_id = start(cluster, "--name", "modes", "--strategy", "mirrored", "--wait", "--", "true")
    job = cluster.job(job_id)
    uid, task = job["uid"], job["tasks"][0]
    state = cluster.agent_state_dir(task["node"])
    job_dir = layout.job_dir(state, job_id)
    attempt = layout.attempt_dir(state, job_id, "worker", 0, task["attempt"])
    assert {str(path.relative_to(state)): owner_and_mode(path) for path in (
        state, state / "jobs", state / "tls", state / "tls" / pki.NODE_KEY, job_dir, job_dir / "checkpoints",
        job_dir / "home", job_dir / "tmp", job_dir / "tasks", attempt, attempt / layout.LAUNCH_FILE,
        attempt / layout.STATUS_FILE, attempt / layout.OUTPUT_FILE, attempt / layout.EVENTS_NAME)} == {
        str(path.relative_to(state)): expected for path, expected in (
            (state, (0, 0, "0o711")), (state / "jobs", (0, 0, "0o711")), (state / "tls", (0, 0, "0o700")),
            (state / "tls" / pki.NODE_KEY, (0, 0, "0o600")), (job_dir, (0, uid, "0o750")),
            (job_dir / "checkpoints", (uid, uid, "0o700")), (job_dir / "home", (uid, uid, "0o700")),
            (job_dir / "tmp", (uid, uid, "0o700")), (job_dir / "tasks", (0, uid, "0o750")),
            (attempt, (0, uid, "0o750")), (attempt / layout.LAUNCH_FILE, (0, 0, "0o600")),
            (attempt / layout.STATUS_FILE, (0, 0, "0o600")), (attempt / layout.OUTPUT_FILE, (0, uid, "0o640")),
            (attempt / layout.EVENTS_NAME, (uid, uid, "0o600")))}
    assert not (attempt / layout.CONTROL_NAME).exists(), "written when training has finished, for an evaluator"


def test_a_job_has_one_uid_on_every_node_and_another_job_another(cluster):
    first = start(cluster, "--name", "idu", "--strategy", "multi_worker_mirrored", "--workers", "2",
                  "--gpus-per-task", "1", "--wait", "--", "id", "-u")
    second = start(cluster, "--name", "idu", "--strategy", "mirrored", "--wait", "--", "id", "-u")
    uids = [cluster.cli("logs", first, f"worker:{i}", check=True).stdout.strip() for i in (0, 1)]
    assert {t["node"] for t in cluster.job(first)["tasks"]} == {"a", "b"}
    assert uids[0] == uids[1] == str(cluster.job(first)["uid"])
    assert cluster.cli("logs", second, "worker:0", check=True).stdout.strip() == str(cluster.job(second)["uid"])
    assert uids[0] != str(cluster.job(second)["uid"])


def test_allow_root_tasks_runs_tasks_as_root_and_says_so(make_cluster):
    cluster = make_cluster(tls=False)
    cluster.start_agent("r", extra=["--allow-root-tasks"])
    job_id = start(cluster, "--name", "root", "--strategy", "mirrored", "--wait", "--", "id", "-u")
    assert cluster.cli("logs", job_id, "worker:0", check=True).stdout == "0\n"
    assert "--allow-root-tasks: EVERY TASK ON THIS NODE RUNS AS ROOT" in cluster.agents["r"].log()


def launch_as(tmp_path: Path, users: TaskUsers, uid: int) -> list:
    """One task launched by a real supervisor (and its shim) as a coordinator of this release (uid) or an older
    one (0) would; the reports it makes until the task ends."""
    reports = []
    make_state_dir(tmp_path)  # as the agent does at its start
    supervisor = Supervisor(tmp_path, reports.append, task_users=users)
    attempt = Attempt("j-1", "worker", 0, 1)
    supervisor.launch(Launch("n", attempt, (PY, "-c", "import os; print(os.getuid())"), {}, "", 0, 1.0,
                             uid=uid, gid=uid))
    wait_until(lambda: supervisor.current(attempt).exited.is_set(), 30, what="the task to end")
    return reports


def test_a_launch_without_a_uid_fails_to_start_unless_root_tasks_are_allowed(tmp_path):
    refused = launch_as(tmp_path / "strict", TaskUsers(), 0)[-1]
    assert refused.phase == "FAILED_TO_START"
    assert refused.exit.message == ("the coordinator gave this task no user to run as (uid 0): it is older than "
                                    "this agent; upgrade the coordinator, or run this agent with --allow-root-tasks "
                                    "to run tasks as root")
    allowed = launch_as(tmp_path / "allowed", TaskUsers(allow_root=True), 0)[-1]
    assert allowed.phase == "EXITED" and allowed.exit.exit_code == 0 and allowed.exit.log_tail == ("0",)
