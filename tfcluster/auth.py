"""A shared cluster token on every gRPC call of a cluster run with --insecure (the coordinator tells agents
what to run: without TLS, this is what keeps strangers out).

Servers (coordinator, agents' peer service) given a token refuse calls that do not carry it with
UNAUTHENTICATED; the health service stays open for probes. Clients send it as `authorization: Bearer`.
The token travels in clear text: it keeps strangers out of a trusted network, it is no substitute for
TLS on an untrusted one.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc

from tfcluster.layout import TOKEN_FILE_ENV

HEADER = "authorization"
OPEN_SERVICES = ("/grpc.health.v1.Health/",)


class TokenError(ValueError):
    pass


def load_token(path: str | os.PathLike | None) -> str | None:
    """The token in path (whitespace around it ignored); None when no path is given."""
    if not path:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise TokenError(f"cannot read the token file {path}: {e.strerror or e}") from None
    if not token:
        raise TokenError(f"the token file {path} is empty")
    if any(c.isspace() for c in token) or not token.isprintable():
        raise TokenError(f"the token in {path} must be one word of printable characters")
    return token


def client_token() -> str | None:
    """The token for CLI calls: the file named by TFCLUSTER_TOKEN_FILE, if set."""
    return load_token(os.environ.get(TOKEN_FILE_ENV))


class _Refusals:
    """Whether a call carries the token, and handlers that refuse one that does not."""

    def __init__(self, token: str):
        self.expected = f"Bearer {token}".encode()

        async def refuse(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong cluster token")

        self.handlers = {
            (False, False): grpc.unary_unary_rpc_method_handler(refuse),
            (False, True): grpc.unary_stream_rpc_method_handler(refuse),
            (True, False): grpc.stream_unary_rpc_method_handler(refuse),
            (True, True): grpc.stream_stream_rpc_method_handler(refuse),
        }

    def allowed(self, details) -> bool:
        if details.method.startswith(OPEN_SERVICES):
            return True
        import hmac  # here, not at the top: the CLI imports this module and compares nothing (hmac loads OpenSSL)

        sent = dict(details.invocation_metadata or ()).get(HEADER, "")
        return hmac.compare_digest(sent.encode(), self.expected)

    def refusal(self, handler):
        if handler is None:
            return None
        return self.handlers[(handler.request_streaming, handler.response_streaming)]


class AsyncTokenCheck(grpc.aio.ServerInterceptor):
    """For the asyncio server (the coordinator)."""

    def __init__(self, token: str):
        self.check = _Refusals(token)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        return handler if self.check.allowed(handler_call_details) else self.check.refusal(handler)


def async_server_interceptors(token: str | None) -> list[grpc.aio.ServerInterceptor]:
    return [AsyncTokenCheck(token)] if token else []


class _AddToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str):
        self.metadata = (HEADER, f"Bearer {token}")

    def _details(self, details):
        metadata = list(details.metadata or []) + [self.metadata]
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = credentials, wait_for_ready, compression


def channel(address: str, token: str | None, options: list | None = None) -> grpc.Channel:
    """A channel to a tfcluster server that sends the token (if any) on every call."""
    plain = grpc.insecure_channel(address, options=options)
    return grpc.intercept_channel(plain, _AddToken(token)) if token else plain
