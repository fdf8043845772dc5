"""Node identity, stop escalation and what the coordinator keeps: a name is held by one live agent, a
restarted agent takes its name back at once, `stop --now` after a graceful stop kills at once, an
acknowledged submission survives kill -9, a retried submission is one job, ended jobs are kept within
limits, and a coordinator that another overtook on its store stops acting and exits."""

from __future__ import annotations

import json
import shutil
import sys
import time


from harness import Daemon, job_processes, port_block, wait_until
from tfcluster.api.v1 import control_pb2, control_pb2_grpc
from tfcluster.specfile import parse_spec
from tfcluster.wire import spec_to_proto

PY = sys.executable
EXIT_REFUSED = 78


def start(cluster, *args) -> str:
    return cluster.cli("start", *args, check=True).stdout.strip()


def running(cluster, job_id) -> dict:
    return wait_until(lambda: (lambda j: j if j["state"] == "RUNNING" else None)(cluster.job(job_id)), 30,
                      what=f"{job_id} RUNNING")


def test_a_second_agent_with_a_name_in_use_is_refused_and_exits(make_cluster):
    cluster = make_cluster()
    cluster.start_agent("a")
    job_id = start(cluster, "--name", "keeps", "--strategy", "mirrored", "--", "sleep", "120")
    before = running(cluster, job_id)["tasks"][0]
    # A cloned machine image: the same node name, another address, its own state dir and ports. Without the
    # node's certificate it cannot even join under that name; with a copy of it (the state dir cloned too) it
    # cannot register while the node is live.
    for twin_name, cloned in (("twin", False), ("clone", True)):
        base = port_block()
        state = cluster.root / "agents" / twin_name
        state.mkdir(parents=True)
        if cloned:
            shutil.copytree(cluster.agent_state_dir("a") / "tls", state / "tls")
        twin = Daemon(twin_name, ["agent", "--coordinator", cluster.address, "--name", "a", "--advertise-address",
                                  "127.0.0.2", "--port-range", f"{base}-{base + 9}", "--state-dir", str(state),
                                  "--gpu-inventory", "none", *cluster.agent_trust_args()],
                      cluster.root / f"agent-{twin_name}.log").start()
        cluster.agents[twin_name] = twin
        if cloned:
            assert twin.proc.wait(timeout=60) == EXIT_REFUSED
            assert "node name 'a' is held by a live agent at 127.0.0.1" in twin.log()
        else:
            assert twin.proc.wait(timeout=60) == 2
            assert "node 'a' holds a valid certificate" in twin.log()
    node = next(n for n in cluster.status()["nodes"] if n["name"] == "a")
    assert node["state"] == "READY" and node["address"] == "127.0.0.1"
    task = cluster.job(job_id)["tasks"][0]
    assert (task["state"], task["attempt"], task["pid"]) == ("RUNNING", 1, before["pid"])


def test_a_restarted_agent_takes_its_name_back_at_once(make_cluster):
    cluster = make_cluster(lost_after=5.0)
    cluster.start_agent("a")
    job_id = start(cluster, "--name", "stays", "--strategy", "mirrored", "--", "sleep", "120")
    pid = running(cluster, job_id)["tasks"][0]["pid"]
    cluster.agents["a"].kill()
    began = time.monotonic()
    cluster.start_agent("a", wait=False)
    wait_until(lambda: "registered with" in cluster.agents["a"].log(), 20, what="the agent to register again")
    assert time.monotonic() - began < 5.0, "not refused until the old registration expired"
    assert cluster.node_state("a") == "READY"
    task = cluster.job(job_id)["tasks"][0]
    assert (task["state"], task["attempt"], task["pid"]) == ("RUNNING", 1, pid)
    assert "refused" not in cluster.agents["a"].log()


def test_stop_now_after_a_graceful_stop_kills_at_once(make_cluster, tmp_path):
    cluster = make_cluster()
    cluster.start_agent("a")
    spec = tmp_path / "stubborn.toml"
    spec.write_text('name = "stubborn"\nstrategy = "mirrored"\nstop_grace_seconds = 300\n'
                    'command = ["sh", "-c", "trap \'\' TERM; sleep 300 & echo started; wait"]\n')
    job_id = start(cluster, str(spec))
    wait_until(lambda: cluster.cli("logs", job_id, "worker:0").stdout == "started\n", 20, what="the task")
    assert "STOPPING" in cluster.cli("stop", job_id, "--no-wait", check=True).stderr
    time.sleep(1.0)
    assert cluster.job(job_id)["state"] == "STOPPING" and job_processes(job_id), "it ignores SIGTERM"
    began = time.monotonic()
    result = cluster.cli("stop", job_id, "--now", check=True, timeout=60)
    assert "STOPPED" in result.stderr and time.monotonic() - began < 30, "no wait for the 300 s grace"
    assert job_processes(job_id) == []


def test_an_acknowledged_submission_survives_kill_9_and_a_retry_is_the_same_job(make_cluster):
    cluster = make_cluster()
    cluster.start_agent("a", gpus=1)
    spec = spec_to_proto(parse_spec({"name": "durable", "strategy": "mirrored", "command": ["sleep", "60"],
                                     "workdir": "/tmp", "gpus": 1}))
    acknowledged = []
    for round in range(3):
        with cluster.channel() as channel:
            reply = control_pb2_grpc.ControlServiceStub(channel).SubmitJob(
                control_pb2.SubmitJobRequest(spec=spec, client_request_id=f"req-{round}"), timeout=10)
        cluster.coordinator.kill()  # right after the reply
        acknowledged.append(reply.job_id)
        cluster.start_coordinator()
        jobs = {j["id"] for j in json.loads(cluster.cli("status", "--all", "--json", check=True).stdout)["jobs"]}
        assert set(acknowledged) <= jobs, f"lost an acknowledged job: {set(acknowledged) - jobs}"
    assert len(set(acknowledged)) == 3
    with cluster.channel() as channel:
        stub = control_pb2_grpc.ControlServiceStub(channel)
        again = [stub.SubmitJob(control_pb2.SubmitJobRequest(spec=spec, client_request_id="req-1"), timeout=10)
                 for _ in range(2)]
    assert [r.job_id for r in again] == [acknowledged[1]] * 2, "a retried submission is the same job"
    jobs = json.loads(cluster.cli("status", "--all", "--json", check=True).stdout)["jobs"]
    assert sorted(j["id"] for j in jobs) == sorted(acknowledged)


def test_ended_jobs_are_kept_within_the_limit_and_job_ids_never_repeat(make_cluster):
    cluster = make_cluster(3.0, "--keep-finished-jobs", "2")
    cluster.start_agent("a")
    ids = [cluster.cli("start", "--name", "short", "--strategy", "mirrored", "--wait", "--", "true",
                       check=True).stdout.strip() for _ in range(4)]
    tag = ids[0].rsplit("-", 1)[1]
    assert ids == [f"short-{i}-{tag}" for i in range(1, 5)], "numbered, with the cluster's tag"
    def kept() -> list[str]:
        return [j["id"] for j in json.loads(cluster.cli("status", "--all", "--json", check=True).stdout)["jobs"]]
    # Ended jobs past the limit go at the coordinator's next tick (every 0.2 s), not as the last one ends.
    wait_until(lambda: kept() == ids[2:], 5, interval=0.1, what="only the last two ended jobs kept")
    assert cluster.cli("status", ids[0]).returncode == 1
    cluster.coordinator.kill()
    cluster.start_coordinator("--keep-finished-jobs", "2")
    assert kept() == ids[2:], "removed with their records"
    wait_until(lambda: cluster.node_state("a") == "READY", 20, what="the agent back")
    assert start(cluster, "--name", "short", "--strategy", "mirrored", "--", "true") == f"short-5-{tag}"


def test_a_coordinator_overtaken_on_its_store_stops_acting_and_exits(make_cluster):
    cluster = make_cluster()
    first = (cluster.address, cluster.join_address, cluster.coordinator)
    # A second coordinator on the same state dir, as a failover that did not wait for the first to go.
    cluster.address = cluster.join_address = ""
    second = cluster.start_coordinator()
    try:
        cluster.start_agent("b")  # joins through the second: the cluster's reusable join token is used once more
        cluster.address, cluster.join_address, cluster.coordinator = first
        cluster.start_agent("c", wait=False)  # through the first, whose record of that token is now stale
        assert first[2].proc.wait(timeout=30) == 1
        assert "was written by another coordinator: this one stops acting" in first[2].log()
        assert "error: stopped: another coordinator wrote to the store" in first[2].log()
        assert second.alive
    finally:
        second.terminate()
