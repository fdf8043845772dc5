"""A running coordinator: the gRPC server of its control and agent services (rpc/control_service.py, rpc/agent_service.py) with
mutual TLS and the access checks in front of every call, the join port, the dashboard and /metrics, around the
Coordinator (rpc/coordinator.py) and its store, event loop, writer and ticker.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from tfcluster import __version__, pki, security
from tfcluster.auth import async_server_interceptors
from tfcluster.daemon.coordinator.core.cluster import DEFAULT_TASK_GRACE_SECONDS
from tfcluster.daemon.coordinator.core.node_events import DEFAULT_FORGET_LOST_SECONDS
from tfcluster.daemon.coordinator.core.model.ledger import DEFAULT_KEEP_USAGE_SECONDS
from tfcluster.daemon.coordinator.core.model.task_uids import UidRange
from tfcluster.daemon.coordinator.core.scheduling.policy import Policy, PolicyError, parse
from tfcluster.daemon.coordinator.rpc.agent_service import AgentServicer, JoinServicer
from tfcluster.daemon.coordinator.rpc.control_service import ControlServicer
from tfcluster.daemon.coordinator.rpc.coordinator import build
from tfcluster.daemon.coordinator.rpc.join_port import JoinLimiter, join_server
from tfcluster.daemon.coordinator.rpc.listener import Listener, served
from tfcluster.daemon.coordinator.rpc.stream_limits import DEFAULT_PER_CALLER, StreamLimits
from tfcluster.daemon.coordinator.store.api import Store
from tfcluster.daemon.coordinator.store.code_archives import DEFAULT_MAX_BYTES as DEFAULT_MAX_CODE_BYTES
from tfcluster.daemon.coordinator.store.code_archives import DEFAULT_STORE_BYTES as DEFAULT_CODE_STORE_BYTES
from tfcluster.daemon.coordinator.web.boards import Boards
from tfcluster.daemon.coordinator.web.dashboard import Dashboard
from tfcluster.daemon.coordinator.web.metrics import CoordinatorMetrics
from tfcluster.daemon.web import WebListener, parse_listen

if TYPE_CHECKING:
    from tfcluster.daemon.coordinator.store.etcd_gateway import EtcdTls

log = logging.getLogger("tfcluster.coordinator")

SERVICES = ("", "tfcluster.v1.AgentService", "tfcluster.v1.ControlService")


class CoordinatorServer:
    """A running coordinator on its event loop: the gRPC server, the writer and the ticker.

    With tls_dir (tfcluster ca init) it serves mutual TLS on `listen` and joins on `join_listen`; without it,
    plain text, which needs insecure=True said out loud."""

    def __init__(self, listen: str, state_dir: Path, lost_after_seconds: float = 3.0,
                 heartbeat_interval_seconds: float = 1.0, tls_dir: Path | None = None, insecure: bool = False,
                 join_listen: str = "", token: str | None = None, keep_finished_jobs: int = 1000,
                 keep_finished_seconds: float = 7 * 86400.0, node_cert_seconds: float = pki.NODE_HOURS * 3600.0,
                 http_listen: str = "", task_uids: UidRange = UidRange(), store_url: str = "",
                 keep_usage_seconds: float = DEFAULT_KEEP_USAGE_SECONDS,
                 policy_path: Path | None = None, etcd_tls: EtcdTls | None = None,
                 max_code_bytes: int = DEFAULT_MAX_CODE_BYTES, code_store_bytes: int = DEFAULT_CODE_STORE_BYTES,
                 store: Store | None = None, max_heartbeats_per_second: float = 0.0,
                 max_code_unpacked_bytes: int | None = None, max_streams_per_caller: int = DEFAULT_PER_CALLER,
                 task_grace_seconds: float = DEFAULT_TASK_GRACE_SECONDS,
                 forget_lost_seconds: float = DEFAULT_FORGET_LOST_SECONDS):
        if (tls_dir is None) == (not insecure):
            raise ValueError("give --tls-dir (see `tfcluster ca init`) or --insecure")
        self.listen, self.join_listen, self.token = listen, join_listen or next_port(listen), token
        if tls_dir:
            upgrade_certificate(tls_dir)
        self.credentials = security.Credentials.from_dir(tls_dir, pki.SERVER_CERT, pki.SERVER_KEY) if tls_dir \
            else security.Credentials()
        authority = pki.Authority.load(tls_dir, with_key=True) if tls_dir else None
        # A policy with a mistake stops the start here (PolicyError), before the store is opened.
        policy = read_policy(policy_path, time.time()) if policy_path is not None else None
        self.coordinator = build(state_dir, lost_after_seconds, heartbeat_interval_seconds, keep_finished_jobs,
                                 keep_finished_seconds, authority, task_uids=task_uids, store_url=store_url,
                                 etcd_tls=etcd_tls, max_code_bytes=max_code_bytes, code_store_bytes=code_store_bytes,
                                 store=store, max_heartbeats_per_second=max_heartbeats_per_second,
                                 max_code_unpacked_bytes=max_code_unpacked_bytes)
        self.coordinator.cluster.usage.keep_seconds = keep_usage_seconds
        self.coordinator.cluster.task_grace = task_grace_seconds
        self.coordinator.cluster.forget_lost_after = forget_lost_seconds
        if tls_dir:  # no node may be named as the coordinator is reached
            self.coordinator.trust.reserved = frozenset(pki.server_names(pki.load_cert(tls_dir / pki.SERVER_CERT)))
        self.coordinator.node_cert_lifetime = datetime.timedelta(seconds=node_cert_seconds)
        self.policy_path = policy_path
        if policy is not None:
            self.coordinator.cluster.set_policy(policy)
        self.server: grpc.aio.Server | None = None
        self.join_server: grpc.aio.Server | None = None
        self.join_limiter = JoinLimiter()
        self.streams = StreamLimits(max_streams_per_caller)  # the gRPC calls and the dashboard's log views
        self.health = HealthServicer()
        self.address = self.join_address = ""
        self.metrics: CoordinatorMetrics | None = None
        self.web: WebListener | None = None
        if http_listen:
            parse_listen(http_listen)  # a bad address is an error before anything starts
            self.metrics = CoordinatorMetrics(self.coordinator.cluster)
            self.coordinator.cluster.observer = self.metrics
            web_credentials = self.credentials if tls_dir else security.Credentials(token=token)
            self.web = WebListener(http_listen, web_credentials, self.metrics.registry, self._refusal)
            Dashboard(self.coordinator, self.web, self.streams)
            Boards(self.coordinator, self.web)

    def reload_policy(self) -> bool:
        """Reads the policy file again (SIGHUP). One with a mistake is logged and the policy in force stays."""
        if self.policy_path is None:
            log.warning("SIGHUP: no policy to reload (the coordinator runs without --policy)")
            return False
        try:
            policy = read_policy(self.policy_path, self.coordinator.clock())
        except PolicyError as e:
            log.error("policy not reloaded, the one loaded at %s stays in force: %s",
                      datetime.datetime.fromtimestamp(self.coordinator.cluster.policy.loaded_at).isoformat(" ",
                                                                                                      "seconds"), e)
            return False
        cluster = self.coordinator.cluster
        cluster.set_policy(policy)
        log.info("policy reloaded from %s: %d classes, quotas for %d users and %d groups", policy.source,
                 len(policy.classes), len(policy.users), len(policy.groups))
        self.coordinator.apply(cluster.schedule(self.coordinator.clock()))
        return True

    def _refusal(self, who: pki.Identity) -> str:
        return self.coordinator.trust.refusal(who)

    def _interceptors(self) -> list:
        counting = [self.metrics.interceptor()] if self.metrics else []
        if self.credentials.insecure:
            return counting + async_server_interceptors(self.token) + \
                [security.AsyncGuard(None, admit_long_lived=self.streams.admit)]
        # Trust is read at each call: a node removed a moment ago is refused.
        return counting + [security.AsyncGuard(security.Gate(is_revoked=self._refusal),
                                               admit_long_lived=self.streams.admit)]

    async def start(self, listener: Listener | None = None) -> "CoordinatorServer":
        """Serves on listener (a standby's, which won: its connections carry over) or on a server of its own."""
        services = served(AgentServicer(self.coordinator), ControlServicer(self.coordinator), self.health)
        started = listener is not None
        if listener is None:
            listener = Listener(self.listen, None if self.credentials.insecure else self.credentials.server())
        self.server, port = listener.server, listener.port
        if not self.credentials.insecure:
            self.join_server = self._join_server()
        self.address = _reachable(self.listen, port)
        self.coordinator.leader_address = self.coordinator.leader_address or self.address
        listener.serve(services, self._interceptors())
        if not started:
            await self.server.start()
        if self.join_server is not None:
            await self.join_server.start()
        if self.web is not None:
            try:
                await self.web.start()
            except OSError:
                await self._stop_servers(0)
                raise
            self.coordinator.dashboard_port = int(self.web.address.rsplit(":", 1)[1])
        self.coordinator.start()
        for service in SERVICES:
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        if self.credentials.insecure:
            log.warning("coordinator %s listening on %s WITHOUT TLS (--insecure): anyone who reaches it can read "
                        "the cluster and, without a token, make the agents run commands", __version__, self.address)
        else:
            log.info("coordinator %s listening on %s (mutual TLS), joins on %s (state: %s)", __version__,
                     self.address, self.join_address, self.coordinator.store.location)
        return self

    async def stop(self, grace: float = 1.0) -> None:
        await self.health.enter_graceful_shutdown()
        if self.web is not None:
            await self.web.stop()
        await self._stop_servers(grace)
        await self.coordinator.close()

    def _join_server(self) -> grpc.aio.Server:
        counting = [self.metrics.interceptor()] if self.metrics else []
        server, port = join_server(self.join_listen, self.credentials, JoinServicer(self.coordinator), self.health,
                                   counting, self.join_limiter)
        self.join_address = _reachable(self.join_listen, port)
        return server

    async def _stop_servers(self, grace: float) -> None:
        servers = [s for s in (self.server, self.join_server) if s is not None]
        await asyncio.gather(*(s.stop(grace) for s in servers))


def read_policy(path: Path, now: float) -> Policy:
    """The policy in the file; raises PolicyError naming the file, the key and the reason."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError(f"{path}: cannot read it: {e}") from None
    return parse(text, str(path), now)


def upgrade_certificate(tls_dir: Path) -> None:
    """A coordinator certificate made before clients checked its name is made again with that name."""
    if pki.upgrade_coordinator_certificate(tls_dir):
        log.warning("%s: made again with the name clients now check (%s)", tls_dir / pki.SERVER_CERT,
                    pki.COORDINATOR_NAME)


def next_port(listen: str) -> str:
    """The join port's default: the port after the listen port, on the same host."""
    host, _, port = listen.rpartition(":")
    return f"{host}:{int(port) + 1}" if port not in ("", "0") else f"{host}:0"


def _reachable(listen: str, port: int) -> str:
    host = listen.rsplit(":", 1)[0]
    return f"{'127.0.0.1' if host in ('0.0.0.0', '[::]', '') else host}:{port}"
