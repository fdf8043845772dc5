"""The policy and the queue with real daemons and real people's certificates: `coordinator --policy`, submit
refusals, a job held by its owner's quota with the reason in `tfcluster queue` and `status --json`, `tfcluster
policy`, and SIGHUP reloads (a bad one keeps the policy in force, a good one applies at once)."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import urllib.request

import pytest

from harness import PYTHON, LocalCluster, free_port, wait_until

POLICY = """\
[classes]
low = 10
normal = 50
high = { value = 100, preemptible = false }

[defaults]
class = "normal"
max_class = "normal"

[users.alice]
gpus = 1
max_class = "high"
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("queue")
    (root / "policy.toml").write_text(POLICY)
    cluster = LocalCluster(root=root)
    try:
        cluster.http = f"127.0.0.1:{free_port()}"
        cluster.start_coordinator("--policy", str(root / "policy.toml"), "--http-listen", cluster.http)
        cluster.start_agents({"a": {"gpus": 4}})
        for name, groups in (("alice", ["--group", "vision"]), ("bob", [])):
            cluster.cli("ca", "issue", "--dir", str(cluster.ca_dir), "--name", name, "--role", "user", *groups,
                        "--out", str(root / name), check=True)
        yield cluster
    finally:
        cluster.teardown()


def dashboard(cluster, path):
    """A dashboard answer as the admin's certificate gets it."""
    context = ssl.create_default_context(cafile=str(cluster.admin_dir / "ca.crt"))
    context.load_cert_chain(str(cluster.admin_dir / "client.crt"), str(cluster.admin_dir / "client.key"))
    with urllib.request.urlopen(f"https://{cluster.http}{path}", context=context, timeout=10) as response:
        return response.read().decode()


def as_user(cluster, name):
    return {"TFCLUSTER_TLS_DIR": str(cluster.root / name)}


def start(cluster, name, priority="", user="alice", gpus=1):
    """Submits a spec file (a spec says `priority = "..."`) as the user; the CLI's result."""
    spec, workdir = cluster.root / f"{name}.toml", cluster.root / "work"
    workdir.mkdir(exist_ok=True)
    spec.write_text(f'name = "{name}"\nstrategy = "mirrored"\ncommand = ["sleep", "120"]\nworkdir = "{workdir}"\n'
                    f'gpus = {gpus}\n' + (f'priority = "{priority}"\n' if priority else ""))
    return cluster.cli("start", str(spec), env=as_user(cluster, user))


def test_policy_shows_the_file_in_force(cluster):
    shown = cluster.cli("policy", check=True).stdout
    assert shown.startswith(f"# policy loaded from {cluster.root / 'policy.toml'} at ") and POLICY in shown
    doc = json.loads(cluster.cli("policy", "--json", env=as_user(cluster, "bob"), check=True).stdout)
    assert doc["source"] == str(cluster.root / "policy.toml") and doc["text"] == POLICY and doc["loaded_at"] > 0


def test_a_class_above_the_owners_highest_or_unknown_is_refused_at_submit(cluster):
    refused = start(cluster, "eager", "high", user="bob")
    assert refused.returncode == 2 and "priority: 'high' is above bob's highest class, 'normal'" in refused.stderr
    unknown = start(cluster, "eager", "urgent", user="alice")
    assert unknown.returncode == 2 and "priority: 'urgent' is not a priority class" in unknown.stderr
    too_big = start(cluster, "greedy", user="alice", gpus=2)
    assert too_big.returncode == 1 and "it asks for 2 GPUs, more than alice's quota of 1" in too_big.stderr


def test_a_job_over_its_owners_quota_waits_with_the_reason_until_a_reload_raises_it(cluster):
    first = start(cluster, "first", "high").stdout.strip()
    wait_until(lambda: cluster.job(first)["state"] == "RUNNING", 30, what="the first job to run")
    second = start(cluster, "second").stdout.strip()
    reason = "waiting: alice's quota of 1 GPU is in use (1 running + 1 asked)"
    wait_until(lambda: cluster.job(second)["message"] == reason, 15, what="the quota's reason")
    job = cluster.job(second)
    assert (job["state"], job["owner"], job["priority"], job["queue_position"]) == ("PENDING", "alice", "normal", 1)
    assert job["waiting_since"] > 0 and cluster.job(first)["priority"] == "high"
    queue = json.loads(cluster.cli("queue", "--json", env=as_user(cluster, "bob"), check=True).stdout)
    assert queue["total"] == 1
    entry = queue["jobs"][0]
    assert (entry["position"], entry["id"], entry["owner"], entry["priority"], entry["tasks"], entry["gpus"],
            entry["reason"]) == (1, second, "alice", "normal", 1, 1, reason)
    table = cluster.cli("queue", check=True).stdout
    assert second in table and "alice" in table and "quota" in table
    assert json.loads(dashboard(cluster, "/api/queue"))["jobs"][0]["reason"] == reason  # the dashboard's view
    assert "app.js" in dashboard(cluster, "/queue")
    assert 'tfcluster_queue_jobs{priority="normal"} 1.0' in dashboard(cluster, "/metrics")

    # A policy with a mistake is refused; the one in force stays.
    policy_file = cluster.root / "policy.toml"
    policy_file.write_text(POLICY.replace("gpus = 1", "gpus = -1"))
    os.kill(cluster.coordinator.proc.pid, signal.SIGHUP)
    wait_until(lambda: "policy not reloaded" in cluster.coordinator.log(), 10, what="the refused reload")
    assert f"{policy_file}: users.alice.gpus: expected a whole number >= 0, got -1" in cluster.coordinator.log()
    assert json.loads(cluster.cli("policy", "--json", check=True).stdout)["text"] == POLICY
    assert cluster.job(second)["state"] == "PENDING" and cluster.coordinator.alive

    # A good one applies at once: alice may now run both.
    policy_file.write_text(POLICY.replace("gpus = 1", "gpus = 2"))
    os.kill(cluster.coordinator.proc.pid, signal.SIGHUP)
    wait_until(lambda: cluster.job(second)["state"] == "RUNNING", 15, what="the second job to run")
    assert "gpus = 2" in cluster.cli("policy", check=True).stdout
    assert json.loads(cluster.cli("queue", "--json", check=True).stdout) == {"total": 0, "jobs": []}
    for job_id in (first, second):
        cluster.cli("stop", job_id, "--now", env=as_user(cluster, "alice"), check=True)


def test_a_coordinator_with_a_bad_policy_exits_2_naming_file_key_and_reason(tmp_path):
    bad = tmp_path / "policy.toml"
    bad.write_text("[users.alice]\ngpus = -1\n")
    result = subprocess.run([PYTHON, "-m", "tfcluster.cli", "coordinator", "--insecure", "--listen",
                             f"127.0.0.1:{free_port()}", "--state-dir", str(tmp_path / "state"), "--policy", str(bad)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"{bad}: users.alice.gpus: expected a whole number >= 0, got -1" in result.stderr
    assert not (tmp_path / "state").exists()  # refused before anything was written
