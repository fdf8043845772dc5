"""A coordinator that shares its etcd store with others: a standby until it wins the leadership, the leader until
it stops or loses it, then a standby again.

As a standby it serves refusals naming the leader (standby.py) on its gRPC and join ports, serves no dashboard
or /metrics, and keeps a warm copy of the state. Once it wins, it builds the coordinator from the warm copy (or
from etcd), fenced on its leadership (leadership.py), and serves like a coordinator on its own, on the same gRPC
server that refused a moment before (listener.py: the connections agents keep to it carry over): agents register
again with their running tasks, which it takes over without restarting them. When its lease is lost it drops the
coordinator and its connections without writing a thing, and stands by again.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable

import grpc

from tfcluster.daemon.coordinator.core import status
from tfcluster.daemon.coordinator.grpc_server import CoordinatorServer
from tfcluster.daemon.coordinator.ha.leadership import Leadership, LeaderInfo, LeaderStore
from tfcluster.daemon.coordinator.ha.lease_keeper import LeaseKeeper
from tfcluster.daemon.coordinator.ha.standby import Refusal, WarmCopy, refusal_server
from tfcluster.daemon.coordinator.process import keep_long_lived_objects_out_of_the_collector, raise_open_file_limit
from tfcluster.daemon.coordinator.rpc.listener import Listener
from tfcluster.daemon.coordinator.store.api import Conflict
from tfcluster.daemon.coordinator.store.etcd import EtcdStore, Guard, insecure_warning
from tfcluster.daemon.notify import Notifier
from tfcluster.states import Term, check_transition

log = logging.getLogger("tfcluster.coordinator")

STATUS_EVERY_SECONDS = 5.0


def advertised(listen: str, advertise_host: str = "") -> str:
    """The address others reach a listen address at: the host given, the one it listens on, or (listening on
    every interface) the address this host's name resolves to."""
    host, _, port = listen.rpartition(":")
    if advertise_host:
        return f"{advertise_host}:{port}"
    if host not in ("", "0.0.0.0", "[::]", "::"):
        return listen
    try:
        return f"{socket.gethostbyname(socket.gethostname())}:{port}"
    except OSError:
        return f"127.0.0.1:{port}"


def _start_keeper(store: EtcdStore) -> LeaseKeeper | None:
    """The process that will renew this coordinator's leader lease, started before it leads (and meets a storm)."""
    try:
        return LeaseKeeper(store.gateway)
    except OSError as e:
        log.warning("cannot start the lease keeper process (%s): the leader lease is renewed from the coordinator", e)
        return None


class HighlyAvailable:
    """Runs the terms of one coordinator process: make_server(store) builds the coordinator of one term."""

    def __init__(self, make_server: Callable[[LeaderStore], CoordinatorServer], open_store: Callable[[], EtcdStore],
                 me: LeaderInfo, listen: str, join_listen: str, credentials, notifier: Notifier | None = None):
        self.make_server, self.open_store, self.me = make_server, open_store, me
        self.listen, self.join_listen, self.credentials = listen, join_listen, credentials
        self.notifier = notifier or Notifier.from_environment()
        self.observer = open_store()  # the standby's store: its warm copy, and the leadership's connection
        if self.observer.gateway.tls.insecure:  # once: each term opens a store of its own
            log.warning("%s", insecure_warning(self.observer.location))
        self.keeper = _start_keeper(self.observer)
        self.leadership = Leadership(self.observer.gateway, self.observer.prefix, me, keeper=self.keeper)
        self.server: CoordinatorServer | None = None
        self.warm: WarmCopy | None = None
        self.stop = asyncio.Event()
        self.state = Term.STARTING

    def run(self) -> None:
        raise_open_file_limit()
        asyncio.run(self._main())

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload_policy)
        background = [asyncio.create_task(keep_long_lived_objects_out_of_the_collector()),
                      asyncio.create_task(self._report_to_systemd())]
        try:
            while not self.stop.is_set():
                listening = await self._stand_by()
                if listening is None:
                    break
                await self._lead(*listening)
        finally:
            for task in background:
                task.cancel()
            self.notifier.stopping("stopping")
            self.leadership.resign()
            if self.keeper is not None:
                self.keeper.close()
            self.observer.close()

    def _reload_policy(self) -> None:
        if self.server is not None:
            self.server.reload_policy()

    async def _report_to_systemd(self) -> None:
        if not self.notifier.enabled:
            return
        every = min(self.notifier.beat_interval or STATUS_EVERY_SECONDS, STATUS_EVERY_SECONDS)
        while True:
            line = status.one_line(self.server.coordinator.cluster) if self.server is not None else self.state
            self.notifier.watchdog(line) if self.notifier.watchdog_seconds else self.notifier.status(line)
            await asyncio.sleep(every)

    def _move(self, term: Term) -> None:
        check_transition(f"coordinator {self.me.address}", self.state, term)
        self.state = term

    async def _stand_by(self) -> tuple[Listener, list[grpc.aio.Server]] | None:
        """Serves refusals and keeps the warm copy until this coordinator wins (the gRPC port's listener and the
        join port's refusal server, still serving) or is stopped (None)."""
        self._move(Term.STANDBY)
        leader = self.leadership
        listener = Listener(self.listen, self.credentials, Refusal(lambda: leader.leader.address))
        servers = [listener.server]
        if self.join_listen:
            servers.append(refusal_server(self.join_listen, lambda: leader.leader.join_address, self.credentials))
        for server in servers:
            await server.start()
        self.notifier.ready(Term.STANDBY)
        log.info("coordinator standing by on %s (the store: %s)", self.me.address, self.observer.location)
        warm = WarmCopy(self.observer).start()
        stopped = threading.Event()
        stop_waiter = asyncio.create_task(self.stop.wait())
        campaign = asyncio.ensure_future(asyncio.get_running_loop().run_in_executor(None, leader.campaign, stopped))
        await asyncio.wait([campaign, stop_waiter], return_when=asyncio.FIRST_COMPLETED)
        stopped.set()
        stop_waiter.cancel()
        won = await campaign
        if not won or self.stop.is_set():
            await asyncio.gather(*(server.stop(0) for server in servers))
            warm.stop()
            return None
        self.warm = warm
        return listener, servers[1:]

    async def _take_over(self, listener: Listener, ended: asyncio.Event) -> CoordinatorServer:
        """The leader's coordinator, built from the warm copy, fenced on this term and serving; ended is set
        when the term ends (the lease is lost, or a write is fenced)."""
        leadership, loop = self.leadership, asyncio.get_running_loop()
        store = self.open_store()
        store.guard = Guard(leadership.key, leadership.revision)
        documents = await loop.run_in_executor(None, self.warm.current)
        self.warm.stop()
        leadership.on_lost = lambda why: loop.call_soon_threadsafe(ended.set)
        server = self.make_server(LeaderStore(store, leadership, lambda: documents))
        server.coordinator.acting = leadership.holds
        server.coordinator.leader_address = self.me.address
        server.coordinator.persistence.on_fenced = ended.set
        self.server = await server.start(listener)
        return server

    async def _lead(self, listener: Listener, refusing: list[grpc.aio.Server]) -> None:
        """Serves as the leader until the process is stopped (the last changes are written, the key given
        up) or the leadership is lost (nothing more is written or sent).

        The join port's refusals stop only once the leader's join server listens beside them (gRPC binds with
        SO_REUSEPORT): a client never finds the port closed during the takeover, only a standby's answer it
        retries. The gRPC port's listener goes on from refusing to serving."""
        self._move(Term.LEADER)
        ended = asyncio.Event()
        try:
            server = await self._take_over(listener, ended)
        except BaseException:
            await listener.server.stop(0)
            raise
        finally:
            await asyncio.gather(*(refusal.stop(0) for refusal in refusing))
        leadership = self.leadership
        waiters = [asyncio.create_task(self.stop.wait()), asyncio.create_task(ended.wait())]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        persistence = server.coordinator.persistence
        if not leadership.holds() and persistence.fenced is None:
            persistence.fenced = Conflict("this coordinator lost the leadership")  # close() writes nothing then
        if persistence.fenced is not None:
            log.critical("stepping down: the coordinator stops serving and stands by again (%s)", persistence.fenced)
        await server.stop()
        self.server = None
        if persistence.fenced is not None:
            leadership.step_down()


def run(options: dict, listen: str, join_listen: str, tls_dir, store_url: str, etcd_tls,
        advertise_host: str = "") -> None:
    """`tfcluster coordinator --store etcd://...`: options are CoordinatorServer's (the same for every term)."""
    from tfcluster import pki, security
    from tfcluster.daemon.coordinator.grpc_server import next_port, read_policy, upgrade_certificate
    from tfcluster.daemon.coordinator.store.etcd import open_etcd

    if options.get("policy_path") is not None:  # a mistake in it stops the start, not a later takeover
        read_policy(options["policy_path"], time.time())
    join_listen = join_listen or next_port(listen)
    me = LeaderInfo(advertised(listen, advertise_host), advertised(join_listen, advertise_host) if tls_dir else "")
    if tls_dir:
        upgrade_certificate(tls_dir)
    credentials = security.Credentials.from_dir(tls_dir, pki.SERVER_CERT, pki.SERVER_KEY).server() if tls_dir \
        else None

    def make_server(store: LeaderStore) -> CoordinatorServer:
        return CoordinatorServer(listen, tls_dir=tls_dir, join_listen=join_listen, store=store, **options)

    HighlyAvailable(make_server, lambda: open_etcd(store_url, etcd_tls), me, listen,
                    join_listen if tls_dir else "", credentials).run()
