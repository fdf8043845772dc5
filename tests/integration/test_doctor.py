"""`tfcluster doctor` on a real cluster: every check passes on a healthy one, with real TCP connects between the
agents; a firewall dropping one node's task ports, a LOST node and a drained one are each named with the fix; only
admins may run it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from harness import wait_until


def doctor(cluster, *args: str, env=None):
    result = cluster.cli("doctor", "--json", *args, env=env, timeout=60)
    return result, json.loads(result.stdout) if result.stdout.startswith("{") else None


def test_a_healthy_cluster_passes_every_check_with_real_connects_between_its_agents(make_cluster):
    cluster = make_cluster()
    cluster.start_agents({"a": {}, "b": {}})
    result, report = doctor(cluster)
    assert result.returncode == 0 and report["failed"] == 0, result.stdout
    levels = {(c["name"], c["subject"].split(" ")[0]) for c in report["checks"] if c["level"] == "ok"}
    assert {("clock", "a"), ("clock", "b"), ("node", "a"), ("node", "b"), ("nccl", "a")} <= levels
    ports = [c for c in report["checks"] if c["name"] == "ports"]
    first_b, last_b = cluster.port_ranges["b"]
    assert any(c["subject"].startswith("a -> b 127.0.0.1:") and c["level"] == "ok" and "task range" in c["message"]
               and first_b <= int(c["subject"].rsplit(":", 1)[1]) <= last_b for c in ports), ports
    assert len([c for c in ports if c["level"] == "ok"]) == 4, "each way: the peer port and a task port"
    table = cluster.cli("doctor", check=True).stdout
    assert "OK    ports       b -> a" in table and table.rstrip().endswith("checks, 0 failed")


def test_gpu_nodes_on_different_drivers_are_shown_in_status_and_named_by_the_doctor(make_cluster):
    cluster = make_cluster()
    cluster.start_agents({"a": {"gpus": 1, "driver": "580.159.04"}, "b": {"gpus": 1, "driver": "580.159.04"},
                          "c": {"gpus": 1, "driver": "570.86.10"}})
    nodes = {n["name"]: n for n in cluster.status()["nodes"]}
    assert (nodes["a"]["gpu_driver"], nodes["a"]["cuda_version"], nodes["c"]["gpu_driver"]) == \
        ("580.159.04", "13.0", "570.86.10")
    result, report = doctor(cluster)
    assert result.returncode == 0 and report["failed"] == 0, "a warning, not a failure: jobs still run"
    drivers = [c for c in report["checks"] if c["name"] == "gpu-driver"]
    assert [(c["level"], c["message"]) for c in drivers] == \
        [("warn", "2 NVIDIA driver versions: 580.159.04 on a, b; 570.86.10 on c")]
    node_a = next(c for c in report["checks"] if c["name"] == "node" and c["subject"] == "a")
    assert "(driver 580.159.04, CUDA 13.0)" in node_a["message"]


def test_a_node_whose_agent_renews_its_certificate_in_time_is_never_flagged(make_cluster):
    """Certificates of 12 s: the agent renews at 8 s and the coordinator counts the renewal, so past 10 s (five
    sixths of the first certificate's life) the doctor says nothing of it (test_diagnosis.py has the verdicts on a
    certificate not renewed in time)."""
    cluster = make_cluster(3.0, "--node-cert-lifetime", "12s")
    cluster.start_agents({"a": {}})
    wait_until(lambda: "renewed the node's certificate" in cluster.agents["a"].log(), 20, what="a renewal")
    _, report = doctor(cluster)
    tls = [c for c in report["checks"] if c["name"] == "tls" and c["subject"] == "a"]
    assert tls == [], "renewed in time: nothing to say"
    wait_until(lambda: any(c["name"] == "tls" and c["subject"] == "a" and c["level"] != "ok"
                           for c in doctor(cluster)[1]["checks"]) or
               cluster.agents["a"].log().count("renewed the node's certificate") >= 2, 20,
               what="a second renewal, or a warning")
    _, report = doctor(cluster)
    assert [c for c in report["checks"] if c["name"] == "tls" and c["subject"] == "a"] == [], report["checks"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("iptables"), reason="needs root and iptables")
def test_a_firewalled_task_range_a_lost_node_and_a_drained_one_are_named_with_the_fix(make_cluster):
    cluster = make_cluster()
    cluster.start_agents({"a": {}, "b": {}, "c": {}})
    first, last = cluster.port_ranges["b"]
    rule = ["INPUT", "-i", "lo", "-p", "tcp", "--dport", f"{first + 1}:{last}", "-j", "DROP",
            "-m", "comment", "--comment", f"tfcluster-test-{os.getpid()}"]  # b's task ports, not its peer port
    subprocess.run(["iptables", "-I", *rule], check=True)
    try:
        cluster.cli("node", "drain", "a", "--reason", "PSU swap", check=True)
        cluster.agents["c"].kill()
        wait_until(lambda: cluster.node_state("c") == "LOST", 15, what="c LOST")
        result, report = doctor(cluster)
    finally:
        subprocess.run(["iptables", "-D", *rule], check=True)
    assert result.returncode == 1 and report["failed"] >= 2, result.stdout
    failed = {(c["name"], c["subject"]): c for c in report["checks"] if c["level"] == "fail"}
    blocked = next(c for (name, subject), c in failed.items() if name == "ports" and subject.startswith("a -> b "))
    assert "timed out" in blocked["message"], blocked
    assert f"let the other nodes reach TCP ports {first + 1}-{last} of 127.0.0.1 (its --port-range)" in blocked["fix"]
    assert not any(n == "ports" and s.startswith("a -> b ") and "peer port" in c["message"]
                   for (n, s), c in failed.items()), "b's peer port is not behind the rule"
    lost = failed[("node", "c")]
    assert lost["message"].startswith("LOST") and "tfcluster node remove c" in lost["fix"]
    assert all(c["subject"] != "c" for c in report["checks"] if c["name"] == "clock"), "a LOST node is not probed"
    drained = next(c for c in report["checks"] if c["subject"] == "a" and c["level"] == "warn")
    assert "drained by admin: PSU swap" in drained["message"] and "tfcluster node resume a" in drained["fix"]


def test_only_admins_may_run_the_doctor(make_cluster):
    cluster = make_cluster()
    cluster.start_agent("a")
    viewer = cluster.root / "people" / "eve"
    cluster.cli("ca", "issue", "--dir", str(cluster.ca_dir), "--role", "viewer", "--name", "eve", "--out", str(viewer),
                check=True)
    refused = cluster.cli("doctor", env={"TFCLUSTER_TLS_DIR": str(viewer)})
    assert refused.returncode == 1 and "viewer 'eve' may not call Diagnose" in refused.stderr, refused.stderr
    assert doctor(cluster)[0].returncode == 0, "the cluster keeps working"


def test_gpu_tasks_get_the_interface_their_peers_reach_the_node_by_unless_the_job_names_one(make_cluster):
    cluster = make_cluster()
    cluster.start_agent("a", gpus=2)
    show = ["python3", "-c", "import os; print(os.environ.get('NCCL_SOCKET_IFNAME', 'unset'))"]

    def ran(name: str, *flags: str) -> str:
        job = cluster.cli("start", "--name", name, "--strategy", "mirrored", *flags, "--wait", "--", *show,
                          check=True).stdout.strip().splitlines()[0]
        return cluster.cli("logs", job, "worker:0", check=True).stdout.strip()

    assert ran("gpu", "--gpus-per-task", "1") == "lo", "127.0.0.1, the agent's advertise address, is on lo"
    assert ran("cpu") == "unset", "a task without GPUs runs no NCCL"
    assert ran("chosen", "--gpus-per-task", "1", "--env", "NCCL_SOCKET_IFNAME=ib0") == "ib0"
