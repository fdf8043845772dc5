"""Every RPC handler under random field values (bounded property-based fuzzing, over the real TLS listeners):
each call succeeds or fails with a clean status naming the problem; the coordinator and the agent never
crash and log no traceback; afterwards the coordinator still answers and a good job still succeeds."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import running_cluster
from tfcluster import pki
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc, control_pb2, control_pb2_grpc, types_pb2 as pb

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
CLEAN = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED,
         grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.RESOURCE_EXHAUSTED,
         grpc.StatusCode.DATA_LOSS, grpc.StatusCode.UNAUTHENTICATED}
FUZZ_NODE = "fuzz"

NASTY = st.sampled_from(["", "\0", "a\n", "\x1b[2J", "../..", "/", "x" * 5000, "worker", "chief", "ps",
                         "evaluator", "a", FUZZ_NODE, "127.0.0.1", "0.0.0.0", "::1", "/tmp", "m.n:f", "READY"])
TEXT = st.one_of(NASTY, st.text(max_size=20))
UINT32 = st.one_of(st.integers(0, 8), st.integers(0, 2**32 - 1))
INT32 = st.integers(-2**31, 2**31 - 1)
UINT64 = st.one_of(st.integers(0, 8), st.integers(0, 2**64 - 1))
DOUBLE = st.one_of(st.floats(0, 100), st.floats())
SAFE_COMMAND = st.one_of(st.just(["true"]), st.lists(TEXT, max_size=2).map(lambda args: ["/bin/echo", *args]))


def mostly(good, bad):
    """Nine times in ten a good value (so that a call gets past the first check), else anything."""
    return st.integers(0, 9).flatmap(lambda i: bad if i == 0 else good)


def role(command) -> st.SearchStrategy:
    return st.builds(lambda count, gpus, cmd, env, nodes, entrypoint, has_gpus: pb.RoleSpec(
        count=count, command=cmd, env=env, nodes=nodes, entrypoint=entrypoint, **({"gpus": gpus} if has_gpus else {})),
        mostly(st.integers(0, 2), UINT32), mostly(st.just(0), UINT32), mostly(st.just([]), command),
        mostly(st.just({}), st.dictionaries(TEXT, TEXT, max_size=2)), mostly(st.just([]), st.lists(TEXT, max_size=2)),
        mostly(st.just(""), TEXT), st.booleans())


def job_spec(command) -> st.SearchStrategy:
    """A JobSpec, mostly valid, with any field's value anything at all; command: what its commands may be."""
    restart = st.builds(pb.RestartPolicy, max_restarts=mostly(st.integers(0, 3), UINT32),
                        backoff_seconds=mostly(st.floats(0, 1), DOUBLE),
                        permanent_exit_codes=mostly(st.just([]), st.lists(INT32, max_size=3)),
                        hang_seconds=mostly(st.just(0.0), DOUBLE))
    roles = mostly(st.fixed_dictionaries({"worker": role(command)}, optional={"evaluator": role(command)}),
                   st.dictionaries(st.one_of(st.sampled_from(["chief", "worker", "ps", "evaluator"]), TEXT),
                                   role(command), max_size=4))
    return st.builds(lambda roles, optional, **fields: pb.JobSpec(roles=roles, **fields, **optional),
                     roles=roles, restart=restart,
                     optional=st.fixed_dictionaries({}, optional={"stop_grace_seconds": DOUBLE,
                                                                  "evaluator_deadline_seconds": DOUBLE}),
                     name=mostly(st.just("fz"), TEXT),
                     strategy=mostly(st.sampled_from(["mirrored", "multi_worker_mirrored", "auto"]), TEXT),
                     command=mostly(st.just(["true"]), command), workdir=mostly(st.just("/tmp"), TEXT),
                     checkpoint_dir=mostly(st.just(""), TEXT), model_dir=mostly(st.just(""), TEXT),
                     env=mostly(st.just({"A": "1"}), st.dictionaries(TEXT, TEXT, max_size=3)),
                     gpus=mostly(st.just(0), UINT32))


def clean(call) -> None:
    try:
        result = call()
        if hasattr(result, "__iter__") and not hasattr(result, "ByteSize"):
            list(result)  # a stream: read it to its end
    except grpc.RpcError as e:
        assert e.code() in CLEAN, (e.code(), e.details())
        assert e.details(), "a refusal says why"


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("fuzz"), {"a": {}}) as cluster:
        admin, node = cluster.channel(), cluster.channel("node", FUZZ_NODE)
        yield cluster, control_pb2_grpc.ControlServiceStub(admin), agent_pb2_grpc.AgentServiceStub(node)
        admin.close()
        node.close()


@FUZZ
@given(spec=job_spec(st.lists(TEXT, max_size=3)))
def test_plan_takes_any_spec(fuzzed, spec):
    _, control, _ = fuzzed
    clean(lambda: control.PlanJob(control_pb2.PlanJobRequest(spec=spec), timeout=10))


@FUZZ
@given(spec=job_spec(SAFE_COMMAND), request_id=mostly(st.uuids().map(str), TEXT))
def test_submit_takes_any_spec(fuzzed, spec, request_id):
    _, control, _ = fuzzed
    clean(lambda: control.SubmitJob(control_pb2.SubmitJobRequest(spec=spec, client_request_id=request_id), timeout=10))


@FUZZ
@given(data=st.data())
def test_the_reading_and_admin_calls_take_any_fields(fuzzed, data):
    _, control, _ = fuzzed
    job_id = data.draw(st.one_of(TEXT, st.just("fz-1")))
    calls = {
        "status": lambda: control.GetStatus(control_pb2.GetStatusRequest(job_id=job_id), timeout=10),
        "nodes": lambda: control.ListNodes(control_pb2.ListNodesRequest(
            page_size=data.draw(UINT32), page_token=data.draw(TEXT), state=data.draw(TEXT),
            name_prefix=data.draw(TEXT)), timeout=10),
        "jobs": lambda: control.ListJobs(control_pb2.ListJobsRequest(
            page_size=data.draw(UINT32), page_token=data.draw(TEXT), states=data.draw(st.lists(TEXT, max_size=3)),
            name=data.draw(TEXT), node=data.draw(TEXT)), timeout=10),
        "logs": lambda: control.StreamLogs(control_pb2.StreamLogsRequest(
            job_id=job_id, task_type=data.draw(TEXT), task_index=data.draw(UINT32), tail_lines=data.draw(UINT32),
            attempt=data.draw(UINT32)), timeout=10),
        "stop": lambda: control.StopJob(control_pb2.StopJobRequest(job_id=job_id, graceful=data.draw(st.booleans())),
                                        timeout=10),
        "token": lambda: control.CreateJoinToken(control_pb2.CreateJoinTokenRequest(
            ttl_seconds=data.draw(DOUBLE), node=data.draw(TEXT), reusable=data.draw(st.booleans())), timeout=10),
        "remove": lambda: control.RemoveNode(control_pb2.RemoveNodeRequest(
            name=data.draw(TEXT.filter(lambda name: name != "a"))), timeout=10),
        "usage": lambda: control.GetUsage(control_pb2.GetUsageRequest(window_seconds=data.draw(DOUBLE)), timeout=10),
    }
    clean(calls[data.draw(st.sampled_from(sorted(calls)))])


def node_info() -> st.SearchStrategy:
    gpu = st.builds(pb.Gpu, index=UINT32, uuid=TEXT, name=TEXT, memory_mib=UINT64)
    return st.builds(pb.NodeInfo, name=st.one_of(st.just(FUZZ_NODE), TEXT),
                     address=st.one_of(st.just("10.9.8.7"), TEXT), hostname=TEXT,
                     port_range_start=st.one_of(st.just(40001), UINT32),
                     port_range_end=st.one_of(st.just(40099), UINT32),
                     cpu_count=UINT32, memory_bytes=UINT64, gpus=st.lists(gpu, max_size=3), agent_version=TEXT,
                     state_dir=st.one_of(st.just("/var/lib/fuzz"), TEXT), peer_port=st.one_of(st.just(40000), UINT32))


def task_report() -> st.SearchStrategy:
    return st.builds(lambda has_code, **f: pb.TaskReport(**f, **({"exit_code": 0} if has_code else {})),
                     has_code=st.booleans(), job_id=st.one_of(st.just("fz-1"), TEXT), task_type=TEXT,
                     task_index=UINT32, attempt=UINT32, phase=st.integers(0, 5), pid=INT32, message=TEXT,
                     log_tail=st.lists(TEXT, max_size=3), busy_port=UINT32, listening=st.booleans(),
                     final_checkpoint=TEXT)


def agent_message() -> st.SearchStrategy:
    progress = st.builds(agent_pb2.TaskProgress, job_id=TEXT, task_type=TEXT, task_index=UINT32, attempt=UINT32,
                         output_bytes=UINT64, checkpoint=TEXT)
    evaluation = st.builds(pb.Evaluation, job_id=TEXT, task_type=TEXT, task_index=UINT32, attempt=UINT32,
                           checkpoint=TEXT, step=st.integers(-2**63, 2**63 - 1),
                           metrics=st.dictionaries(TEXT, st.floats(), max_size=3), time=DOUBLE)
    return st.one_of(
        st.builds(lambda p, c: agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(progress=p, condition=c)),
                  st.lists(progress, max_size=3), TEXT),
        st.builds(lambda t: agent_pb2.AgentMessage(task=t), task_report()),
        st.builds(lambda e: agent_pb2.AgentMessage(evaluation=e), evaluation),
        st.builds(lambda d: agent_pb2.AgentMessage(log=d), st.builds(agent_pb2.LogData, request_id=UINT64,
                                                                     data=st.binary(max_size=64), eof=st.booleans(),
                                                                     error=TEXT)),
        st.builds(lambda d: agent_pb2.AgentMessage(sync_done=d), st.builds(
            agent_pb2.SyncDone, job_id=TEXT, sync_id=UINT64, ok=st.booleans(), message=TEXT, bytes=UINT64,
            seconds=DOUBLE)),
        st.builds(lambda o: agent_pb2.AgentMessage(open=o), st.builds(agent_pb2.StreamOpen, node_name=TEXT,
                                                                      session_id=TEXT)),
    )


@FUZZ
@given(info=node_info(), tasks=st.lists(task_report(), max_size=3))
def test_register_takes_any_node(fuzzed, info, tasks):
    _, _, agents = fuzzed
    clean(lambda: agents.Register(agent_pb2.RegisterRequest(node=info, tasks=tasks), timeout=10))


@FUZZ
@given(messages=st.lists(agent_message(), min_size=1, max_size=6), csr=st.binary(max_size=200))
def test_an_agent_stream_takes_any_messages(fuzzed, messages, csr):
    _, _, agents = fuzzed
    good = pb.NodeInfo(name=FUZZ_NODE, address="10.9.8.7", port_range_start=40001, port_range_end=40099,
                       peer_port=40000, state_dir="/var/lib/fuzz")
    session = agents.Register(agent_pb2.RegisterRequest(node=good), timeout=10).session_id
    opening = agent_pb2.AgentMessage(open=agent_pb2.StreamOpen(node_name=FUZZ_NODE, session_id=session))
    heartbeat = agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(session_id=session))
    for message in messages:  # heartbeats of this session, so that the stream lives on to read the next
        if message.HasField("heartbeat"):
            message.heartbeat.session_id = session
    call = agents.Connect(iter([opening, *messages, heartbeat]), timeout=2)
    try:
        list(call)
    except grpc.RpcError as e:
        assert e.code() in CLEAN | {grpc.StatusCode.DEADLINE_EXCEEDED}, (e.code(), e.details())
    clean(lambda: agents.RenewCertificate(agent_pb2.RenewCertificateRequest(csr=csr), timeout=10))


@FUZZ
@given(job_ids=st.one_of(st.lists(TEXT, max_size=5), st.just(["fz-1"] * 1001)))
def test_ended_jobs_takes_any_ids(fuzzed, job_ids):
    _, _, agents = fuzzed
    clean(lambda: agents.EndedJobs(agent_pb2.EndedJobsRequest(job_ids=job_ids), timeout=10))


@FUZZ
@given(token=TEXT, name=TEXT, csr=st.binary(max_size=300))
def test_join_takes_anything(fuzzed, token, name, csr):
    cluster, _, _ = fuzzed
    ca = (cluster.ca_dir / "ca.crt").read_bytes()
    with grpc.secure_channel(cluster.join_address, grpc.ssl_channel_credentials(root_certificates=ca)) as channel:
        clean(lambda: agent_pb2_grpc.JoinServiceStub(channel).Join(
            agent_pb2.JoinRequest(token=token, node_name=name, csr=csr), timeout=10))


@FUZZ
@given(chunks=st.lists(st.builds(agent_pb2.FileChunk, job_id=TEXT, path=TEXT, data=st.binary(max_size=64),
                                 end_of_file=st.booleans(), sha256=TEXT, commit=st.booleans()), max_size=4))
def test_the_peer_port_takes_any_chunks(fuzzed, chunks):
    cluster, _, _ = fuzzed
    with cluster.credentials("node", FUZZ_NODE).channel(f"127.0.0.1:{cluster.port_ranges['a'][0]}",
                                                        server_name=pki.node_server_name("a")) as channel:
        clean(lambda: agent_pb2_grpc.AgentPeerServiceStub(channel).PutFiles(iter(chunks), timeout=10))


def test_after_all_of_it_the_cluster_still_works(fuzzed, tmp_path):
    cluster, control, _ = fuzzed
    for job in control.GetStatus(control_pb2.GetStatusRequest(), timeout=10).jobs:
        if job.state not in ("SUCCEEDED", "FAILED", "STOPPED"):
            control.StopJob(control_pb2.StopJobRequest(job_id=job.id, graceful=False), timeout=10)
    assert cluster.coordinator.alive and cluster.agents["a"].alive
    spec = tmp_path / "good.toml"
    spec.write_text('name = "good"\nstrategy = "mirrored"\ncommand = ["sh", "-c", "echo fine"]\n'
                    '[roles.worker]\nnodes = ["a"]\n')
    job_id = cluster.cli("start", str(spec), "--wait", check=True, timeout=60).stdout.strip()
    assert cluster.cli("logs", job_id, "worker:0", check=True).stdout == "fine\n"
    for daemon in (cluster.coordinator, cluster.agents["a"]):
        log = daemon.log()
        assert "Traceback" not in log and "failed to handle" not in log, log[-3000:]
