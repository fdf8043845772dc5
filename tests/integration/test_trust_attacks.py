"""The holes an attacker found in trust, each tried again over real TLS with real processes: a node's certificate
passing for the coordinator, a join answer naming another CA, a join token taking a live node's name, a stream
left half-open when another took over, removal that missed names and old tokens, a node that rejoined by itself
after its certificate expired, a join token on the command line. Each asserts the refusal and that the cluster
keeps working."""

from __future__ import annotations

import datetime
import threading
import time
from concurrent import futures

import grpc
import psutil
import pytest

from harness import Daemon, free_port, job_processes, wait_until
from test_trust import EXIT_REFUSED, cluster, join_agent, new_token, node_info, token_file  # noqa: F401 (fixture)
from tfcluster import pki
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.pki import REMOVED, REPLACED
from tfcluster.security import Credentials


class Recorder(grpc.GenericRpcHandler):
    """A server that answers nothing and remembers every call that reached it."""

    def __init__(self):
        self.calls: list[str] = []

    def service(self, details):
        self.calls.append(details.method)
        return None


def forged_server(credentials: Credentials) -> tuple[grpc.Server, Recorder, str]:
    """A gRPC server on loopback that serves with credentials (a certificate of the cluster's CA, not the
    coordinator's) and asks for client certificates the way the coordinator does."""
    recorder = Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[recorder])
    address = f"127.0.0.1:{free_port()}"
    server.add_secure_port(address, credentials.server())
    server.start()
    return server, recorder, address


def running_job(cluster, name: str) -> str:
    job_id = cluster.cli("start", "--name", name, "--strategy", "mirrored", "--", "sleep", "120",
                         check=True).stdout.strip()
    wait_until(lambda: cluster.job(job_id)["state"] == "RUNNING", 30, what=f"{job_id} RUNNING")
    return job_id


def test_a_node_certificate_cannot_pass_for_the_coordinator(cluster, tmp_path):
    # A node certificate of the cluster's CA, valid for the very address clients dial (127.0.0.1), as the old
    # signer made them: only the role the coordinator's own certificate carries tells them apart.
    impostor = cluster.credentials("node", "mallory")
    assert "127.0.0.1" in pki.server_names(pki.x509.load_pem_x509_certificate(impostor.cert))
    server, recorder, address = forged_server(impostor)
    try:
        secret = cluster.cli("start", "--name", "leak", "--strategy", "mirrored", "--env", "API_KEY=hunter2",
                             "--coordinator", address, "--", "true")
        assert secret.returncode == 1 and "cannot reach the coordinator" in secret.stderr, secret.stderr
        # A real agent of the cluster pointed at it: it never registers there, so it is never told what to run.
        cluster.start_agent("b")
        cluster.agents["b"].kill()
        node_dir = cluster.agent_state_dir("b")
        fooled = Daemon("b2", [
            "agent", "--coordinator", address, "--name", "b", "--advertise-address", "127.0.0.1",
            "--port-range", "29000-29009", "--state-dir", str(node_dir), "--gpu-inventory", "none"],
            cluster.root / "agent-b2.log").start()
        cluster.agents["b2"] = fooled
        wait_until(lambda: "unreachable" in fooled.log(), 30, what="the agent to give up on the forged server")
        assert fooled.alive, "it keeps trying, as for a coordinator that is away"
    finally:
        server.stop(0)
    assert recorder.calls == [], "no call (no secret, no registration) ever reached the impostor"
    assert cluster.node_state("a") == "READY"
    assert cluster.cli("start", "--name", "fine", "--strategy", "mirrored", "--wait", "--", "true",
                       check=True).returncode == 0


class ForgedJoin(agent_pb2_grpc.JoinServiceServicer):
    """The coordinator's join port as a thief of its key would run it: real certificates, another CA offered."""

    def __init__(self, ca: pki.Authority, other_ca: bytes):
        self.ca, self.other_ca = ca, other_ca

    def Join(self, request, context):
        cert = self.ca.sign_node(request.csr, request.node_name, datetime.timedelta(hours=1))
        return agent_pb2.JoinResponse(certificate=cert, ca_certificate=self.other_ca)


def test_a_joining_agent_keeps_the_ca_it_pinned(cluster, tmp_path):
    pki.init_ca(tmp_path / "other", [])
    other = (tmp_path / "other" / pki.CA_CERT).read_bytes()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    agent_pb2_grpc.add_JoinServiceServicer_to_server(
        ForgedJoin(pki.Authority.load(cluster.ca_dir, with_key=True), other), server)
    join_address = f"127.0.0.1:{free_port()}"
    coordinator = Credentials.from_dir(cluster.ca_dir, pki.SERVER_CERT, pki.SERVER_KEY)
    server.add_secure_port(join_address, coordinator.join_server())
    server.start()
    try:
        pinned = pki.ca_hash(pki.load_cert(cluster.ca_dir / pki.CA_CERT))
        agent = join_agent(cluster, "p1", *token_file(cluster, new_token(cluster)), "--ca-hash", pinned,
                           "--join-address", join_address)
    finally:
        server.stop(0)
    kept = (cluster.agent_state_dir("p1") / "tls" / pki.CA_CERT).read_bytes()
    assert kept == (cluster.ca_dir / pki.CA_CERT).read_bytes() != other, "the pinned CA, not the one offered"
    assert agent.alive and cluster.node_state("p1") == "READY"


def join_call(cluster, token: str, name: str) -> tuple[bytes, bytes]:
    """A Join RPC as anyone on the network can make it: (key, certificate) for name, or grpc.RpcError."""
    key, csr = pki.new_csr(name)
    channel = grpc.secure_channel(cluster.join_address,
                                  grpc.ssl_channel_credentials((cluster.ca_dir / pki.CA_CERT).read_bytes()),
                                  options=[("grpc.ssl_target_name_override", pki.COORDINATOR_NAME)])
    with channel:
        reply = agent_pb2_grpc.JoinServiceStub(channel).Join(
            agent_pb2.JoinRequest(token=token, node_name=name, csr=csr), timeout=10)
    return key, reply.certificate


def refusal(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_a_join_token_cannot_take_a_live_nodes_name(cluster):
    job_id = running_job(cluster, "victim")
    e = refusal(lambda: join_call(cluster, cluster.join_token, "a"))
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "'a' holds a valid certificate" in e.details()
    assert "tfcluster token create --node a --replace" in e.details()
    for name, why in (("localhost", "reserved"), ("127.0.0.1", "IP address")):
        e = refusal(lambda: join_call(cluster, cluster.join_token, name))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and why in e.details()
    thief = join_agent(cluster, "a-thief", *token_file(cluster, cluster.join_token), "--ca-cert",
                       str(cluster.ca_dir / pki.CA_CERT), "--name", "a", wait=False)
    assert thief.proc.wait(timeout=30) == 2 and "holds a valid certificate" in thief.log()
    job = cluster.job(job_id)
    assert job["state"] == "RUNNING" and job["tasks"][0]["attempt"] == 1 and cluster.node_state("a") == "READY"
    cluster.cli("stop", job_id, "--now", check=True)


def test_replacing_a_node_ends_the_old_holder_and_refuses_its_certificate(cluster):
    job_id = running_job(cluster, "moving")
    old = Credentials.from_dir(cluster.agent_state_dir("a") / "tls", pki.NODE_CERT, pki.NODE_KEY)
    token = new_token(cluster, "--node", "a", "--replace")
    new = join_agent(cluster, "a-new", *token_file(cluster, token), "--ca-cert", str(cluster.ca_dir / pki.CA_CERT),
                     "--name", "a", wait=False)
    old_agent = cluster.agents["a"]
    assert old_agent.proc.wait(timeout=30) == EXIT_REFUSED, "its stream ended with a status it acted on"
    assert REPLACED in old_agent.log()
    wait_until(lambda: job_processes(job_id) == [] or cluster.job(job_id)["tasks"][0]["attempt"] > 1, 30,
               what="the old holder's task to be stopped or the job to move")
    with old.channel(cluster.address) as channel:
        e = refusal(lambda: agent_pb2_grpc.AgentServiceStub(channel).Register(
            agent_pb2.RegisterRequest(node=node_info("a", cluster)), timeout=5))
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED and REPLACED in e.details()
    wait_until(lambda: cluster.node_state("a") == "READY", 40, what="the new holder of 'a' to register")
    assert new.alive and "joined the cluster" in new.log()
    cluster.cli("stop", job_id, "--now", check=True)


def test_a_newer_stream_of_a_node_ends_the_older_one_with_a_status(cluster):
    with cluster.channel("node", "twice") as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        info = node_info("twice", cluster)

        done = threading.Event()

        def messages(session: str):  # the open message, then the stream stays open as an agent's does
            yield agent_pb2.AgentMessage(open=agent_pb2.StreamOpen(node_name="twice", session_id=session))
            done.wait(30)

        def stream(session: str):
            return stub.Connect(messages(session))
        first = stream(stub.Register(agent_pb2.RegisterRequest(node=info), timeout=5).session_id)
        wait_until(lambda: cluster.node_state("twice") == "READY", 10, what="registered")
        second_session = stub.Register(agent_pb2.RegisterRequest(node=info), timeout=5).session_id
        started = time.monotonic()
        e = refusal(lambda: list(first))
        assert e.code() == grpc.StatusCode.ABORTED and "took over" in e.details()
        assert time.monotonic() - started < 5, "ended at once, not left open"
        second = stream(second_session)
        second.cancel()
        done.set()
    assert cluster.node_state("a") == "READY"


def test_removal_reaches_names_that_never_registered_and_tokens_made_before_it(cluster):
    key, cert = join_call(cluster, cluster.join_token, "ghost")
    ghost = Credentials((cluster.ca_dir / pki.CA_CERT).read_bytes(), cert, key)
    assert "ghost" not in {n["name"] for n in cluster.status()["nodes"]}, "it never registered"
    assert "node ghost removed" in cluster.cli("node", "remove", "ghost", check=True).stdout
    with ghost.channel(cluster.address) as channel:
        e = refusal(lambda: agent_pb2_grpc.AgentServiceStub(channel).Register(
            agent_pb2.RegisterRequest(node=node_info("ghost", cluster)), timeout=5))
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED and REMOVED in e.details()
    e = refusal(lambda: join_call(cluster, cluster.join_token, "ghost"))
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "only a token made after" in e.details()
    join_call(cluster, new_token(cluster, "--node", "ghost"), "ghost")
    result = cluster.cli("node", "remove", "nobody")
    assert result.returncode == 1 and "unknown node 'nobody'" in result.stderr
    assert cluster.node_state("a") == "READY"


def test_an_expired_certificate_means_ask_an_admin_not_a_silent_rejoin(make_cluster):
    cluster = make_cluster(3.0, "--node-cert-lifetime", "6s")
    agent = cluster.start_agent("e")
    cert = pki.load_cert(cluster.agent_state_dir("e") / "tls" / pki.NODE_CERT)
    agent.kill()
    wait_until(lambda: datetime.datetime.now(datetime.timezone.utc) > cert.not_valid_after_utc, 20,
               what="the certificate to expire")
    again = cluster.start_agent("e", wait=False)  # the same flags: the join token file is still there
    assert again.proc.wait(timeout=30) == 2
    assert "tfcluster token create --node e" in again.log() and again.log().count("joined the cluster") == 1


def test_the_join_token_is_never_on_a_command_line(cluster):
    agent = psutil.Process(cluster.agents["a"].proc.pid)
    assert cluster.join_token not in " ".join(agent.cmdline())
    result = cluster.cli("agent", "--coordinator", cluster.address, "--join", cluster.join_token)
    assert result.returncode == 2 and "--join-token-file" in result.stderr and "visible" in result.stderr
