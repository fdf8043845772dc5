"""A cluster run with --insecure: plain text, said out loud at start and in every `status`; with a shared token
every daemon and client call must carry it (the health service stays open). Without either flag nothing
starts."""

from __future__ import annotations


import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness import LocalCluster, wait_until
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc, control_pb2, control_pb2_grpc


@pytest.fixture
def secured(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-cluster-token\n")
    cluster = LocalCluster(root=tmp_path / "cluster", tls=False, token_file=token)
    (tmp_path / "cluster").mkdir()
    try:
        cluster.start_coordinator()
        cluster.start_agent("a")
        cluster.start_agent("b")
        yield cluster
    finally:
        cluster.teardown()


def test_agents_and_clients_with_the_token_work(secured, tmp_path):
    from test_shipping import shipping_job
    job = shipping_job(secured, tmp_path, "tok")
    done = secured.job(job)
    assert done["state"] == "SUCCEEDED"
    assert done["evaluation"]["latest"]["checkpoint"].endswith("ckpt-3"), "shipped between agents with the token"
    assert secured.cli("logs", job, "worker:0", check=True).returncode == 0


def test_calls_without_the_token_are_refused(secured, tmp_path):
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token")
    for env in ({"TFCLUSTER_TOKEN_FILE": ""}, {"TFCLUSTER_TOKEN_FILE": str(wrong)}):
        result = secured.cli("status", env=env)
        assert result.returncode == 1 and "refused the request" in result.stderr
        assert "TFCLUSTER_TOKEN_FILE" in result.stderr and "Traceback" not in result.stderr
    with grpc.insecure_channel(secured.address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            control_pb2_grpc.ControlServiceStub(channel).GetStatus(control_pb2.GetStatusRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as info:
            agent_pb2_grpc.AgentServiceStub(channel).Register(agent_pb2.RegisterRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    peer = f"127.0.0.1:{secured.port_ranges['b'][0]}"
    with grpc.insecure_channel(peer) as channel:
        with pytest.raises(grpc.RpcError) as info:
            agent_pb2_grpc.AgentPeerServiceStub(channel).PutFiles(
                iter([agent_pb2.FileChunk(job_id="j-1", commit=True)]), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_an_agent_with_a_wrong_token_never_registers(secured, tmp_path):
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token")
    secured.start_agent("intruder", wait=False, extra=["--token-file", str(wrong)])
    agent = secured.agents["intruder"]
    wait_until(lambda: "refused this agent" in agent.log(), 20, what="the refusal in the agent's log")
    assert "intruder" not in {n["name"] for n in secured.status()["nodes"]}


def test_bad_token_files_are_one_line_errors(secured, tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    for path, needle in ((tmp_path / "missing", "cannot read the token file"), (empty, "is empty")):
        result = secured.cli("coordinator", "--listen", "127.0.0.1:0", "--token-file", str(path))
        assert result.returncode == 2 and needle in result.stderr and "Traceback" not in result.stderr
        result = secured.cli("status", env={"TFCLUSTER_TOKEN_FILE": str(path)})
        assert result.returncode == 2 and needle in result.stderr


def test_insecure_is_said_at_start_and_in_every_status(secured):
    assert "WITHOUT TLS (--insecure)" in secured.coordinator.log()
    table = secured.cli("status", check=True).stdout
    assert "WARNING: the coordinator runs without TLS (--insecure)" in table
    assert secured.status()["summary"]["insecure"] is True


def test_a_daemon_without_tls_or_insecure_does_not_start(secured, tmp_path):
    token = str(secured.token_file)
    for args, needle in (
        (["coordinator", "--listen", "127.0.0.1:0"], "give --tls-dir DIR"),
        (["coordinator", "--listen", "127.0.0.1:0", "--insecure", "--tls-dir", str(tmp_path)], "contradict"),
        (["coordinator", "--listen", "127.0.0.1:0", "--tls-dir", str(tmp_path / "none")], "cannot read"),
        (["coordinator", "--listen", "127.0.0.1:0", "--tls-dir", str(tmp_path), "--token-file", token],
         "--token-file goes with --insecure"),
        (["agent", "--coordinator", secured.address, "--name", "x", "--state-dir", str(tmp_path / "x")],
         "join the cluster with --join-token-file FILE"),
        (["agent", "--coordinator", secured.address, "--token-file", token], "--token-file goes with --insecure"),
    ):
        result = secured.cli(*args, timeout=30, env={"TFCLUSTER_TOKEN_FILE": ""})
        assert result.returncode == 2, (args, result.stderr)
        assert needle in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
