"""The bound on each method's requests, checked on the raw bytes before they are decoded, and the join port's
rate per source: a bucket per address, refilled over time, in bounded memory."""

from __future__ import annotations

import grpc
import pytest

from tfcluster import security, wire
from tfcluster.api.v1 import agent_pb2, control_pb2, types_pb2 as pb
from tfcluster.daemon.coordinator.rpc.join_port import JOIN_MAX_BYTES, JoinLimiter, source_of
from tfcluster.security import MAX_REQUEST_BYTES, POLICY, Messages

GET_STATUS, JOIN = security.CONTROL + "GetStatus", security.JOIN + "Join"


def test_every_method_has_a_bound_and_the_server_takes_the_largest():
    assert all(0 < rule.max_request_bytes <= MAX_REQUEST_BYTES for rule in POLICY.values())
    assert MAX_REQUEST_BYTES == max(rule.max_request_bytes for rule in POLICY.values()) == 16 << 20
    assert JOIN_MAX_BYTES == POLICY[JOIN].max_request_bytes == 16 << 10


def test_a_request_over_its_bound_is_refused_naming_the_method_and_the_bound_and_not_decoded():
    decoded = []
    messages = Messages(GET_STATUS, lambda raw: decoded.append(raw) or raw)
    message, refused = messages.take(b"x" * (16 * 1024 + 1))
    assert message is None and refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(refused) == "GetStatus: a request message of 16385 bytes is over this call's bound of 16384 bytes"
    assert decoded == []


def test_junk_is_invalid_argument_naming_the_method():
    message, refused = Messages(JOIN, agent_pb2.JoinRequest.FromString).take(b"\x1a\xff\xff\xff\xff\x0f")
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT and str(refused).startswith("Join: not a valid request")


def test_the_largest_legitimate_requests_fit_their_bounds():
    from tfcluster import pki
    _, csr = pki.new_csr("n" * 64)  # a CN holds 64 characters at most
    join = agent_pb2.JoinRequest(token="t" * 64, node_name="n" * 253, csr=csr)
    assert Messages(JOIN, agent_pb2.JoinRequest.FromString).take(join.SerializeToString())[1] is None
    ended = agent_pb2.EndedJobsRequest(job_ids=[f"{'j' * 63}-{n}-k3f9" for n in range(wire.MAX_JOB_IDS)])
    assert ended.ByteSize() <= POLICY[security.AGENT + "EndedJobs"].max_request_bytes
    # A job whose command and env fill Linux's default ARG_MAX (2 MiB) for each of four roles.
    big = {f"V{i}": "v" * 4000 for i in range(120)}
    spec = pb.JobSpec(name="big", command=["python", "x" * 500_000], env=big,
                      roles={r: pb.RoleSpec(count=1, command=["python", "y" * 500_000], env=big)
                             for r in ("chief", "worker", "ps", "evaluator")})
    assert control_pb2.SubmitJobRequest(spec=spec).ByteSize() <= POLICY[security.CONTROL + "SubmitJob"].max_request_bytes
    log = agent_pb2.AgentMessage(log=agent_pb2.LogData(request_id=1, data=b"x" * 65536))
    assert log.ByteSize() <= POLICY[security.AGENT + "Connect"].max_request_bytes


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_joins_from_one_source_get_a_burst_then_a_rate():
    clock = Clock()
    limiter = JoinLimiter(burst=10, rate=1.0, clock=clock)
    assert all(limiter.take("10.0.0.1") for _ in range(10))
    assert not limiter.take("10.0.0.1")
    assert limiter.take("10.0.0.2"), "another source has its own bucket"
    clock.now = 1.0
    assert limiter.take("10.0.0.1") and not limiter.take("10.0.0.1")
    clock.now = 100.0
    assert sum(limiter.take("10.0.0.1") for _ in range(20)) == 10, "a bucket never holds more than the burst"


def test_the_refusal_says_to_retry_later():
    class Context:
        def peer(self):
            return "ipv4:10.0.0.1:5000"
    limiter = JoinLimiter(burst=1, rate=1.0, clock=Clock())
    limiter.admit(Context())
    with pytest.raises(security.Refused, match="too many joins from 10.0.0.1.*retry later") as info:
        limiter.admit(Context())
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_table_of_sources_is_bounded():
    limiter = JoinLimiter(burst=2, rate=0.0, kept=100, clock=Clock())
    for n in range(1000):
        limiter.take(f"10.0.{n // 256}.{n % 256}")
    assert len(limiter.buckets) == 100


@pytest.mark.parametrize("peer, source", [
    ("ipv4:10.0.0.11:52214", "10.0.0.11"),
    ("ipv6:[2001:db8::1]:443", "2001:db8::/64"),
    ("ipv6:%5B2001:db8::2%5D:443", "2001:db8::/64"),
    ("ipv6:[::ffff:10.0.0.1]:9", "10.0.0.1"),
    ("unix:/run/x.sock", "unix:/run/x.sock"),
    ("", "unknown"),
])
def test_a_source_is_an_ipv4_address_or_an_ipv6_slash_64(peer, source):
    assert source_of(peer) == source
