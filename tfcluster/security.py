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
import inspect
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
from cryptography import x509

from tfcluster import pki
from tfcluster.credentials import Credentials  # noqa: F401 (the daemons' import of it)
from tfcluster.pki import ADMIN, NODE, USER, VIEWER, Identity

ANONYMOUS = "anonymous"  # a caller on the join port
OPEN = "open"            # health checks: probes carry no certificate
TLS_VERSION = b"TLSv1.3"
AGENT, CONTROL, JOIN, PEER = ("/tfcluster.v1.AgentService/", "/tfcluster.v1.ControlService/",
                              "/tfcluster.v1.JoinService/", "/tfcluster.v1.AgentPeerService/")
READERS = frozenset({ADMIN, USER, VIEWER})
SUBMITTERS = frozenset({ADMIN, USER})  # a user acts on their own jobs only: the handlers check the owner
KIB, MIB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class Rule:
    """Who may call a method, and the largest request message it takes (each message, on a stream): bounded by
    what the call is for, so that no certificate, and no caller without one, makes the coordinator hold more."""
    roles: frozenset[str]
    max_request_bytes: int


# The bounds, from the largest legitimate request of each kind:
#  NAMES: ids, names, page tokens, a CSR of the node's P-256 key (about 400 bytes of PEM): a few hundred bytes
#         each, under 2 KB in all; 16 KiB leaves room for any name the checks behind allow.
#  ENDED: at most 1000 job ids (wire.MAX_JOB_IDS) of under 100 bytes.
#  SPEC: a job's command and env must fit Linux's ARG_MAX (2 MiB by default) to launch at all; a role may
#        carry its own, so a few roles' worth plus a list of nodes fits in 16 MiB.
#  NODE: a registration names at most 256 GPUs and reports its tasks, each under 100 KB with its last 20
#        lines; a stream message is a heartbeat (a few hundred bytes per running task), a task report, or a
#        64 KiB log chunk. 16 MiB holds thousands of running tasks' reports or a hundred full exit reports.
#  CHUNK: a checkpoint file goes to a peer, and a job's code archive to the coordinator, in 1 MiB chunks.
NAMES, ENDED, SPEC, NODE_MESSAGE, CHUNK = 16 * KIB, 256 * KIB, 16 * MIB, 16 * MIB, 2 * MIB
POLICY: dict[str, Rule] = {
    AGENT + "Register": Rule(frozenset({NODE}), NODE_MESSAGE),
    AGENT + "Connect": Rule(frozenset({NODE}), NODE_MESSAGE),
    AGENT + "RenewCertificate": Rule(frozenset({NODE}), NAMES),
    AGENT + "EndedJobs": Rule(frozenset({NODE}), ENDED),
    AGENT + "FetchCode": Rule(frozenset({NODE}), NAMES),  # the handler checks the job has a task on the caller
    JOIN + "Join": Rule(frozenset({ANONYMOUS}), NAMES),
    PEER + "PutFiles": Rule(frozenset({NODE}), CHUNK),
    PEER + "GetCode": Rule(frozenset({NODE}), NAMES),  # a job's code, to the nodes the coordinator sent there
    CONTROL + "GetStatus": Rule(READERS, NAMES),
    CONTROL + "ListNodes": Rule(READERS, NAMES),
    CONTROL + "ListJobs": Rule(READERS, NAMES),
    CONTROL + "StreamLogs": Rule(READERS, NAMES),
    CONTROL + "ReadSummaries": Rule(READERS, ENDED),  # names every event file the client holds, with its size
    CONTROL + "WatchJob": Rule(READERS, NAMES),
    CONTROL + "PlanJob": Rule(READERS, SPEC),
    CONTROL + "SubmitJob": Rule(SUBMITTERS, SPEC),
    CONTROL + "StopJob": Rule(SUBMITTERS, NAMES),
    CONTROL + "CreateJoinToken": Rule(frozenset({ADMIN}), NAMES),
    CONTROL + "RemoveNode": Rule(frozenset({ADMIN}), NAMES),
    CONTROL + "DrainNode": Rule(frozenset({ADMIN}), NAMES),
    CONTROL + "ResumeNode": Rule(frozenset({ADMIN}), NAMES),
    CONTROL + "Diagnose": Rule(frozenset({ADMIN}), NAMES),  # it has every agent open a port and connect out
    CONTROL + "CreateDashboardLogin": Rule(READERS, NAMES),
    CONTROL + "GetUsage": Rule(READERS, NAMES),  # every user's totals, to anyone who may read (fair share is open)
    CONTROL + "GetQueue": Rule(READERS, NAMES),
    CONTROL + "GetPolicy": Rule(READERS, NAMES),
    CONTROL + "CodeStatus": Rule(SUBMITTERS, NAMES),
    CONTROL + "UploadCode": Rule(SUBMITTERS, CHUNK),
    CONTROL + "StartSweep": Rule(SUBMITTERS, SPEC),
    CONTROL + "GetSweep": Rule(READERS, NAMES),
    CONTROL + "ListSweeps": Rule(READERS, NAMES),
    CONTROL + "StopSweep": Rule(SUBMITTERS, NAMES),  # what one stream may store is bounded by --max-code-bytes
}
# The calls a client may keep open as long as it likes (following a job or a log, sending code): the coordinator
# bounds how many each caller holds at once (coordinator/rpc/stream_limits.py). An agent's own streams are not here.
LONG_LIVED = frozenset({CONTROL + "StreamLogs", CONTROL + "WatchJob", CONTROL + "UploadCode",
                        CONTROL + "ReadSummaries"})
HEALTH_MAX_BYTES = 4 * KIB  # a health check names a service
# What a server that serves these methods must let gRPC take in at all; the bound per method is checked after.
MAX_REQUEST_BYTES = max(rule.max_request_bytes for rule in POLICY.values())
HEALTH = "/grpc.health.v1.Health/"
# The refusals an agent gets when its certificate was revoked: it stops its tasks (they run on elsewhere).

_caller: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("caller", default=None)


def caller() -> Identity | None:
    """Who makes the call being handled (None: no TLS, or a health check)."""
    return _caller.get()


class Refused(Exception):
    """The caller may not make this call: why, in one line. delay, if given, is awaited before the refusal is
    answered (a caller's refusals paced: coordinator/rpc/stream_limits.py)."""

    def __init__(self, code: grpc.StatusCode, message: str, delay: Callable[[], Awaitable[None]] | None = None):
        super().__init__(message)
        self.code, self.delay = code, delay


# ---- who calls ----------------------------------------------------------------------------------

# Every agent's certificate is its own, and a cache smaller than the fleet misses on every call of a
# registration storm: 5,000 agents through 4,096 entries in turn. Holding one costs about 1 KB.
@functools.lru_cache(maxsize=65536)
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
        rule = POLICY.get(method)
        if rule is None:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{method}: no such call here")
        allowed = rule.roles
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


def max_request_bytes(method: str) -> int:
    rule = POLICY.get(method)
    return rule.max_request_bytes if rule else HEALTH_MAX_BYTES  # any other method is refused by the gate


class Messages:
    """Decodes a method's request messages, each only once its size is known to be within the method's bound:
    gRPC hands the guard the raw bytes, and nothing is decoded for a call the guard refuses."""

    def __init__(self, method: str, decode: Callable[[bytes], object] | None):
        self.name, self.bound = method.rsplit("/", 1)[-1], max_request_bytes(method)
        self.decode = decode or (lambda raw: raw)

    def take(self, raw: bytes) -> tuple[object, Refused | None]:
        """The message, or why not. Returned, not raised: an exception's traceback would keep the raw bytes
        alive in a reference cycle (the call's state holds the abort, the abort its frames) until a full
        collection, and a flood of refused megabytes would pile up."""
        if len(raw) > self.bound:
            return None, Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self.name}: a request message of {len(raw)} "
                                                                     f"bytes is over this call's bound of {self.bound} bytes")
        try:
            return self.decode(raw), None
        except Exception as e:  # protobuf's DecodeError, or whatever a deserializer makes of junk
            return None, Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{self.name}: not a valid request message ({e})")


class _Reading:
    """A streaming call's context whose read() gives the messages decoded, each within the bound."""

    def __init__(self, context, messages: Messages):
        self._context, self._messages = context, messages

    def __getattr__(self, name):
        return getattr(self._context, name)

    async def read(self):
        raw = await self._context.read()
        if raw is grpc.aio.EOF:
            return raw
        message, refused = self._messages.take(raw)
        del raw  # not kept by the abort's traceback
        if refused:
            await self._context.abort(refused.code, str(refused))
        return message

    async def requests(self, raw_iterator):
        async for raw in raw_iterator:
            message, refused = self._messages.take(raw)
            del raw
            if refused:
                await self._context.abort(refused.code, str(refused))
            yield message


def _guarded(handler, method: str, check: Callable, admit: Callable | None):
    """The handler with the check (and admit, if any) in front of its behaviour, the caller set for it, and its
    requests decoded only within the method's bound. A refused call ends with its status set, not an abort
    (see Messages.take); gRPC sends no answer with a status that is not OK."""
    kind = next(k for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
                if getattr(handler, k) is not None)
    behaviour, streaming = getattr(handler, kind), kind.startswith("stream")
    messages = Messages(method, handler.request_deserializer)
    if inspect.isasyncgenfunction(behaviour):
        async def run(request, context):
            request, context, delay = _enter(check, admit, messages, streaming, request, context)
            if delay is not None:
                await delay()
            if context is not None:
                async for item in behaviour(request, context):
                    yield item
    else:
        async def run(request, context):
            request, context, delay = _enter(check, admit, messages, streaming, request, context)
            if delay is not None:
                await delay()
            return None if context is None else await behaviour(request, context)
    return getattr(grpc, f"{kind}_rpc_method_handler")(
        run, request_deserializer=None, response_serializer=handler.response_serializer)


def _enter(check: Callable, admit: Callable | None, messages: Messages, streaming: bool, request, context):
    """The gate, then admit (the join port's rate, a caller's open calls), then the request's size: the request
    decoded (on a stream, an iterator and a context that decode each message), the context and None; once
    refused, (None, None, what to await before the refusal is answered, or None)."""
    delay = None
    try:
        _caller.set(check(context.auth_context()))
        if admit is not None:
            admit(context)
    except Refused as e:
        refused, delay = e, e.delay
    else:
        if streaming:
            reading = _Reading(context, messages)
            return reading.requests(request), reading, None
        request, refused = messages.take(request)
        if not refused:
            return request, context, None
    context.set_code(refused.code)
    context.set_details(str(refused))
    return None, None, delay


class AsyncGuard(grpc.aio.ServerInterceptor):
    """The gate in front of every handler of an asyncio server (the coordinator's), and the bound on each
    request's size. gate=None (--insecure) keeps only the bounds; admit(context), if given, refuses a call
    by raising Refused once the gate let it through (the join port's rate limit); admit_long_lived(context)
    does the same for the calls in LONG_LIVED only (the coordinator's count of each caller's open calls)."""

    def __init__(self, gate: Gate | None, admit: Callable | None = None, admit_long_lived: Callable | None = None):
        self.gate, self.admit, self.admit_long_lived = gate, admit, admit_long_lived

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        check = functools.partial(self.gate.check, details.method) if self.gate else _nobody
        admit = self.admit
        if self.admit_long_lived is not None and details.method in LONG_LIVED:
            admit = _in_turn(admit, self.admit_long_lived) if admit else self.admit_long_lived
        return _guarded(handler, details.method, check, admit)


def _in_turn(*admits: Callable) -> Callable:
    """One admit that runs each of admits, in order: the first refusal is the call's."""
    def admit(context) -> None:
        for each in admits:
            each(context)
    return admit


def _nobody(auth: dict) -> None:
    return None


# ---- credentials --------------------------------------------------------------------------------

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
    except OSError as e:  # not up yet, perhaps: the caller may try again
        raise ConnectionError(f"cannot fetch the CA from the join port {address}: {e.strerror or e}") from None
    except ValueError as e:
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



