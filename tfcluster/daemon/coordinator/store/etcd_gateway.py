"""A small client of etcd's v3 API through its JSON gateway (`POST /v3/kv/range`, `/v3/kv/txn`, `/v3/watch`).

Why the gateway, over urllib3: the gateway is part of every etcd v3 server (3.4 and later, on the client port,
TLS included) and is the API Patroni runs its leader key on; the store writes from a thread of its own (store/api.py),
which a blocking HTTP client with a connection pool serves directly. The gRPC clients were weighed: `etcd3` does
not import with protobuf 4 and later; `aetcd` is asyncio-only, so it would need an event loop of its own in the
store's thread, and brings a second set of generated etcd protobuf modules into a process whose protobuf runtime
is pinned for the wire API.

Every endpoint the store URL names is tried in turn: a member that does not answer is skipped, so one member
down is not noticed. An error etcd gives because it has no leader (no quorum) is StoreUnavailable saying so.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import urllib3

from tfcluster.daemon.coordinator.store.api import StoreUnavailable

log = logging.getLogger("tfcluster.coordinator")

# What etcd answers when the member is there but the cluster cannot commit (no leader, a proposal timed out):
# the gateway's grpc status codes, and the messages etcd gives with other codes
UNAVAILABLE_CODES = {4, 14}  # DEADLINE_EXCEEDED, UNAVAILABLE
UNAVAILABLE_MESSAGES = ("deadline exceeded", "timed out", "no leader", "leader changed", "too many requests",
                        "not capable", "stopped")
NO_QUORUM = "the store has no quorum"
LEADER, NO_LEADER, UNREACHABLE = "leader", "no leader", "unreachable"  # health()
CONNECT_SECONDS = 2.0
# A member without a leader holds a proposal for as long as the client waits: a healthy cluster commits in
# milliseconds, and a write given up on is settled by reading it back (etcdstore.py)
REQUEST_SECONDS = 5.0
PROBE_SECONDS = 1.0


@dataclass(frozen=True)
class EtcdTls:
    """etcd's own mutual TLS (--etcd-ca/--etcd-cert/--etcd-key): with a CA the endpoints are reached over HTTPS.
    insecure (--etcd-insecure): plain HTTP is accepted, which a coordinator refuses otherwise (etcdstore.py)."""
    ca: str = ""
    cert: str = ""
    key: str = ""
    insecure: bool = False

    def check(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError("--etcd-cert and --etcd-key go together")
        if self.cert and not self.ca:
            raise ValueError("--etcd-cert needs --etcd-ca (the CA that signed the etcd members' certificates)")
        if self.insecure and self.ca:
            raise ValueError("--etcd-insecure and --etcd-ca contradict each other: give one")


def b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def range_end(prefix: str) -> str:
    """The end of the key range holding every key that starts with prefix (etcd's prefix convention)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


class EtcdGateway:
    def __init__(self, endpoints: list[str], tls: EtcdTls = EtcdTls()):
        tls.check()
        self.tls = tls
        self.scheme = "https" if tls.ca else "http"
        self.endpoints = endpoints
        options: dict[str, Any] = {"maxsize": 4, "retries": False,
                                   "timeout": urllib3.Timeout(connect=CONNECT_SECONDS, read=REQUEST_SECONDS)}
        if tls.ca:
            options.update(ca_certs=tls.ca, cert_reqs="CERT_REQUIRED")
        if tls.cert:
            options.update(cert_file=tls.cert, key_file=tls.key)
        self.pool = urllib3.PoolManager(**options)
        self.preferred = 0  # the endpoint that answered last: asked first next time

    def describe(self) -> str:
        return ",".join(self.endpoints)

    def call(self, path: str, body: dict[str, Any], within: float | None = None) -> dict[str, Any]:
        """One request, to the first endpoint that answers; StoreUnavailable when none does or etcd cannot
        commit. Any other error etcd gives (a malformed request, a limit) is a RuntimeError naming it.
        within: the seconds the whole call may take (every endpoint tried included), when an answer that comes
        later is of no use, shared among the endpoints not yet tried (a member that restarts, and hangs until it
        caught up, must not spend the time another would answer in); None: REQUEST_SECONDS for each endpoint."""
        failures = []
        deadline = None if within is None else time.monotonic() + within
        for offset in range(len(self.endpoints)):
            index = (self.preferred + offset) % len(self.endpoints)
            endpoint = self.endpoints[index]
            limit: dict[str, Any] = {}  # none: the pool's own timeouts
            probe = PROBE_SECONDS
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    failures.append(f"{endpoint}: not tried, the {within:.1f} s given were spent")
                    break
                # A member with a leader answers in milliseconds; one without answers a status request as fast
                share = left / (len(self.endpoints) - offset)
                limit["timeout"] = urllib3.Timeout(connect=min(CONNECT_SECONDS, share), read=share * 3 / 4)
                probe = min(PROBE_SECONDS, share / 4)
            try:
                response = self.pool.request("POST", f"{self.scheme}://{endpoint}{path}", body=json.dumps(body),
                                             headers={"Content-Type": "application/json"}, **limit)
            except urllib3.exceptions.ReadTimeoutError as e:
                # A member without a leader holds the request until the client gives up, yet answers a status
                # request at once: that is no quorum. One that answers neither is stopped or cut off from us,
                # and the other members may well have a quorum (a leader must not take it for no quorum).
                failures.append(f"{endpoint}: {_reason(e)}" if self._status(endpoint, probe) is not None else
                                f"{endpoint}: no answer, not even to a status request")
                continue
            except urllib3.exceptions.HTTPError as e:
                failures.append(f"{endpoint}: {_reason(e)}")
                continue
            answer = _json(response.data)
            if response.status == 200:
                self.preferred = index
                return answer
            code, message = answer.get("code", 0), answer.get("message") or answer.get("error") or response.status
            if code in UNAVAILABLE_CODES or response.status in (503, 504) or \
                    any(m in str(message).lower() for m in UNAVAILABLE_MESSAGES):  # another member may commit
                failures.append(f"{endpoint}: {message}")
                continue
            raise RuntimeError(f"etcd at {endpoint} refused {path}: {message}")
        if any(_answered(f) for f in failures):
            raise StoreUnavailable(f"{NO_QUORUM} (etcd {self.describe()}: {'; '.join(failures)})")
        raise StoreUnavailable(f"cannot reach etcd at {self.describe()}: {'; '.join(failures)}")

    def health(self) -> str:
        """LEADER: a member that answers knows a leader. NO_LEADER: members answer (a status needs no leader) but
        none knows one: no quorum. UNREACHABLE: no member answers within a second: this process is cut off, and
        etcd may well have a quorum elsewhere. Each asks for its own words in an error."""
        answered = False
        for endpoint in self.endpoints:
            status = self._status(endpoint)
            if status is None:
                continue
            answered = True
            if status.get("leader") not in (None, "0") and not status.get("errors"):
                return LEADER
        return NO_LEADER if answered else UNREACHABLE

    def _status(self, endpoint: str, seconds: float = PROBE_SECONDS) -> dict[str, Any] | None:
        """The member's status (it gives one without a leader); None when it does not answer within seconds."""
        try:
            response = self.pool.request("POST", f"{self.scheme}://{endpoint}/v3/maintenance/status", body="{}",
                                         timeout=urllib3.Timeout(connect=seconds, read=seconds))
        except urllib3.exceptions.HTTPError:
            return None
        return _json(response.data) if response.status == 200 else None

    def watch(self, create_request: dict[str, Any], idle: float | None = None) -> Iterator[dict[str, Any]]:
        """The watch responses of one watch, as etcd streams them, until the caller stops iterating. idle: the
        seconds the stream may carry nothing before urllib3's ReadTimeoutError ends it (None: no bound)."""
        endpoint = self.endpoints[self.preferred]
        response = self.pool.request("POST", f"{self.scheme}://{endpoint}/v3/watch",
                                     body=json.dumps({"create_request": create_request}),
                                     headers={"Content-Type": "application/json"}, preload_content=False,
                                     timeout=urllib3.Timeout(connect=CONNECT_SECONDS, read=idle))
        try:
            buffered = b""
            for chunk in response.stream(4096, decode_content=True):
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line).get("result", {})
        finally:
            response.release_conn()

    def close(self) -> None:
        self.pool.clear()


def _json(data: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(data or b"{}")
    except ValueError:
        return {"message": data[:200].decode(errors="replace")}
    return answer if isinstance(answer, dict) else {}


def _reason(error: Exception) -> str:
    reason = getattr(error, "reason", None) or error
    if "Connection refused" in str(reason):
        return "connection refused"
    detail = str(reason).split(": ", 1)[-1]
    # A TLS failure, said as what to check: OpenSSL's words alone ("EOF occurred in violation of protocol") do
    # not tell that etcd dropped the handshake because it takes only client certificates its CA signed.
    if "CERTIFICATE_VERIFY_FAILED" in str(reason):
        return f"TLS: etcd's certificate is not signed by the CA given as --etcd-ca ({detail})"
    if isinstance(error, urllib3.exceptions.SSLError):
        return (f"TLS: etcd ended the handshake: it takes only a client certificate signed by its CA "
                f"(--etcd-cert, --etcd-key) ({detail})")
    if "Remote end closed connection without response" in str(reason):
        return f"etcd closed the connection without an answer: does it serve HTTPS only (give --etcd-ca)? ({detail})"
    return detail


def _answered(failure: str) -> bool:
    """The member answered, but could not commit (rather than not being reachable at all)."""
    return "refused" not in failure and "connect timeout" not in failure and ("etcdserver" in failure or
                                         any(m in failure.lower() for m in UNAVAILABLE_MESSAGES))
