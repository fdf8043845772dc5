"""The replicated store: the documents in etcd under a key prefix (`--store etcd://h1:2379,h2:2379,h3:2379/PREFIX`).

Each document is the key `PREFIX/KIND/KEY` holding its JSON text; its revision is etcd's mod_revision of that
key, so a revision is never given twice and every document a transaction puts gets that transaction's revision.
A write is one etcd transaction: a compare per document (mod_revision equal to what the writer expects;
create_revision 0 for "must not exist yet"), the puts and deletes if they all hold. The store-wide `guard`, when
set, is one more compare in every transaction (a leader's key still at the revision it was given): a writer that
lost it is refused whole, with Conflict.

etcd bounds a transaction (--max-txn-ops, 128 by default; --max-request-bytes, 1.5 MiB): a larger batch goes in
several transactions, in an order a crash between them leaves readable (a job's tasks before the job, a job
deleted before its tasks; the loader ignores tasks without their job). When one of them cannot commit (no
quorum), the store remembers what the earlier ones wrote: the next write of those documents, with the revisions
the writer still expects, is brought to the revisions they have now, so retrying the batch is not a Conflict.
A transaction whose answer was lost (etcd timed out on it, and may still commit it) is settled the same way
before the next write: its documents are read, and if it was committed, it counts as written.

`revision` is the etcd revision the store saw last and `watch` streams what changes after one: a process that
keeps a copy of the state (a standby) loads once, then follows the changes.

Whoever reaches etcd reads and changes all of this, join-token hashes and the leader key included: a coordinator
opens the store over plain HTTP only when told to (--etcd-insecure), and says at start what that leaves open.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tfcluster.daemon.coordinator.store.etcd_gateway import (LEADER, NO_LEADER, NO_QUORUM, UNREACHABLE, EtcdGateway,
                                                       EtcdTls, b64, range_end, unb64)
from tfcluster.daemon.coordinator.store.api import (Conflict, Delete, Document, Put, Revisions, StoreUnavailable,
                                                StoreUrlError, Write, validate)

log = logging.getLogger("tfcluster.coordinator")

DEFAULT_PREFIX = "/tfcluster"
MAX_TXN_OPS = 128        # etcd's default --max-txn-ops
MAX_TXN_BYTES = 1 << 20  # under etcd's default --max-request-bytes (1.5 MiB), with room for keys and encoding
PAGE = 1000              # documents per range request at load


def _order(w: Write) -> tuple[int, int]:
    """Where a write goes in a batch split over transactions: puts first, a job put after its tasks and
    evaluations, a job deleted before them (a prefix of the batch leaves no job without its tasks)."""
    if isinstance(w, Delete):
        return 1, 0 if w.kind == "job" else 1
    return 0, 1 if w.kind == "job" else 0


@dataclass(frozen=True)
class Guard:
    """A key that must still be at a revision for any write to be stored (a leader's key)."""
    key: str
    mod_revision: int


@dataclass(frozen=True)
class Change:
    """A document put (body) or deleted (body None) at a revision, as a watch sees it."""
    kind: str
    key: str
    body: str | None
    revision: int


def parse_url(url: str) -> tuple[list[str], str]:
    """etcd://HOST:PORT[,HOST:PORT...][/PREFIX] -> the endpoints and the key prefix."""
    rest = url.partition("://")[2]
    hosts, slash, prefix = rest.partition("/")
    endpoints = [h.strip() for h in hosts.split(",") if h.strip()]
    if not endpoints or any(not h.rpartition(":")[2].isdigit() for h in endpoints):
        raise StoreUrlError(f"--store {url!r}: expected etcd://HOST:PORT[,HOST:PORT...][/PREFIX]")
    prefix = "/" + prefix.strip("/") if slash and prefix.strip("/") else DEFAULT_PREFIX
    return endpoints, prefix


class EtcdStore:
    def __init__(self, endpoints: list[str], prefix: str = DEFAULT_PREFIX, tls: EtcdTls = EtcdTls(),
                 max_txn_ops: int = MAX_TXN_OPS, max_txn_bytes: int = MAX_TXN_BYTES):
        self.gateway = EtcdGateway(endpoints, tls)
        self.prefix = prefix.rstrip("/") + "/"
        self.location = f"etcd://{self.gateway.describe()}{prefix}"
        self.max_ops, self.max_bytes = max_txn_ops - 1, max_txn_bytes  # one compare is the guard's
        self.guard: Guard | None = None
        self.revision = 0
        self._carried: dict[tuple[str, str], tuple[int, int]] = {}  # written by an unfinished batch: (was, now)
        self._uncertain: tuple[list[Write], dict[tuple[str, str], int]] | None = None  # its answer was lost
        self._lock = threading.Lock()
        self.gateway.call("/v3/maintenance/status", {})  # unreachable: the error names the endpoints

    def _key(self, kind: str, key: str) -> str:
        return f"{self.prefix}{kind}/{key}"

    def _document(self, kv: dict[str, Any]) -> Document | None:
        kind, _, key = unb64(kv["key"])[len(self.prefix):].partition("/")
        return Document(kind, key, unb64(kv.get("value", "")), int(kv["mod_revision"])) if key else None

    def load(self) -> list[Document]:
        """Every document, read at one revision page by page."""
        documents: list[Document] = []
        start, end, at = b64(self.prefix), range_end(self.prefix), 0
        while True:
            request = {"key": start, "range_end": end, "limit": PAGE, **({"revision": at} if at else {})}
            answer = self.gateway.call("/v3/kv/range", request)
            at = at or int(answer["header"]["revision"])
            kvs = answer.get("kvs", [])
            documents.extend(d for d in map(self._document, kvs) if d is not None)
            if not answer.get("more") or not kvs:
                break
            start = b64(unb64(kvs[-1]["key"]) + "\0")
        with self._lock:
            self.revision = max(self.revision, at)
        return documents

    def count(self) -> int:
        """How many keys the prefix holds (an empty prefix: 0)."""
        answer = self.gateway.call("/v3/kv/range", {"key": b64(self.prefix), "range_end": range_end(self.prefix),
                                                    "count_only": True})
        return int(answer.get("count", 0))

    def write(self, writes: Sequence[Write]) -> Revisions:
        validate(writes)
        with self._lock:
            health = self.gateway.health() if self._uncertain else LEADER
            if health == NO_LEADER:  # still no quorum: say so at once
                raise StoreUnavailable(f"{NO_QUORUM} (etcd {self.gateway.describe()}: no member knows a leader)")
            if health == UNREACHABLE:
                raise StoreUnavailable(f"cannot reach etcd at {self.gateway.describe()}: no member answers")
            if self._uncertain:
                self._settle(*self._uncertain)
            expected = {(w.kind, w.key): w.expect for w in writes}  # what a retry of this batch will expect
            writes = [w for w in map(self._carry, writes) if w is not None]
            revisions: Revisions = {}
            for chunk in self._chunks(writes):
                try:
                    revisions.update(self._transaction(chunk))
                except StoreUnavailable:  # etcd may commit a proposal it timed out on: read which it was next time
                    self._uncertain = (chunk, expected)
                    raise
                self._stored(chunk, expected, revisions)
            self._carried.clear()
            return revisions

    def _stored(self, chunk: list[Write], expected: dict[tuple[str, str], int], revisions: Revisions) -> None:
        for w in chunk:
            self._carried[(w.kind, w.key)] = (expected[(w.kind, w.key)], revisions.get((w.kind, w.key), 0))

    def _settle(self, chunk: list[Write], expected: dict[tuple[str, str], int]) -> None:
        """Whether the transaction whose answer was lost was committed: its documents are all at one new revision
        (or gone), or all still at the revisions it expected. StoreUnavailable while etcd cannot say."""
        answer = self.gateway.call("/v3/kv/txn", {"success": [
            {"request_range": {"key": b64(self._key(w.kind, w.key)), "keys_only": True}} for w in chunk]})
        found = [int((r.get("response_range", {}).get("kvs") or [{}])[0].get("mod_revision", 0))
                 for r in answer.get("responses", [])]
        puts = {revision for w, revision in zip(chunk, found) if isinstance(w, Put)}
        deleted = all(not revision for w, revision in zip(chunk, found) if isinstance(w, Delete))
        if deleted and len(puts) <= 1 and all(revision > w.expect for w, revision in zip(chunk, found)
                                              if isinstance(w, Put)):
            self._stored(chunk, expected, {(w.kind, w.key): revision for w, revision in zip(chunk, found)})
        self._uncertain = None  # not committed: the retry writes it; anything else is a Conflict then

    def _carry(self, w: Write) -> Write | None:
        """The write as it applies after an unfinished batch stored its document already (None: nothing left)."""
        was, now = self._carried.get((w.kind, w.key), (-1, 0))
        if was != w.expect:
            return w
        if isinstance(w, Delete) and not now:
            return None  # deleted already
        return replace(w, expect=now)

    def _chunks(self, writes: list[Write]) -> Iterator[list[Write]]:
        order = sorted(writes, key=_order)
        chunk: list[Write] = []
        size = 0
        for w in order:
            cost = len(self._key(w.kind, w.key)) * 2 + (len(w.body) if isinstance(w, Put) else 0)
            if cost > self.max_bytes:
                raise ValueError(f"{w.kind} {w.key!r} is {cost} bytes: more than one etcd request may carry")
            if chunk and (len(chunk) == self.max_ops or size + cost > self.max_bytes):
                yield chunk
                chunk, size = [], 0
            chunk.append(w)
            size += cost
        if chunk:
            yield chunk

    def _transaction(self, writes: list[Write]) -> Revisions:
        compares, success, failure = [], [], []
        for w in writes:
            key = b64(self._key(w.kind, w.key))
            if w.expect:
                compares.append({"key": key, "target": "MOD", "result": "EQUAL", "mod_revision": w.expect})
            else:
                compares.append({"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": 0})
            success.append({"request_put": {"key": key, "value": b64(w.body)}} if isinstance(w, Put)
                           else {"request_delete_range": {"key": key}})
            failure.append({"request_range": {"key": key, "keys_only": True}})
        if self.guard is not None:
            compares.append({"key": b64(self.guard.key), "target": "MOD", "result": "EQUAL",
                             "mod_revision": self.guard.mod_revision})
            failure.append({"request_range": {"key": b64(self.guard.key), "keys_only": True}})
        answer = self.gateway.call("/v3/kv/txn", {"compare": compares, "success": success, "failure": failure})
        revision = int(answer["header"]["revision"])
        self.revision = max(self.revision, revision)
        if not answer.get("succeeded"):
            raise self._conflict(writes, answer.get("responses", []))
        return {(w.kind, w.key): revision for w in writes if isinstance(w, Put)}

    def _conflict(self, writes: list[Write], responses: list[dict[str, Any]]) -> Conflict:
        """Names what was not at the revision expected, from the failure branch's reads of every compared key."""
        found = [int((r.get("response_range", {}).get("kvs") or [{}])[0].get("mod_revision", 0)) for r in responses]
        if self.guard is not None and found and found[-1] != self.guard.mod_revision:
            return Conflict(f"the key {self.guard.key} is at revision {found[-1]}, not {self.guard.mod_revision}: "
                            f"this writer no longer holds it")
        for w, revision in zip(writes, found):
            if revision != w.expect or (isinstance(w, Delete) and not revision):
                return Conflict(f"{w.kind} {w.key!r} is at revision {revision}, the write expected {w.expect}")
        return Conflict(f"one of {len(writes)} documents changed while it was written")

    def watch(self, after: int) -> Iterator[Change]:
        """Every change under the prefix after revision `after` (store.revision once loaded), in order, for as
        long as the caller iterates; StoreUnavailable when etcd cannot be reached."""
        request = {"key": b64(self.prefix), "range_end": range_end(self.prefix), "start_revision": after + 1}
        for result in self.gateway.watch(request):
            for event in result.get("events", []):
                kv = event["kv"]
                document = self._document(kv)
                if document is None:
                    continue
                if event.get("type") == "DELETE":
                    yield Change(document.kind, document.key, None, int(kv["mod_revision"]))
                else:
                    yield Change(document.kind, document.key, document.body, document.revision)

    def close(self) -> None:
        self.gateway.close()


def open_etcd(url: str, tls: EtcdTls) -> EtcdStore:
    """The store the URL names, over TLS unless tls.insecure accepts plain HTTP (StoreUrlError otherwise)."""
    endpoints, prefix = parse_url(url)
    try:
        tls.check()
    except ValueError as e:
        raise StoreUrlError(str(e)) from None
    if not tls.ca and not tls.insecure:
        raise StoreUrlError(f"--store {url}: etcd would be reached over plain HTTP: give --etcd-ca, --etcd-cert and "
                            f"--etcd-key (etcd with client-certificate auth), or --etcd-insecure if you accept that "
                            f"anyone who can reach etcd reads and changes the cluster's state")
    return EtcdStore(endpoints, prefix, tls)


def insecure_warning(location: str) -> str:
    """What a coordinator on etcd over plain HTTP leaves open, said once at its start."""
    return (f"the store {location} is reached WITHOUT TLS (--etcd-insecure): anyone on this host or its network "
            f"who reaches etcd reads every key, join-token hashes included, can delete the leader key to force a "
            f"failover, and can change jobs, nodes and tokens; give --etcd-ca, --etcd-cert and --etcd-key "
            f"(docs/ha.md)")
