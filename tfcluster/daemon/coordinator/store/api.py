"""The store as a contract in documents, and an in-memory store (open.py opens the one --store names).

A document is one of the coordinator's records (a job, a task, an evaluation, a node, a join token, a
certificate holder, a removal, a counter, an entry of the usage ledger, a sweep) as JSON text, named by its kind and key; what the text says is
records.py's business, not the store's. The store gives each document a revision whenever it writes it,
and never gives the same revision twice. The coordinator writes with the revision it expects each document
to have (0: it must not exist yet): when any expectation fails the store refuses the whole write with
Conflict. A coordinator that another one overtook (a replicated store fences the leader's writes the same
way) thus learns so at its next write, before it sends a single command decided on stale state.

`write` stores a batch whole or not at all, and once it returns the batch survives a crash: the
coordinator acknowledges a submission only after the batch that holds it is written. Writes come from one
thread of their own, never the event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, Union

KINDS = ("job", "task", "evaluation", "node", "token", "removal", "holder", "counter", "usage", "usage_hour",
         "sweep")


@dataclass(frozen=True)
class Document:
    kind: str
    key: str
    body: str      # JSON
    revision: int  # given by the store; > 0


@dataclass(frozen=True)
class Put:
    kind: str
    key: str
    body: str
    expect: int = 0  # the document's revision now; 0: it must not exist yet


@dataclass(frozen=True)
class Delete:
    kind: str
    key: str
    expect: int


Write = Union[Put, Delete]
Revisions = dict[tuple[str, str], int]  # (kind, key) -> revision


class Conflict(Exception):
    """A document's revision is not the one the writer expected: another writer wrote since this one read, and
    this one must stop acting on what it believes."""


class StoreUnavailable(OSError):
    """The store cannot take a write now (a replicated store without quorum, or none of its members reachable):
    the batch is not acknowledged, and a later write of the same documents, with the same expectations, may
    succeed. Callers get it as UNAVAILABLE."""


class StoreUrlError(ValueError):
    """--store names no store this coordinator can open."""


class Store(Protocol):
    location: str  # where the documents live, for messages

    def load(self) -> list[Document]:
        """Every document, with its revision."""

    def write(self, writes: Sequence[Write]) -> Revisions:
        """Stores every write or none (Conflict, or an OSError); returns the new revision of each document put."""

    def close(self) -> None: ...


def validate(writes: Sequence[Write]) -> None:
    """ValueError for a kind no store keeps, or a document written twice in one batch (which write would win is
    then unclear)."""
    seen: set[tuple[str, str]] = set()
    for w in writes:
        if w.kind not in KINDS:
            raise ValueError(f"unknown document kind {w.kind!r}")
        if (w.kind, w.key) in seen:
            raise ValueError(f"{w.kind} {w.key!r} is written twice in one batch")
        seen.add((w.kind, w.key))


def check(writes: Sequence[Write], current: Revisions) -> None:
    """Raises Conflict unless every write expects the revision its document has (0: absent)."""
    for w in writes:
        found = current.get((w.kind, w.key), 0)
        if found != w.expect or (isinstance(w, Delete) and not found):
            raise Conflict(f"{w.kind} {w.key!r} is at revision {found}, the write expected {w.expect}")


class _Memory:
    """The documents of one in-memory store, kept for as long as the process lives."""

    def __init__(self) -> None:
        self.documents: dict[tuple[str, str], Document] = {}
        self.revision = 0
        self.lock = threading.Lock()


_NAMED: dict[str, _Memory] = {}
_NAMED_LOCK = threading.Lock()


class MemoryStore:
    """Documents in this process's memory: a store for tests, and for a coordinator whose state may go with it.
    Stores opened with the same name share their documents (a coordinator restarted in the same process finds
    them); the empty name is a store of its own each time."""

    def __init__(self, name: str = ""):
        self.location = f"memory://{name}"
        if not name:
            self._memory = _Memory()
            return
        with _NAMED_LOCK:
            self._memory = _NAMED.setdefault(name, _Memory())

    def load(self) -> list[Document]:
        with self._memory.lock:
            return list(self._memory.documents.values())

    def write(self, writes: Sequence[Write]) -> Revisions:
        memory = self._memory
        validate(writes)
        with memory.lock:
            check(writes, {k: d.revision for k, d in memory.documents.items()})
            memory.revision += 1
            revisions: Revisions = {}
            for w in writes:
                if isinstance(w, Put):
                    memory.documents[(w.kind, w.key)] = Document(w.kind, w.key, w.body, memory.revision)
                    revisions[(w.kind, w.key)] = memory.revision
                else:
                    del memory.documents[(w.kind, w.key)]
                    revisions.pop((w.kind, w.key), None)
            return revisions

    def close(self) -> None:
        pass
