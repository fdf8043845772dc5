"""Who may call what, and who may be in the cluster, without sockets: every RPC of the API has a policy entry;
the gate's verdicts by role, TLS version and revocation; tokens single use, bound, expiring; a node name has one
holder; removal and replacement revoke; the CA decides every name in a certificate."""

from __future__ import annotations

import datetime
import ipaddress
import time

import grpc
import pytest

from tfcluster import pki
from tfcluster.api.v1 import agent_pb2, control_pb2
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tfcluster.daemon.coordinator.core.access.trust import EXPIRED_KEPT_SECONDS, TokenRefused, Trust
from tfcluster.pki import Identity
from tfcluster.pki import REMOVED, REPLACED
from tfcluster.security import POLICY, Gate, Refused

HOUR = datetime.timedelta(hours=1)


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
    gone = Gate(is_revoked=lambda who: REMOVED if who.name == "n1" else "")
    with pytest.raises(Refused, match="was removed from the cluster"):
        gone.check("/tfcluster.v1.AgentService/Register", auth("node", "n1"))
    assert gone.check("/tfcluster.v1.AgentService/Register", auth("node", "n2")).name == "n2"


def identity_of(cert_pem: bytes) -> Identity:
    return pki.identity(x509.load_pem_x509_certificate(cert_pem))


def test_a_join_token_is_single_use_bound_and_expires():
    trust, ca = Trust(), pki.Authority.create()
    token, record = trust.create_token(now=1000.0, ttl=60.0)
    assert record.secret_hash not in token and token.split(".")[1] not in repr(record), "only the hash is kept"
    _, csr = pki.new_csr("n1")
    cert = trust.join(token, "n1", csr, ca, 1010.0, HOUR)
    assert identity_of(cert).name == "n1"
    with pytest.raises(TokenRefused, match="used already"):
        trust.join(token, "n2", csr, ca, 1020.0, HOUR)
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
    with pytest.raises(ValueError, match="names it"):
        trust.create_token(now=0.0, replace=True)


def test_a_bad_request_leaves_the_token_unused():
    trust, ca = Trust(), pki.Authority.create()
    token, record = trust.create_token(now=0.0)
    with pytest.raises(pki.PkiError, match="csr"):
        trust.join(token, "n1", b"not a csr", ca, 1.0, HOUR)
    assert record.used == 0


def test_a_node_name_has_one_holder_unless_an_admin_replaces_it():
    trust, ca = Trust(), pki.Authority.create()
    any_node, _ = trust.create_token(now=0.0, reusable=True, ttl=86400.0)
    _, csr = pki.new_csr("gpu1")
    first = identity_of(trust.join(any_node, "gpu1", csr, ca, 10.0, HOUR))
    with pytest.raises(TokenRefused, match="holds a valid certificate.*--node gpu1 --replace"):
        trust.join(any_node, "gpu1", csr, ca, 20.0, HOUR)
    bound, _ = trust.create_token(now=20.0, node="gpu1")
    with pytest.raises(TokenRefused, match="holds a valid certificate"):
        trust.join(bound, "gpu1", csr, ca, 21.0, HOUR)
    with pytest.raises(TokenRefused, match="holds a valid certificate"):
        trust.join(any_node, "gpu2", csr, ca, 21.0, HOUR, registered="READY")  # READY, its certificate older
    with pytest.raises(TokenRefused, match="held a certificate before: .*--node gpu3"):
        trust.join(any_node, "gpu3", csr, ca, 21.0, HOUR, registered="LOST")  # known, though not to this record
    replace, _ = trust.create_token(now=30.0, node="gpu1", replace=True)
    second = identity_of(trust.join(replace, "gpu1", csr, ca, 30.5, HOUR))
    assert trust.refusal(first) == REPLACED, "the old holder's certificate is refused from then on"
    assert trust.refusal(second) == "", "though made in the same second as the revocation"
    assert trust.revoked() == (("gpu1", 30.5),)


def test_an_expired_holder_comes_back_only_with_a_token_made_for_it():
    trust, ca = Trust(), pki.Authority.create()
    any_node, _ = trust.create_token(now=0.0, reusable=True, ttl=30 * 86400.0)
    _, csr = pki.new_csr("gpu1")
    trust.join(any_node, "gpu1", csr, ca, 10.0, HOUR)
    later = 10.0 + 2 * 3600
    assert not trust.holds_valid_certificate("gpu1", later)
    with pytest.raises(TokenRefused, match="held a certificate before.*token create --node gpu1"):
        trust.join(any_node, "gpu1", csr, ca, later, HOUR)
    bound, _ = trust.create_token(now=later, node="gpu1")
    assert identity_of(trust.join(bound, "gpu1", csr, ca, later + 1, HOUR)).name == "gpu1"


def test_a_removed_node_needs_a_token_made_after_its_removal():
    trust, ca = Trust(), pki.Authority.create()
    old, _ = trust.create_token(now=0.0, reusable=True, ttl=86400.0)
    _, csr = pki.new_csr("n1")
    before = identity_of(trust.join(old, "n1", csr, ca, 10.0, HOUR))
    trust.revoke("n1", now=100.0)
    assert trust.refusal(before) == REMOVED
    assert trust.refusal(Identity("admin", "n1", issued=50.0)) == "", "a person of the same name is not a node"
    with pytest.raises(TokenRefused, match="was removed from the cluster.*only a token made after"):
        trust.join(old, "n1", csr, ca, 100.2, HOUR)
    assert identity_of(trust.join(old, "n9", csr, ca, 100.2, HOUR)).name == "n9", "other names still join"
    new, _ = trust.create_token(now=100.1, node="n1")
    again = identity_of(trust.join(new, "n1", csr, ca, 100.3, HOUR))
    assert trust.refusal(again) == "", "its new certificate is dated after the removal"
    assert trust.knows("n9") and not trust.knows("never")


@pytest.mark.parametrize("name, why", [("localhost", "reserved"), ("db.localhost", "reserved"),
                                       ("10.0.0.1", "IP address"), ("coord.example.com", "name of the coordinator"),
                                       ("COORD.example.com", "name of the coordinator"),
                                       ("coordinator.tfcluster.invalid", "reserved"), ("bad name\n", "expected")])
def test_names_a_node_may_not_have(name, why):
    trust, ca = Trust(reserved=frozenset({"coord.example.com", "10.0.0.1"})), pki.Authority.create()
    token, record = trust.create_token(now=0.0)
    with pytest.raises(pki.PkiError, match=why):
        trust.join(token, name, pki.new_csr("x")[1], ca, 1.0, HOUR)
    assert record.used == 0


def forged_csr(name: str, sans: list[x509.GeneralName]) -> bytes:
    """A CSR that asks for whatever names it likes (what an attacker sends to the join port)."""
    key = pki.new_key()
    return (x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "coordinator"),
                                     x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "coordinator")]))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .sign(key, hashes.SHA256()).public_bytes(pki.serialization.Encoding.PEM))


def test_the_ca_decides_every_name_in_a_node_certificate():
    trust, ca, now = Trust(reserved=frozenset({"10.0.0.1"})), pki.Authority.create(), time.time()
    token, _ = trust.create_token(now=now, reusable=True)
    csr = forged_csr("gpu01", [x509.DNSName(pki.COORDINATOR_NAME), x509.DNSName("localhost"),
                               x509.IPAddress(ipaddress.ip_address("10.0.0.1"))])
    cert = x509.load_pem_x509_certificate(trust.join(token, "gpu01", csr, ca, now, HOUR, ["10.0.0.11"]))
    assert (pki.identity(cert).role, pki.identity(cert).name) == ("node", "gpu01"), "not what the CSR says"
    assert pki.server_names(cert) == [pki.node_server_name("gpu01"), "10.0.0.11"], "only what the coordinator saw"
    on_coordinator_host = x509.load_pem_x509_certificate(
        trust.join(token, "gpu02", csr, ca, now, HOUR, ["10.0.0.1"]))
    assert pki.server_names(on_coordinator_host) == [pki.node_server_name("gpu02"), "10.0.0.1"], \
        "an agent beside the coordinator is reached at its address too; clients of the coordinator check its role name"
    ca.verify(cert)
    with pytest.raises(pki.PkiError, match="not signed by this cluster's CA"):
        pki.Authority.create().verify(cert)


def test_people_only_call_and_only_the_coordinator_carries_its_name(tmp_path):
    ca = pki.init_ca(tmp_path / "ca", ["coord.example.com"])
    server = pki.load_cert(tmp_path / "ca" / pki.SERVER_CERT)
    assert pki.server_names(server)[0] == pki.COORDINATOR_NAME and "coord.example.com" in pki.server_names(server)
    person = pki.load_cert(tmp_path / "ca" / "admin" / pki.CLIENT_CERT)
    usages = person.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH] and pki.server_names(person) == []
    # A coordinator certificate of an earlier release is made again, with the same names and the role name.
    key, old = ca.issue(pki.COORDINATOR, pki.COORDINATOR, HOUR, ["coord.example.com", "10.0.0.1"])
    (tmp_path / "ca" / pki.SERVER_CERT).write_bytes(old)
    assert pki.upgrade_coordinator_certificate(tmp_path / "ca")
    upgraded = pki.load_cert(tmp_path / "ca" / pki.SERVER_CERT)
    assert pki.server_names(upgraded) == [pki.COORDINATOR_NAME, "coord.example.com", "10.0.0.1"]
    pki.check_key_matches(tmp_path / "ca" / pki.SERVER_KEY, upgraded)
    assert not pki.upgrade_coordinator_certificate(tmp_path / "ca"), "once"
