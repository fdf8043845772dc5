"""Operators upgrade one node at a time: an agent of the previous release (0.1, taken from this repository's
history) registers and heartbeats against this coordinator but gets no new tasks (it would run them as root),
and a live cluster of the previous release is upgraded in place (coordinator first, then the agent) without
losing its running job: the old agent keeps its task meanwhile. 0.1 spoke plain text: this release talks to it
with --insecure."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import time
import venv

import pytest

import tfcluster
from harness import ROOT, LocalCluster, wait_until

PREVIOUS_RELEASE = "2e31f90e6cf005ddd376d61e7657c25db10f7406"  # tfcluster 0.1
RELEASE_0_7 = "a1c39a88bc13ea8c75b40f9b9785f73afe2bca90"  # tfcluster 0.7.2, the last before the daemons' relayout
PY = sys.executable


def python_of(release: str, module: str, tmp_path_factory) -> str:
    """An interpreter that imports tfcluster of `release` (from this repository's history), and nothing of this
    version, with the same dependencies; `module` is one of that release's, imported to check."""
    if shutil.which("git") is None:
        pytest.skip("needs git to take the previous release from the repository's history")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", release, "tfcluster"],
                             capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"the release {release[:8]} is not in this clone's history ({archive.stderr.decode().strip()})")
    root = tmp_path_factory.mktemp("previous")
    (root / "src").mkdir()
    # This repository's own history, unpacked by tar(1): tarfile's extraction filters are missing from some of the
    # Pythons tfcluster supports (Debian 12's 3.11.2).
    subprocess.run(["tar", "-x", "-C", str(root / "src")], input=archive.stdout, check=True)
    env = root / "venv"
    venv.create(env, with_pip=False)
    packages = next(env.glob("lib/python*/site-packages"))
    # Its own code first, then this environment's dependencies (a plain path: this version's editable install
    # is a .pth hook there, which a plain path entry does not run).
    (packages / "previous.pth").write_text(f"{root / 'src'}\n{site.getsitepackages()[0]}\n")
    python = str(env / "bin" / "python")
    own_path = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as the harness starts it
    check = subprocess.run([python, "-c", f"import {module} as m, grpc; print(m.__file__)"],
                           capture_output=True, text=True, cwd=root, env=own_path)
    assert check.returncode == 0 and str(root / "src") in check.stdout, check.stderr
    return python


@pytest.fixture(scope="module")
def previous_python(tmp_path_factory) -> str:
    """tfcluster 0.1's."""
    return python_of(PREVIOUS_RELEASE, "tfcluster.daemon.coordinator.jobs", tmp_path_factory)


@pytest.fixture(scope="module")
def python_0_7(tmp_path_factory) -> str:
    """tfcluster 0.7.2's: its coordinator and agent had one flat folder each."""
    if sys.version_info < (3, 11):
        pytest.skip("tfcluster 0.7.2 needs Python 3.11 (enum.StrEnum)")
    return python_of(RELEASE_0_7, "tfcluster.daemon.agent.taskrunner", tmp_path_factory)


def test_an_agent_of_the_previous_release_registers_here_but_gets_no_new_tasks(make_cluster, previous_python):
    # It would run them as root (it knows nothing of the job's UID): its node says so, and waits for its upgrade.
    cluster = make_cluster(tls=False)
    cluster.start_agent("old", gpus=1, python=previous_python)
    node = next(n for n in cluster.status()["nodes"] if n["name"] == "old")
    assert node["agent_version"] == "0.1.0" and len(node["gpus"]) == 1
    assert node["condition"] == "agent 0.1.0 runs tasks as root: upgrade it"
    job_id = cluster.cli("start", "--name", "compat", "--strategy", "mirrored", "--", PY, "-c",
                         "import os; print('hello from', os.environ['TFCLUSTER_TASK_TYPE'], os.getuid())",
                         check=True).stdout.strip()
    # It heartbeats: still READY well past the node timeout, and the job still waits.
    time.sleep(2 * cluster.lost_after)
    assert cluster.node_state("old") == "READY" and cluster.job(job_id)["state"] == "PENDING"
    assert "runs tasks as root: upgrade it" in cluster.cli("status").stdout
    cluster.start_agent("new")
    job = cluster.wait_job(job_id, timeout=30)
    assert job["state"] == "SUCCEEDED" and job["tasks"][0]["node"] == "new"
    assert cluster.cli("logs", job_id, "worker:0", check=True).stdout == f"hello from worker {job['uid']}\n"


def test_a_live_cluster_of_the_previous_release_is_upgraded_in_place(tmp_path, previous_python):
    gate = tmp_path / "go"
    cluster = LocalCluster(root=tmp_path / "cluster", tls=False)
    (tmp_path / "cluster").mkdir()
    try:
        cluster.start_coordinator(python=previous_python)
        cluster.start_agent("n1", python=previous_python)
        script = (f"import pathlib, time\nwhile not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.05)\n"
                  "print('done')")
        job_id = cluster.cli("start", "--name", "rolling", "--strategy", "mirrored", "--", PY, "-c", script,
                             check=True).stdout.strip()
        wait_until(lambda: cluster.job(job_id)["state"] == "RUNNING", 20, what="RUNNING on 0.1")
        pid = cluster.job(job_id)["tasks"][0]["pid"]
        # 1. The coordinator: this release reads the state 0.1 left.
        cluster.coordinator.terminate()
        cluster.start_coordinator()
        wait_until(lambda: cluster.node_state("n1") == "READY", 20, what="the 0.1 agent back")
        job = cluster.job(job_id)
        assert job["state"] == "RUNNING" and job["tasks"][0]["pid"] == pid and job["tasks"][0]["attempt"] == 1
        assert job["uid"], "a job saved without a UID gets one for its next launches"
        # 2. The node: this release's agent takes over the task the 0.1 agent started.
        cluster.agents["n1"].kill()
        cluster.start_agent("n1")
        gate.touch()
        job = cluster.wait_job(job_id, timeout=30)
        assert job["state"] == "SUCCEEDED" and job["restarts"] == 0 and job["tasks"][0]["attempt"] == 1
        assert cluster.cli("logs", job_id, "worker:0", check=True).stdout == "done\n"
        after = cluster.cli("start", "--name", "rolling", "--strategy", "mirrored", "--wait", "--", "true",
                            check=True).stdout.strip()
        assert after.split("-")[2:] and int(after.split("-")[1]) > int(job_id.split("-")[1]), \
            "no job id given out twice, and new ones carry the cluster's tag"
        assert json.loads(cluster.cli("status", "--json", check=True).stdout)["nodes"][0]["agent_version"] == \
            tfcluster.__version__
    finally:
        cluster.teardown()


@pytest.mark.skipif(os.geteuid() != 0, reason="0.7's agent runs tasks under their job's UID: it needs root")
def test_a_live_cluster_of_0_7_is_upgraded_in_place_across_the_relayout(tmp_path, python_0_7):
    """0.8 moved the daemons' modules into packages: a task a 0.7 agent started (its shim forked by 0.7's
    launcher) runs on while this release's coordinator and agent take over, and ends as it would have."""
    gate = tmp_path / "go"
    cluster = LocalCluster(root=tmp_path / "cluster", tls=False)
    (tmp_path / "cluster").mkdir()
    cluster.root.chmod(0o755)
    try:
        # The harness gives an earlier release's daemons the shared token alone; 0.7 also wants --insecure said.
        cluster.start_coordinator("--insecure", python=python_0_7)
        cluster.start_agent("n1", python=python_0_7, extra=["--insecure"])
        script = (f"import pathlib, time\nwhile not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.05)\n"
                  "print('done')")
        job_id = cluster.cli("start", "--name", "rolling", "--strategy", "mirrored", "--", PY, "-c", script,
                             check=True).stdout.strip()
        wait_until(lambda: cluster.job(job_id)["state"] == "RUNNING", 30, what="RUNNING on 0.7")
        pid = cluster.job(job_id)["tasks"][0]["pid"]
        cluster.coordinator.terminate()
        cluster.start_coordinator()
        wait_until(lambda: cluster.node_state("n1") == "READY", 20, what="the 0.7 agent back")
        cluster.agents["n1"].kill()
        cluster.start_agent("n1")
        assert cluster.job(job_id)["tasks"][0]["pid"] == pid, "the task started by 0.7 runs on"
        gate.touch()
        job = cluster.wait_job(job_id, timeout=30)
        assert job["state"] == "SUCCEEDED" and job["restarts"] == 0 and job["tasks"][0]["attempt"] == 1
        assert cluster.cli("logs", job_id, "worker:0", check=True).stdout == "done\n"
    finally:
        cluster.teardown()
