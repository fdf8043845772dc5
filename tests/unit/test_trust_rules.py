"""Who may call what, and join tokens, without sockets: every RPC of the API has a policy entry; the gate's
verdicts by role, TLS version and removal; tokens single use, bound, expiring; certificates from the CA."""

from __future__ import annotations

import datetime

import grpc
import pytest

from tfcluster import pki
from tfcluster.api.v1 import agent_pb2, control_pb2
from tfcluster.daemon.coordinator.trust import EXPIRED_KEPT_SECONDS, TokenRefused, Trust
from tfcluster.pki import Identity
from tfcluster.security import POLICY, Gate, Refused


def methods() -> list[str]:
    found = []
    for module in (agent_pb2, control_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            found += [f"/{service.full_name}/{m.name}" for m in service.methods]
    return found


def test_every_rpc_of_the_api_has_a_policy():
    assert sorted(methods()) == sorted(POLICY), "a new RPC needs its line in security.POLICY"


def auth(role: str | None, name: str = "x", version: bytes = b"TLSv1.3") -> dict:
    ca = pki.Authority.create()
    context = {"ssl_tls_version": [version]}
    if role is not None:
        _, cert = ca.issue(name, role, datetime.timedelta(hours=1))
        context["x509_pem_cert"] = [cert]
    return context


@pytest.mark.parametrize("method, role, allowed", [
    ("/tfcluster.v1.ControlService/SubmitJob", "admin", True),
    ("/tfcluster.v1.ControlService/SubmitJob", "viewer", False),
    ("/tfcluster.v1.ControlService/SubmitJob", "node", False),
    ("/tfcluster.v1.ControlService/GetStatus", "viewer", True),
    ("/tfcluster.v1.ControlService/StreamLogs", "viewer", True),
    ("/tfcluster.v1.ControlService/CreateJoinToken", "viewer", False),
    ("/tfcluster.v1.AgentService/Register", "node", True),
    ("/tfcluster.v1.AgentService/Register", "admin", False),
    ("/tfcluster.v1.AgentPeerService/PutFiles", "node", True),
    ("/tfcluster.v1.AgentPeerService/PutFiles", "admin", False),
    ("/tfcluster.v1.JoinService/Join", None, True),
    ("/tfcluster.v1.AgentService/Register", None, False),
    ("/tfcluster.v1.ControlService/GetStatus", None, False),
])
def test_the_gate_follows_the_role_in_the_certificate(method, role, allowed):
    if allowed:
        Gate().check(method, auth(role))
    else:
        with pytest.raises(Refused) as info:
            Gate().check(method, auth(role))
        assert info.value.code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)


def test_the_gate_refuses_older_tls_unknown_methods_and_removed_holders():
    with pytest.raises(Refused, match="TLS 1.3 is required"):
        Gate().check("/tfcluster.v1.ControlService/GetStatus", auth("admin", version=b"TLSv1.2"))
    with pytest.raises(Refused, match="no such call"):
        Gate().check("/tfcluster.v1.ControlService/Nope", auth("admin"))
    assert Gate().check("/grpc.health.v1.Health/Check", {}) is None, "probes carry no certificate"
    gone = Gate(is_revoked=lambda who: who.name == "n1")
    with pytest.raises(Refused, match="was removed from the cluster"):
        gone.check("/tfcluster.v1.AgentService/Register", auth("node", "n1"))
    assert gone.check("/tfcluster.v1.AgentService/Register", auth("node", "n2")).name == "n2"


def test_a_join_token_is_single_use_bound_and_expires():
    trust, ca = Trust(), pki.Authority.create()
    token, record = trust.create_token(now=1000.0, ttl=60.0)
    assert record.secret_hash not in token and token.split(".")[1] not in repr(record), "only the hash is kept"
    _, csr = pki.new_csr("n1", "10.0.0.1")
    cert = trust.join(token, "n1", csr, ca, 1010.0, datetime.timedelta(hours=1))
    assert pki.identity(pki.x509.load_pem_x509_certificate(cert)).name == "n1"
    with pytest.raises(TokenRefused, match="used already"):
        trust.join(token, "n2", csr, ca, 1020.0, datetime.timedelta(hours=1))
    bound, _ = trust.create_token(now=1000.0, node="n3")
    with pytest.raises(TokenRefused, match="is for node 'n3'"):
        trust.check(bound, "n4", 1001.0)
    short, _ = trust.create_token(now=1000.0, ttl=5.0, reusable=True)
    with pytest.raises(TokenRefused, match="expired"):
        trust.check(short, "n5", 1006.0)
    with pytest.raises(TokenRefused, match="unknown"):
        trust.check(short.split(".")[0] + ".wrong", "n5", 1001.0)
    trust.expire(1006.0)
    assert short.split(".")[0] in trust.tokens, "kept a while, to say why it is refused"
    trust.expire(1006.0 + EXPIRED_KEPT_SECONDS)
    assert short.split(".")[0] not in trust.tokens
    for ttl in (-1.0, float("nan"), float("inf"), 31 * 86400.0):
        with pytest.raises(ValueError, match="ttl_seconds"):
            trust.create_token(now=0.0, ttl=ttl)


def test_a_bad_request_leaves_the_token_unused():
    trust, ca = Trust(), pki.Authority.create()
    token, record = trust.create_token(now=0.0)
    with pytest.raises(pki.PkiError, match="csr"):
        trust.join(token, "n1", b"not a csr", ca, 1.0, datetime.timedelta(hours=1))
    assert record.used == 0


def test_a_removed_node_is_refused_until_it_joins_again():
    trust = Trust()
    trust.remove("n1", now=100.0)
    assert trust.is_removed(Identity("node", "n1", issued=50.0))
    assert not trust.is_removed(Identity("node", "n1", issued=150.0)), "a certificate from joining again"
    assert not trust.is_removed(Identity("admin", "n1", issued=50.0)), "a person of the same name is not a node"


def test_node_certificates_name_the_node_and_only_the_csrs_addresses():
    ca = pki.Authority.create()
    _, csr = pki.new_csr("gpu01", "10.0.0.11")
    cert = pki.x509.load_pem_x509_certificate(ca.sign_node(csr, "gpu01", datetime.timedelta(hours=24)))
    who = pki.identity(cert)
    assert (who.role, who.name) == ("node", "gpu01")
    sans = cert.extensions.get_extension_for_class(pki.x509.SubjectAlternativeName).value
    assert [str(a) for a in sans.get_values_for_type(pki.x509.IPAddress)] == ["10.0.0.11"]
    ca.verify(cert)
    with pytest.raises(pki.PkiError, match="not signed by this cluster's CA"):
        pki.Authority.create().verify(cert)
    with pytest.raises(pki.PkiError, match="node name"):
        ca.sign_node(csr, "bad name\n")
