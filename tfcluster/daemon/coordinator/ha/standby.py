"""A standby coordinator: it answers every call with where the leader is, and keeps a warm copy of the state.

The refusal is UNAVAILABLE (clients and agents retry it) with the leader's address in the trailing metadata key
LEADER_METADATA and in the message, on the gRPC port and on the join port alike: an agent or a CLI given several
coordinators goes straight to the leader (tfcluster/leaders.py).

The warm copy is every document of the store, loaded once and then kept current from etcd's watch: the standby
that wins the election builds its cluster from it instead of reading the whole state again, once it has checked
that the copy holds everything the old leader wrote.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2

from tfcluster.daemon.coordinator.rpc.listener import Listener
from tfcluster.daemon.coordinator.store.api import Document, StoreUnavailable
from tfcluster.daemon.coordinator.store.etcd import EtcdStore
from tfcluster.daemon.coordinator.store.etcd_gateway import b64, range_end
from tfcluster.leaders import LEADER_METADATA, standby_message

log = logging.getLogger("tfcluster.coordinator")

CATCH_UP_SECONDS = 1.0  # how long a new leader waits for its warm copy to show the last writes, then loads
RETRY_SECONDS = 1.0
WATCH_METHOD = "/grpc.health.v1.Health/Watch"
LEADER_POLL_SECONDS = 0.1  # how often a standby with watchers looks whether the leader it knows changed
# Open watches one caller may hold on a standby: an agent needs one (two while it moves between coordinators); a
# holder of a certificate opening thousands would otherwise keep as many calls open for nothing.
WATCHES_PER_CALLER = 4


class Refusal(grpc.GenericRpcHandler):
    """Every method of every service: UNAVAILABLE naming the leader (leader() gives its address, "" if none).

    The health check's Watch is refused too, but only once the leader is no longer the one the caller follows
    (the request's `service` names its address): until then the call stays open and costs nothing. Agents watch
    every standby this way instead of asking one every few seconds (tfcluster/daemon/agent/session/pulse.py), so
    the standbys of 5,000 agents no longer answer a thousand health checks a second, and every agent hears of a
    new leader the moment a standby does."""

    def __init__(self, leader: Callable[[], str]):
        self.leader = leader
        self._changed: asyncio.Event | None = None  # set, and replaced, when leader() changes; None: no watcher
        self._watchers = 0
        self._by_caller: dict = {}  # a caller's certificate identities (its address without TLS) -> its watches
        self._follower: asyncio.Task | None = None  # kept: the loop holds its tasks weakly

    def service(self, handler_call_details):
        if handler_call_details.method == WATCH_METHOD:
            return grpc.unary_stream_rpc_method_handler(self._watch,
                                                        request_deserializer=health_pb2.HealthCheckRequest.FromString)
        return grpc.stream_stream_rpc_method_handler(self._refuse)

    async def _refuse(self, requests, context):
        leader = self.leader()
        if leader:
            context.set_trailing_metadata(((LEADER_METADATA, leader),))
        await context.abort(grpc.StatusCode.UNAVAILABLE, standby_message(leader))

    async def _watch(self, request, context):
        """Open while the leader is the one the caller follows (the request names it), then refused naming the leader.
        The call's headers tell the caller that it is held. A caller past WATCHES_PER_CALLER open watches is refused
        at once (it asks again a pulse later)."""
        caller = tuple(context.peer_identities() or ()) or context.peer().rpartition(":")[0]
        if self._by_caller.get(caller, 0) >= WATCHES_PER_CALLER:
            return await self._refuse(None, context)
        self._by_caller[caller] = self._by_caller.get(caller, 0) + 1
        self._watchers += 1
        try:
            if self._changed is None:
                self._changed = asyncio.Event()
                self._follower = asyncio.get_running_loop().create_task(self._follow_leader())
            held = False
            while True:
                changed = self._changed
                if self.leader() != request.service:
                    break
                if not held:  # the caller knows from here on that this standby names its leader (pulse.py)
                    await context.send_initial_metadata(())
                    held = True
                await changed.wait()
        finally:
            self._watchers -= 1
            self._by_caller[caller] -= 1
            if not self._by_caller[caller]:
                del self._by_caller[caller]
        await self._refuse(None, context)

    async def _follow_leader(self) -> None:
        """While anyone watches: wakes the watchers whenever the leader this standby knows changes. One task,
        however many watchers (the leader is read by the campaign's thread: leadership.py)."""
        known = self.leader()
        while self._watchers:
            await asyncio.sleep(LEADER_POLL_SECONDS)
            if self.leader() != known:
                known = self.leader()
                changed, self._changed = self._changed, asyncio.Event()
                changed.set()
        self._changed = None


def refusal_server(listen: str, leader: Callable[[], str], credentials) -> grpc.aio.Server:
    """A server on listen refusing every call, with the coordinator's own TLS (None: plain text). Not started."""
    return Listener(listen, credentials, Refusal(leader)).server


class WarmCopy:
    """The store's documents, loaded once and followed through etcd's watch on a thread of its own."""

    def __init__(self, store: EtcdStore):
        self.store = store
        self.documents: dict[tuple[str, str], Document] = {}
        self.revision = 0  # the last revision the copy has applied
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._follow, name="warm-copy", daemon=True)

    def start(self) -> "WarmCopy":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()  # the watch ends at its next event or when the store is closed

    def _follow(self) -> None:
        while not self.stopped.is_set():
            try:
                loaded = self.store.load()
                with self.lock:
                    self.documents = {(d.kind, d.key): d for d in loaded}
                    self.revision = self.store.revision
                for change in self.store.watch(self.revision):
                    if self.stopped.is_set():
                        return
                    with self.lock:
                        if change.body is None:
                            self.documents.pop((change.kind, change.key), None)
                        else:
                            self.documents[(change.kind, change.key)] = Document(change.kind, change.key,
                                                                                 change.body, change.revision)
                        self.revision = max(self.revision, change.revision)
            except Exception as e:  # etcd away, or a watch cut: load again
                if not self.stopped.is_set():
                    log.warning("the standby's copy of the state stopped following etcd (%s); loading again", e)
            self.stopped.wait(RETRY_SECONDS)

    def current(self) -> list[Document] | None:
        """The documents, once the copy holds every write etcd has (waiting up to CATCH_UP_SECONDS for the
        watch); None when it does not: the caller loads. Called after this coordinator won, when no other
        coordinator can write: what the copy has then cannot fall behind again."""
        deadline = time.monotonic() + CATCH_UP_SECONDS
        while time.monotonic() < deadline:
            try:
                if self._caught_up():
                    with self.lock:
                        log.info("taking over with the standby's copy of the state (%d documents, revision %d)",
                                 len(self.documents), self.revision)
                        return list(self.documents.values())
            except StoreUnavailable:
                return None
            time.sleep(0.05)
        return None

    def _caught_up(self) -> bool:
        """No document changed after the copy's revision, and as many are there as the copy holds (a delete
        changes the count; a delete then a put gives a later revision). One read: the newest document, with
        the count of them all."""
        with self.lock:
            revision, count = self.revision, len(self.documents)
        if not revision:
            return False
        newest = self.store.gateway.call("/v3/kv/range", {
            "key": b64(self.store.prefix), "range_end": range_end(self.store.prefix), "keys_only": True,
            "sort_order": "DESCEND", "sort_target": "MOD", "limit": 1})
        kvs = newest.get("kvs") or [{}]
        return int(kvs[0].get("mod_revision", 0)) <= revision and int(newest.get("count", 0)) == count
