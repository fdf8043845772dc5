"""Who may call what, over gRPC: mutual TLS credentials, the caller's identity from its certificate, and one
policy per method, enforced in front of every handler.

Every listener requires a certificate of the cluster CA (pki.py), except the coordinator's join port, where
a node without one trades a join token for it. Each call is checked before its handler runs: the connection
negotiated TLS 1.3, the certificate's role may call the method, the holder was not removed from the cluster.
Handlers read the caller (`caller()`) to check the rest against the message: a node acts for itself only.
`--insecure` turns all of it off (plain text, anyone may call anything) and says so.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509

from tfcluster import auth, pki
from tfcluster.pki import ADMIN, NODE, VIEWER, Identity

ANONYMOUS = "anonymous"  # a caller on the join port
OPEN = "open"            # health checks: probes carry no certificate
TLS_VERSION = b"TLSv1.3"
AGENT, CONTROL, JOIN, PEER = ("/tfcluster.v1.AgentService/", "/tfcluster.v1.ControlService/",
                              "/tfcluster.v1.JoinService/", "/tfcluster.v1.AgentPeerService/")
READERS = frozenset({ADMIN, VIEWER})
POLICY: dict[str, frozenset[str]] = {
    AGENT + "Register": frozenset({NODE}),
    AGENT + "Connect": frozenset({NODE}),
    AGENT + "RenewCertificate": frozenset({NODE}),
    AGENT + "EndedJobs": frozenset({NODE}),
    JOIN + "Join": frozenset({ANONYMOUS}),
    PEER + "PutFiles": frozenset({NODE}),
    CONTROL + "GetStatus": READERS,
    CONTROL + "ListNodes": READERS,
    CONTROL + "ListJobs": READERS,
    CONTROL + "StreamLogs": READERS,
    CONTROL + "PlanJob": READERS,
    CONTROL + "SubmitJob": frozenset({ADMIN}),
    CONTROL + "StopJob": frozenset({ADMIN}),
    CONTROL + "CreateJoinToken": frozenset({ADMIN}),
    CONTROL + "RemoveNode": frozenset({ADMIN}),
    CONTROL + "CreateDashboardLogin": READERS,
}
HEALTH = "/grpc.health.v1.Health/"
# The refusals an agent gets when its certificate was revoked: it stops its tasks (they run on elsewhere).
REMOVED = "was removed from the cluster"
REPLACED = "was replaced: another holder took its name over"

_caller: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("caller", default=None)


def caller() -> Identity | None:
    """Who makes the call being handled (None: no TLS, or a health check)."""
    return _caller.get()


class Refused(Exception):
    """The caller may not make this call: why, in one line."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


# ---- who calls ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4096)
def _identity(pem: bytes) -> Identity:
    return pki.identity(x509.load_pem_x509_certificate(pem))


class Gate:
    """Checks one call against the policy: TLS 1.3, a certificate whose role may call the method, a holder
    still in the cluster. A caller without a certificate (on the join port) may only join."""

    def __init__(self, is_revoked: Callable[[Identity], str] = lambda who: ""):
        self.is_revoked = is_revoked  # why the holder's certificate is no longer accepted ("": it is)

    def check(self, method: str, auth: dict) -> Identity | None:
        if method.startswith(HEALTH):
            return None
        allowed = POLICY.get(method)
        if allowed is None:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{method}: no such call here")
        if auth.get("ssl_tls_version", [b""])[0] != TLS_VERSION:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, "TLS 1.3 is required")
        pems = auth.get("x509_pem_cert")
        if not pems:
            if ANONYMOUS in allowed:
                return Identity(ANONYMOUS, "")
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, f"{method}: needs a certificate of the cluster CA")
        who = _identity(pems[0])
        if who.role not in allowed:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED,
                          f"{who.role} {who.name!r} may not call {method.rsplit('/', 1)[1]}")
        revoked = self.is_revoked(who)
        if revoked:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{who} {revoked}")
        return who


def _guarded(handler, check: Callable, asynchronous: bool):
    """The handler with the check in front of its behaviour, and the caller set for it."""
    kind = next(k for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
                if getattr(handler, k) is not None)
    behaviour = getattr(handler, kind)
    if asynchronous and inspect.isasyncgenfunction(behaviour):
        async def run(request, context):
            await _enter(check, context)
            async for item in behaviour(request, context):
                yield item
    elif asynchronous:
        async def run(request, context):
            await _enter(check, context)
            return await behaviour(request, context)
    else:
        def run(request, context):
            try:
                _caller.set(check(context.auth_context()))
            except Refused as e:
                context.abort(e.code, str(e))
            return behaviour(request, context)
    return getattr(grpc, f"{kind}_rpc_method_handler")(
        run, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)


async def _enter(check: Callable, context) -> None:
    try:
        _caller.set(check(context.auth_context()))
    except Refused as e:
        await context.abort(e.code, str(e))


class AsyncGuard(grpc.aio.ServerInterceptor):
    """The gate in front of every handler of an asyncio server (the coordinator)."""

    def __init__(self, gate: Gate):
        self.gate = gate

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        return _guarded(handler, functools.partial(self.gate.check, details.method), asynchronous=True)


class Guard(grpc.ServerInterceptor):
    """The gate in front of every handler of a threaded server (the agents' peer port)."""

    def __init__(self, gate: Gate):
        self.gate = gate

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None:
            return None
        return _guarded(handler, functools.partial(self.gate.check, details.method), asynchronous=False)


# ---- credentials --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Credentials:
    """A certificate and its key, and the CA that signed the other side's; or none at all (--insecure), where
    a shared cluster token, if any, is what keeps strangers out."""
    ca: bytes = b""
    cert: bytes = b""
    key: bytes = b""
    token: str | None = None

    @property
    def insecure(self) -> bool:
        return not self.ca

    @classmethod
    def from_dir(cls, directory: Path, cert: str = pki.CLIENT_CERT, key: str = pki.CLIENT_KEY) -> "Credentials":
        files = [directory / pki.CA_CERT, directory / cert, directory / key]
        try:
            return cls(*(f.read_bytes() for f in files))
        except OSError as e:
            raise pki.PkiError(f"{e.filename}: cannot read: {e.strerror or e}") from None

    def server(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=True)

    def join_server(self) -> grpc.ServerCredentials:
        """The join port: the server proves who it is (its certificate chain, the CA included, so that a node can
        check a pinned CA hash); callers bring no certificate yet."""
        return grpc.ssl_server_credentials([(self.key, self.cert + self.ca)], require_client_auth=False)

    def channel(self, address: str, options: list | None = None,
                server_name: str = pki.COORDINATOR_NAME) -> grpc.Channel:
        """A channel to address that accepts only a server whose certificate carries server_name: by default the
        coordinator (a node's certificate, though of the same CA, cannot pass for it); a peer is named by
        pki.node_server_name."""
        if self.insecure:
            return auth.channel(address, self.token, options)
        creds = grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                             certificate_chain=self.cert)
        return grpc.secure_channel(address, creds,
                                   options=[*(options or []), ("grpc.ssl_target_name_override", server_name)])


    def interceptors(self, is_revoked: Callable[[Identity], str] = lambda who: "") -> list:
        """What guards a threaded server serving with these credentials (the agents' peer port)."""
        return auth.server_interceptors(self.token) if self.insecure else [Guard(Gate(is_revoked))]


def fetch_ca(address: str, pinned: str, timeout: float = 10.0) -> bytes:
    """The cluster CA's certificate from the join port at address, checked against a pinned `sha256:` hash
    of its public key (as kubeadm does): nothing is trusted before the hash matches."""
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # verified below, by the pin
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw, \
                context.wrap_socket(raw) as tls:
            chain = getattr(tls, "get_unverified_chain", None) or tls._sslobj.get_unverified_chain
            certs = [x509.load_der_x509_certificate(c.public_bytes(ssl._ssl.ENCODING_DER)) for c in chain()]
    except (OSError, ValueError) as e:
        raise pki.PkiError(f"cannot fetch the CA from the join port {address}: {e}") from None
    for cert in certs:
        if pki.ca_hash(cert) == pinned:
            authority = pki.Authority(cert)
            authority.verify(certs[0])  # the join port's own certificate is signed by the pinned CA
            if pki.identity(certs[0]).role != pki.COORDINATOR or pki.COORDINATOR_NAME not in pki.server_names(certs[0]):
                raise pki.PkiError(f"the join port {address} presented a certificate of the pinned CA that is not "
                                   f"the coordinator's ({pki.identity(certs[0])})")
            return authority.pem
    raise pki.PkiError(f"the join port {address} presented no CA with the pinned hash {pinned} "
                       f"(found: {', '.join(pki.ca_hash(c) for c in certs[1:]) or 'none'})")


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()

