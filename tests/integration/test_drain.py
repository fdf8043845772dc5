"""Draining a node for maintenance on a real cluster: an admin's `node drain` keeps new jobs off the node while
what runs there goes on, survives a coordinator restart, `--requeue --wait` moves the jobs elsewhere charging
no restart, `node resume` brings the node back; a user cannot drain, and bad input names what is wrong."""

from __future__ import annotations

import json
import time

import grpc
import pytest

from harness import job_processes, wait_until
from tfcluster.api.v1 import control_pb2, control_pb2_grpc


def nodes(cluster) -> dict[str, dict]:
    return {n["name"]: n for n in json.loads(cluster.cli("status", "--json", check=True).stdout)["nodes"]}


def start(cluster, name: str, *command: str) -> str:
    return cluster.cli("start", "--name", name, "--strategy", "mirrored", "--", *command, check=True).stdout.strip()


def node_of(cluster, job: str) -> str:
    return wait_until(lambda: cluster.job(job)["tasks"][0]["node"] if cluster.job(job)["state"] == "RUNNING" else "",
                      60, what=f"{job} running")


def test_a_drained_node_keeps_its_jobs_gets_no_new_ones_and_requeue_moves_them_charging_nothing(make_cluster):
    cluster = make_cluster()
    cluster.start_agents({"a": {}, "b": {}})
    long = start(cluster, "long", "sleep", "600")
    busy = node_of(cluster, long)
    other = ({"a", "b"} - {busy}).pop()
    task = job_processes(long)[0].pid

    drained = cluster.cli("node", "drain", busy, "--reason", "PSU swap", check=True)
    assert f"node {busy} draining; 1 job(s) running there finish there" in drained.stdout
    node = nodes(cluster)[busy]
    assert node["schedulable"] is False and node["state"] == "READY"
    assert node["drain"]["reason"] == "PSU swap" and node["drain"]["by"] == "admin"
    assert node["drain"]["state"] == "DRAINING"
    table = cluster.cli("status", check=True).stdout
    assert "DRAINING*" in table and f"* {busy} drained by admin" in table and "PSU swap" in table
    for n in range(2):
        assert node_of(cluster, start(cluster, f"new{n}", "sleep", "600")) == other, "new jobs go elsewhere"
    assert task in [p.pid for p in job_processes(long)], "the running job was not touched"

    cluster.coordinator.terminate()
    cluster.start_coordinator()
    wait_until(lambda: cluster.node_state(busy) == "READY", 30, what=f"{busy} back after the coordinator's restart")
    assert nodes(cluster)[busy]["drain"]["reason"] == "PSU swap", "the drain was stored"

    moved = cluster.cli("node", "drain", busy, "--reason", "PSU swap, now", "--requeue", "--wait", timeout=120,
                        check=True)
    assert f"node {busy} draining; 1 job(s) sent back to the queue" in moved.stdout
    assert f"node {busy} drained" in moved.stdout.splitlines()[-1]
    assert node_of(cluster, long) == other
    job = cluster.job(long)
    assert job["restarts"] == 0 and job["preemptions"] == 1, job
    assert nodes(cluster)[busy]["drain"]["state"] == "DRAINED" and not job_processes(long)[0].pid == task

    assert f"node {busy} resumed" in cluster.cli("node", "resume", busy, check=True).stdout
    assert nodes(cluster)[busy]["drain"] is None and nodes(cluster)[busy]["schedulable"] is True
    cluster.cli("node", "drain", other, "--reason", "kernel update", check=True)
    assert node_of(cluster, start(cluster, "after", "sleep", "600")) == busy, "the resumed node takes new jobs"


def test_drain_wait_returns_once_the_jobs_there_have_finished(make_cluster):
    cluster = make_cluster()
    cluster.start_agent("a")
    job = start(cluster, "short", "sleep", "4")
    node_of(cluster, job)
    waited = cluster.cli("node", "drain", "a", "--reason", "disk swap", "--wait", timeout=60, check=True)
    assert "drained" in waited.stdout.splitlines()[-1] and "waiting: 1 task(s) still on a" in waited.stderr
    assert cluster.job(job)["state"] == "SUCCEEDED"
    queued = start(cluster, "queued", "true")
    assert wait_until(lambda: "drained by admin: disk swap" in cluster.job(queued)["message"], 30,
                      what="the waiting job to say why")
    assert cluster.job(queued)["state"] == "PENDING", "a job that fits only a drained node waits, it does not fail"
    cluster.cli("node", "resume", "a", check=True)
    assert cluster.wait_job(queued)["state"] == "SUCCEEDED"


def test_a_user_cannot_drain_or_resume_and_bad_input_is_named(make_cluster):
    cluster = make_cluster()
    cluster.start_agent("a")
    bob = cluster.root / "people" / "bob"
    cluster.cli("ca", "issue", "--dir", str(cluster.ca_dir), "--role", "user", "--name", "bob", "--out", str(bob),
                check=True)
    as_bob = {"TFCLUSTER_TLS_DIR": str(bob)}
    refused = cluster.cli("node", "drain", "a", "--reason", "mine now", env=as_bob)
    assert refused.returncode == 1 and "user 'bob' may not call DrainNode" in refused.stderr, refused.stderr
    from tfcluster.security import Credentials
    with Credentials.from_dir(bob).channel(cluster.address) as channel:
        stub = control_pb2_grpc.ControlServiceStub(channel)
        for call, request in ((stub.DrainNode, control_pb2.DrainNodeRequest(name="a", reason="x", requeue=True)),
                              (stub.ResumeNode, control_pb2.ResumeNodeRequest(name="a"))):
            with pytest.raises(grpc.RpcError) as refusal:
                call(request, timeout=10)
            assert refusal.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert cluster.cli("node", "resume", "a", env=as_bob).returncode == 1
    assert nodes(cluster)["a"]["drain"] is None, "nothing bob sent drained the node"

    assert cluster.cli("node", "drain", "a").returncode == 2, "--reason is required"
    for reason in ("", "   ", "x" * 201, "two\nlines"):
        result = cluster.cli("node", "drain", "a", "--reason", reason)
        assert result.returncode == 2 and "--reason" in result.stderr, (reason, result.stderr)
    with cluster.channel() as channel:  # the coordinator checks it too, for clients other than this CLI
        with pytest.raises(grpc.RpcError) as refusal:
            control_pb2_grpc.ControlServiceStub(channel).DrainNode(
                control_pb2.DrainNodeRequest(name="a", reason="bad\x1b[2J"), timeout=10)
        assert refusal.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "reason" in refusal.value.details()
    unknown = cluster.cli("node", "drain", "nowhere", "--reason", "x")
    assert unknown.returncode == 1 and "unknown node 'nowhere'" in unknown.stderr
    assert "node a was not drained" in cluster.cli("node", "resume", "a", check=True).stdout
    assert cluster.wait_job(start(cluster, "still", "true"))["state"] == "SUCCEEDED", "the cluster keeps working"


def test_an_agent_whose_health_check_fails_is_drained_until_it_passes(make_cluster, tmp_path):
    cluster = make_cluster()
    sick = tmp_path / "sick"
    sick.write_text("ERROR: nhc: Health check failed: check_fs_mount: /scratch not mounted\n")
    check = tmp_path / "check.sh"
    check.write_text(f"#!/bin/sh\ntest -e {sick} || exit 0\ncat {sick}\nexit 1\n")
    check.chmod(0o755)
    cluster.start_agent("a", extra=["--health-check-program", str(check), "--health-check-interval", "1s"])
    node = nodes(cluster)["a"]
    assert node["drain"]["by"] == "health check" and "/scratch not mounted" in node["drain"]["reason"]
    assert node["schedulable"] is False, "drained from its registration on"
    job = start(cluster, "waits", "true")
    assert wait_until(lambda: "its health check failed" in cluster.job(job)["message"], 30, what="the reason")
    assert cluster.job(job)["state"] == "PENDING"
    sick.unlink()
    assert cluster.wait_job(job, timeout=30)["state"] == "SUCCEEDED", "the drain lifts itself once it passes"
    assert nodes(cluster)["a"]["drain"] is None

    cluster.cli("node", "drain", "a", "--reason", "RMA", check=True)
    sick.write_text("GPU 0 fell off the bus\n")
    agent = cluster.agents["a"]
    try:  # the program's own line, not any line that mentions a health check (the GPU check's would match)
        wait_until(lambda: "health check failed: GPU 0 fell off the bus" in agent.log(), 30,
                   what="the check to fail again")
        sick.unlink()
        wait_until(lambda: agent.log().count("health check passes again") >= 2, 30, what="the check to pass again")
    except AssertionError as e:
        raise AssertionError(f"{e}\nagent a:\n{agent.log()[-6000:]}") from None
    time.sleep(1.5)  # its heartbeats have said so since
    assert nodes(cluster)["a"]["drain"]["reason"] == "RMA", "an admin's drain stays"


def test_a_health_check_program_the_agent_cannot_run_is_refused_at_start(make_cluster, tmp_path):
    cluster = make_cluster()
    data = tmp_path / "not-executable"
    data.write_text("exit 0\n")
    for program in (tmp_path / "missing", data):
        daemon = cluster.start_agent("a", extra=["--health-check-program", str(program)], wait=False)
        assert daemon.proc.wait(timeout=60) == 2
        assert f"--health-check-program {program}: not an executable file" in daemon.log()
