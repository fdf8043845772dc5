"""Trust over real TLS, as an operator and an attacker meet it: the coordinator speaks mutual TLS 1.3 only;
certificates of another CA, expired ones and revoked ones are refused; a node acts for itself only; a viewer
reads but cannot change anything; nodes join with a token (single use, expiring, bound to a name, the CA
pinned by hash) and renew their certificates by themselves; job ids never repeat, even after the
coordinator's state is lost."""

from __future__ import annotations

import socket
import ssl
import sys
import threading
import time

import grpc
import pytest

from harness import Daemon, job_processes, port_block, wait_until
from tfcluster import pki
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc, control_pb2, control_pb2_grpc, types_pb2
from tfcluster.security import Credentials

PY = sys.executable
EXIT_REFUSED = 78


@pytest.fixture
def cluster(make_cluster):
    cluster = make_cluster()
    cluster.start_agent("a")
    return cluster


def get_status(channel: grpc.Channel) -> control_pb2.GetStatusResponse:
    return control_pb2_grpc.ControlServiceStub(channel).GetStatus(control_pb2.GetStatusRequest(), timeout=5)


def refused(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def node_info(name: str, cluster) -> types_pb2.NodeInfo:
    first, last = cluster.port_ranges.get(name, (29900, 29999))
    return types_pb2.NodeInfo(name=name, address="127.0.0.1", port_range_start=first + 1, port_range_end=last,
                              peer_port=first, state_dir=f"/var/lib/{name}")


def tls_handshake(cluster, credentials: Credentials | None, version: ssl.TLSVersion) -> str:
    """The TLS version a handshake with the coordinator settles on; raises ssl.SSLError when it fails."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata=(cluster.ca_dir / pki.CA_CERT).read_text())
    context.maximum_version = version
    context.set_alpn_protocols(["h2"])
    if credentials is not None:
        context.load_cert_chain(cluster.admin_dir / pki.CLIENT_CERT, cluster.admin_dir / pki.CLIENT_KEY)
    host, port = cluster.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # a TLS 1.3 server checks the client's certificate
        if not tls.recv(1):                                  # after the handshake: read to see its verdict
            raise ConnectionError("the coordinator closed the connection")
        return tls.version()


def test_the_coordinator_speaks_mutual_tls_only(cluster):
    with grpc.insecure_channel(cluster.address) as plain:
        assert refused(lambda: get_status(plain)) == grpc.StatusCode.UNAVAILABLE, "plain text fails"
    assert tls_handshake(cluster, cluster.credentials(), ssl.TLSVersion.TLSv1_3) == "TLSv1.3"
    with pytest.raises((ssl.SSLError, ConnectionError)):
        tls_handshake(cluster, None, ssl.TLSVersion.TLSv1_3)  # no client certificate: no connection
    result = cluster.cli("status", env={"TFCLUSTER_TLS_DIR": ""})
    assert result.returncode == 1 and "give --tls-dir or TFCLUSTER_TLS_DIR" in result.stderr


class Tls12Proxy:
    """Plain text in, TLS 1.2 (with the admin's certificate) out: a gRPC client that would settle for TLS 1.2,
    which grpcio itself cannot be made to be."""

    def __init__(self, cluster):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(cadata=(cluster.ca_dir / pki.CA_CERT).read_text())
        context.load_cert_chain(cluster.admin_dir / pki.CLIENT_CERT, cluster.admin_dir / pki.CLIENT_KEY)
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["h2"])
        self.context, self.target = context, cluster.address.rsplit(":", 1)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.versions: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = self.context.wrap_socket(socket.create_connection((self.target[0], int(self.target[1]))),
                                                server_hostname=self.target[0])
            self.versions.append(upstream.version())
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source, sink) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def test_a_call_over_tls_1_2_is_refused_even_with_a_good_certificate(cluster):
    proxy = Tls12Proxy(cluster)
    try:
        with grpc.insecure_channel(proxy.address) as channel:
            with pytest.raises(grpc.RpcError) as info:
                get_status(channel)
        assert proxy.versions and set(proxy.versions) == {"TLSv1.2"}, "the handshake itself was TLS 1.2"
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and "TLS 1.3" in info.value.details()
    finally:
        proxy.close()
    assert get_status(cluster.channel()).summary.nodes_by_state["READY"] == 1, "TLS 1.3 callers are served"


def test_certificates_of_another_ca_or_expired_or_of_the_wrong_role_are_refused(cluster, tmp_path):
    pki.init_ca(tmp_path / "other", [])
    stranger = Credentials.from_dir(tmp_path / "other" / "admin")
    with stranger.channel(cluster.address) as channel:
        assert refused(lambda: get_status(channel)) == grpc.StatusCode.UNAVAILABLE
    result = cluster.cli("status", env={"TFCLUSTER_TLS_DIR": str(tmp_path / "other" / "admin")})
    assert result.returncode == 1 and "cannot reach the coordinator" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
    with cluster.credentials("admin", "old", valid_hours=-1).channel(cluster.address) as channel:
        assert refused(lambda: get_status(channel)) == grpc.StatusCode.UNAVAILABLE, "expired"
    with cluster.channel("node", "a") as channel:
        with pytest.raises(grpc.RpcError) as info:
            get_status(channel)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "node 'a' may not call GetStatus" in \
            info.value.details()
    with cluster.channel("admin", "ops") as channel:  # a role may call what it may call, whoever holds it
        with pytest.raises(grpc.RpcError) as info:
            agent_pb2_grpc.AgentServiceStub(channel).Register(agent_pb2.RegisterRequest(
                node=node_info("ops", cluster)), timeout=5)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "ops" not in {n["name"] for n in cluster.status()["nodes"]}


def test_a_node_acts_for_itself_only(cluster):
    cluster.start_agent("b")
    job_id = cluster.cli("start", "--name", "mine", "--strategy", "mirrored", "--", "sleep", "60",
                         check=True).stdout.strip()
    task = wait_until(lambda: (lambda t: t if t["state"] == "RUNNING" else None)(cluster.job(job_id)["tasks"][0]),
                      20, what="RUNNING")
    victim = task["node"]
    with cluster.channel("node", "mallory") as channel:
        agents = agent_pb2_grpc.AgentServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            agents.Register(agent_pb2.RegisterRequest(node=node_info(victim, cluster)), timeout=5)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert f"node 'mallory' may not act for node '{victim}'" in info.value.details()
        stream = agents.Connect(iter([agent_pb2.AgentMessage(open=agent_pb2.StreamOpen(node_name=victim))]))
        with pytest.raises(grpc.RpcError) as info:
            next(stream)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # Its own registration, reporting the victim's task as its own: ignored.
        fake_exit = types_pb2.TaskReport(job_id=job_id, task_type="worker", task_index=0, attempt=1,
                                         phase=types_pb2.TASK_PHASE_EXITED, exit_code=0)
        agents.Register(agent_pb2.RegisterRequest(node=node_info("mallory", cluster), tasks=[fake_exit]), timeout=5)
    time.sleep(1.0)
    job = cluster.job(job_id)
    assert job["state"] == "RUNNING" and job["tasks"][0]["node"] == victim and job["tasks"][0]["attempt"] == 1
    assert cluster.node_state(victim) == "READY"
    cluster.cli("stop", job_id, "--now", check=True)


def test_a_viewer_reads_but_cannot_start_stop_or_admit(cluster, tmp_path):
    job_id = cluster.cli("start", "--name", "watched", "--strategy", "mirrored", "--wait", "--", "echo", "hi",
                         check=True).stdout.strip()
    made = cluster.cli("ca", "issue", "--dir", str(cluster.ca_dir), "--name", "bob", "--role", "viewer", "--out",
                       str(tmp_path / "bob"), check=True)
    assert "viewer credentials for 'bob'" in made.stdout
    assert oct((tmp_path / "bob" / pki.CLIENT_KEY).stat().st_mode & 0o777) == "0o600"
    bob = {"TFCLUSTER_TLS_DIR": str(tmp_path / "bob")}
    assert cluster.cli("status", env=bob, check=True).returncode == 0
    assert cluster.cli("logs", job_id, "worker:0", env=bob, check=True).stdout == "hi\n"
    for args, call in ((("start", "--name", "x", "--strategy", "mirrored", "--", "id"), "SubmitJob"),
                       (("stop", job_id), "StopJob"), (("token", "create"), "CreateJoinToken"),
                       (("node", "remove", "a"), "RemoveNode")):
        result = cluster.cli(*args, env=bob)
        assert result.returncode == 1, args
        assert f"viewer 'bob' may not call {call}" in result.stderr and "Traceback" not in result.stderr
    assert [j["id"] for j in cluster.status()["jobs"]] == [job_id] and cluster.node_state("a") == "READY"


def join_agent(cluster, name: str, *trust: str, wait: bool = True) -> Daemon:
    """An agent that joins with the given flags (not the cluster's own reusable token)."""
    base = port_block()
    state = cluster.agent_state_dir(name)
    state.mkdir(parents=True, exist_ok=True)
    cluster.port_ranges[name] = (base, base + 9)
    daemon = cluster.agents[name] = Daemon(name, [
        "agent", "--coordinator", cluster.address, "--name", name, "--advertise-address", "127.0.0.1",
        "--port-range", f"{base}-{base + 9}", "--state-dir", str(state), "--gpu-inventory", "none",
        "--join-address", cluster.join_address, *trust], cluster.root / f"agent-{name}.log").start()
    if wait:
        wait_until(lambda: cluster.node_state(name) == "READY", 30, what=f"{name} to join")
    return daemon


def new_token(cluster, *args: str) -> str:
    return cluster.cli("token", "create", *args, check=True).stdout.strip()


def token_file(cluster, token: str) -> list[str]:
    """The flags of an agent that joins with this token (read from a file: never on its command line)."""
    return ["--join-token-file", str(cluster.join_token_file(token))]


def test_joining_with_a_token_single_use_expiring_bound_and_pinned(cluster):
    ca_cert = str(cluster.ca_dir / pki.CA_CERT)
    once = new_token(cluster)
    join_agent(cluster, "j1", *token_file(cluster, once), "--ca-cert", ca_cert)
    tls = cluster.agent_state_dir("j1") / "tls"
    assert oct(tls.stat().st_mode & 0o777) == "0o700"
    assert oct((tls / pki.NODE_KEY).stat().st_mode & 0o777) == "0o600"
    who = pki.identity(pki.load_cert(tls / pki.NODE_CERT))
    assert (who.role, who.name) == ("node", "j1")
    short = new_token(cluster, "--ttl", "1s")
    bound = new_token(cluster, "--node", "someone-else")
    time.sleep(1.5)
    for name, token, needle in (("j2", once, "used already"), ("j3", short, "expired"),
                                ("j4", bound, "is for node 'someone-else'"), ("j5", "abc.def", "unknown join token")):
        agent = join_agent(cluster, name, *token_file(cluster, token), "--ca-cert", ca_cert, wait=False)
        assert agent.proc.wait(timeout=30) == 2, agent.log()
        assert needle in agent.log() and "Traceback" not in agent.log()
        assert not (cluster.agent_state_dir(name) / "tls" / pki.NODE_CERT).exists()
    pinned = pki.ca_hash(pki.load_cert(cluster.ca_dir / pki.CA_CERT))
    wrong = "sha256:" + "0" * 64
    agent = join_agent(cluster, "j6", *token_file(cluster, new_token(cluster)), "--ca-hash", wrong, wait=False)
    assert agent.proc.wait(timeout=30) == 2 and "no CA with the pinned hash" in agent.log()
    join_agent(cluster, "j7", *token_file(cluster, new_token(cluster)), "--ca-hash", pinned)
    # A restart needs no token: the node's certificate is kept in its state dir.
    cluster.agents["j1"].kill()
    join_agent(cluster, "j1")
    assert cluster.agents["j1"].log().count("joined the cluster through") == 1


def test_a_removed_node_is_refused_from_then_on(cluster):
    job_id = cluster.cli("start", "--name", "on-a", "--strategy", "mirrored", "--max-restarts", "0", "--",
                         "sleep", "60", check=True).stdout.strip()
    wait_until(lambda: cluster.job(job_id)["state"] == "RUNNING", 20, what="RUNNING")
    kept = Credentials.from_dir(cluster.agent_state_dir("a") / "tls", pki.NODE_CERT, pki.NODE_KEY)
    result = cluster.cli("node", "remove", "a", check=True)
    assert "node a removed; 1 running task(s) lost" in result.stdout
    assert cluster.agents["a"].proc.wait(timeout=30) == EXIT_REFUSED
    assert "was removed from the cluster" in cluster.agents["a"].log()
    assert "a" not in {n["name"] for n in cluster.status()["nodes"]}
    assert cluster.job(job_id)["state"] == "FAILED"
    with kept.channel(cluster.address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            agent_pb2_grpc.AgentServiceStub(channel).Register(agent_pb2.RegisterRequest(
                node=node_info("a", cluster)), timeout=5)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "removed" in info.value.details()
    wait_until(lambda: job_processes(job_id) == [], 20, what="the removed node's task to be stopped")
    result = cluster.cli("node", "remove", "nobody")
    assert result.returncode == 1 and "unknown node 'nobody'" in result.stderr


def test_node_certificates_are_renewed_before_they_expire(make_cluster, tmp_path):
    cluster = make_cluster(3.0, "--node-cert-lifetime", "6s")
    cluster.start_agent("a")
    cluster.start_agent("b")
    first = (cluster.agent_state_dir("a") / "tls" / pki.NODE_CERT).read_bytes()
    from test_shipping import TRAINER, shipping_job
    slow_trainer = TRAINER.replace("time.sleep(0.3)", "time.sleep(4)")  # ships across renewals
    job_id = shipping_job(cluster, tmp_path, "renewing", slow_trainer)
    job = cluster.job(job_id)
    assert job["state"] == "SUCCEEDED" and job["restarts"] == 0, job["message"]
    assert job["evaluation"]["latest"]["checkpoint"].endswith("ckpt-3"), "shipped with renewed certificates"
    for name in ("a", "b"):
        assert cluster.agents[name].log().count("renewed the node's certificate") >= 2
        assert cluster.node_state(name) == "READY"
    assert (cluster.agent_state_dir("a") / "tls" / pki.NODE_CERT).read_bytes() != first


def test_job_ids_never_repeat_even_after_the_state_is_lost(cluster):
    first = cluster.cli("start", "--name", "same", "--strategy", "mirrored", "--wait", "--", "echo", "first",
                        check=True).stdout.strip()
    cluster.coordinator.kill()
    import shutil
    shutil.rmtree(cluster.root / "coordinator")
    cluster.start_coordinator()
    wait_until(lambda: cluster.node_state("a") == "READY", 30, what="the agent back")
    second = cluster.cli("start", "--name", "same", "--strategy", "mirrored", "--", "sh", "-c",
                         "sleep 1; echo second", check=True).stdout.strip()
    assert second.split("-")[:2] == first.split("-")[:2] == ["same", "1"] and second != first, \
        "numbered from 1 again, told apart by the cluster's tag"
    assert cluster.job(second)["state"] in ("STARTING", "RUNNING"), "not the old job's result"
    assert cluster.wait_job(second)["state"] == "SUCCEEDED"
    assert cluster.cli("logs", second, "worker:0", check=True).stdout == "second\n"


def test_a_node_started_while_the_coordinator_is_down_joins_once_it_is_back(cluster):
    token = new_token(cluster)
    cluster.coordinator.terminate()
    early = join_agent(cluster, "early", *token_file(cluster, token), "--ca-cert", str(cluster.ca_dir / pki.CA_CERT),
                       wait=False)
    wait_until(lambda: "retrying" in early.log(), 30, what="the agent to wait for the join port")
    assert early.alive, "a join port that does not answer yet is no reason to give up"
    cluster.start_coordinator()
    wait_until(lambda: cluster.node_state("early") == "READY", 60, what="the node to join and register")
