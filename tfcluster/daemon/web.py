"""The daemons' HTTP listener (`--http-listen HOST:PORT`): Prometheus metrics at /metrics, and whatever else a
daemon adds (the coordinator's dashboard).

With TLS it is HTTPS with the daemon's own certificate, and callers prove who they are the way gRPC callers
do: a client certificate of the cluster CA whose role may read (admin or viewer), of a holder still in the
cluster. Prometheus scrapes with a viewer certificate (`tfcluster ca issue --role viewer`). With --insecure it
is plain HTTP, open to anyone, or to callers that send the cluster token as `Authorization: Bearer`.

aiohttp serves it: the coordinator's handlers run on its own event loop, next to the model they read; the
agent, which runs on threads, gives the listener a thread and an event loop of its own.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Awaitable, Callable

from aiohttp import web
from cryptography import x509
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from tfcluster import pki
from tfcluster.pki import Identity
from tfcluster.security import READERS, Credentials

log = logging.getLogger("tfcluster.web")

# Identities allowed in by something other than a certificate (the dashboard's login) are kept on the request.
CALLER = "tfcluster.caller"
SHUTDOWN_SECONDS = 2.0
# On every answer. The dashboard's page loads its script and style from /static only (no inline code), so
# nothing injected into a page could run; no other site may frame it (clickjacking) or learn its addresses,
# which carry job ids; a browser takes a log as the text it is said to be, never as HTML.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
Authorizer = Callable[[web.Request], Awaitable[Identity | None]]


class HttpError(ValueError):
    """A --http-listen value that cannot work; the message names it."""


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise HttpError(f"--http-listen: expected HOST:PORT, got {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def server_context(credentials: Credentials) -> ssl.SSLContext:
    """TLS 1.3 with the daemon's certificate; a client certificate is asked for and, when sent, must be of the
    cluster CA (a browser logging in to the dashboard has none, and is let in by its session instead)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=credentials.ca.decode())
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_OPTIONAL
    load_certificate(context, credentials)
    return context


def load_certificate(context: ssl.SSLContext, credentials: Credentials) -> None:
    """(Re)loads the daemon's certificate into context; new connections get it (a renewed node certificate).

    Python's ssl loads certificates from files only: the pair goes through a private temporary file that is
    deleted at once (the key already lives on this disk, under the daemon's state dir)."""
    with tempfile.TemporaryDirectory(prefix="tfcluster-tls-") as directory:
        path = os.path.join(directory, "pair.pem")
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(credentials.key + b"\n" + credentials.cert)
        context.load_cert_chain(path)


def certificate_holder(request: web.Request) -> Identity | None:
    """Who the client certificate of the request's connection names (verified against the CA at handshake)."""
    ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    return pki.identity(x509.load_der_x509_certificate(der)) if der else None


class WebListener:
    """An aiohttp application on one address, behind the cluster's access rules."""

    def __init__(self, listen: str, credentials: Credentials, registry: CollectorRegistry,
                 is_revoked: Callable[[Identity], str] = lambda who: ""):
        self.host, self.port = parse_listen(listen)
        self.credentials = credentials
        self.registry = registry
        self.is_revoked = is_revoked
        self.authorizers: list[Authorizer] = []  # other ways in (the dashboard's session), tried first
        self.open_paths: set[str] = set()        # paths anyone may fetch (the dashboard's login link)
        self.context = None if credentials.insecure else server_context(credentials)
        self.app = web.Application(middlewares=[self._access])
        self.app.on_response_prepare.append(_add_security_headers)
        self.app.router.add_get("/metrics", self._metrics)
        self.runner: web.AppRunner | None = None
        self.address = ""

    @property
    def scheme(self) -> str:
        return "http" if self.context is None else "https"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}"

    async def start(self) -> "WebListener":
        # A browser that leaves a followed log must end its handler (aiohttp no longer cancels it by default),
        # and a stopping daemon must not wait a minute for such streams.
        self.runner = web.AppRunner(self.app, access_log=None, handle_signals=False, handler_cancellation=True,
                                    shutdown_timeout=SHUTDOWN_SECONDS)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port, ssl_context=self.context, reuse_address=True)
        try:
            await site.start()
        except OSError as e:
            await self.runner.cleanup()
            raise OSError(f"--http-listen {self.host}:{self.port}: {e.strerror or e}") from None
        port = self.runner.addresses[0][1]
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        log.info("serving %s/metrics", self.url)
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def renew(self, credentials: Credentials) -> None:
        """The daemon's certificate was renewed: new connections get the new one."""
        self.credentials = credentials
        if self.context is not None:
            load_certificate(self.context, credentials)

    # ---- access ----------------------------------------------------------------------------------

    @web.middleware
    async def _access(self, request: web.Request, handler):
        if request.path in self.open_paths:
            return await handler(request)
        for authorizer in self.authorizers:
            who = await authorizer(request)
            if who is not None:
                request[CALLER] = who
                return await handler(request)
        request[CALLER] = self._check_caller(request)
        return await handler(request)

    def _check_caller(self, request: web.Request) -> Identity | None:
        if self.context is None:
            token = self.credentials.token
            sent = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if token and not hmac.compare_digest(sent.encode(), token.encode()):
                raise web.HTTPUnauthorized(text="send the cluster token as `Authorization: Bearer TOKEN`\n")
            return None
        who = certificate_holder(request)
        if who is None:
            raise web.HTTPUnauthorized(text="a client certificate of the cluster CA is required (`tfcluster ca "
                                            "issue --role viewer`), or log in with `tfcluster dashboard`\n")
        if who.role not in READERS:
            raise web.HTTPForbidden(text=f"{who.role} {who.name!r} may not read this: an admin or viewer "
                                         f"certificate is needed\n")
        revoked = self.is_revoked(who)
        if revoked:
            raise web.HTTPForbidden(text=f"{who} {revoked}\n")
        return who

    # ---- /metrics ----------------------------------------------------------------------------------

    async def _metrics(self, request: web.Request) -> web.Response:
        # The collectors read the model here, on its own loop (cheap); writing thousands of samples out as text
        # is not, and goes to a thread so the loop keeps reading heartbeats meanwhile.
        families = Collected(list(self.registry.collect()))
        body = await asyncio.get_running_loop().run_in_executor(None, generate_latest, families)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer, refusals and errors included, before its headers go out. A header the handler set stays (a
    TensorBoard's page, passed on by the coordinator, needs a policy of its own)."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


class Collected:
    """Metric families already collected, as a registry for generate_latest."""

    def __init__(self, families: list):
        self.families = families

    def collect(self):
        return iter(self.families)


class ThreadedWebListener:
    """A WebListener on a thread and event loop of its own, for a daemon that runs on threads (the agent)."""

    def __init__(self, listener: WebListener):
        self.listener = listener
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="http", daemon=True)

    def start(self) -> "ThreadedWebListener":
        self.thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.listener.start(), self.loop).result(timeout=30)
        except BaseException:
            self._end_loop()
            raise
        return self

    @property
    def url(self) -> str:
        return self.listener.url

    def renew(self, credentials: Credentials) -> None:
        self.loop.call_soon_threadsafe(self.listener.renew, credentials)

    def stop(self) -> None:
        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.listener.stop(), self.loop).result(timeout=10)
            self._end_loop()

    def _end_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
