"""Where the coordinator's records live: a small interface, and SQLite as the embedded default.

A store loads everything once at start and then writes batches (records.py): each batch is one
transaction, so a batch is stored whole or not at all. SQLite runs in WAL mode with synchronous=FULL: once
`write` returns, the batch survives a kill -9 and a power cut, which is what lets the coordinator
acknowledge a submission only after its batch is written. Writes run on one thread of their own, never on
the event loop. A replicated store (etcd, say) implements the same three methods with the same documents.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import threading
from pathlib import Path
from typing import Protocol

from tfcluster import layout
from tfcluster.daemon.coordinator.records import Batch, Loaded

SCHEMA_VERSION = 3
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    number INTEGER NOT NULL,
    request_id TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_request ON jobs(request_id) WHERE request_id != '';
CREATE TABLE IF NOT EXISTS tasks (
    job_id TEXT NOT NULL,
    key TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (job_id, key)
);
CREATE TABLE IF NOT EXISTS evaluations (
    job_id TEXT NOT NULL,
    checkpoint TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (job_id, checkpoint)
);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY,
    doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS trust (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (kind, key)
);
"""


class Store(Protocol):
    path: str

    def load(self) -> Loaded: ...

    def write(self, batch: Batch) -> None: ...

    def close(self) -> None: ...


class SqliteStore:
    def __init__(self, state_dir: Path):
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = str(state_dir / layout.COORDINATOR_DB)
        # Job specs hold their environment (secrets, often): the owner alone reads the state (SQLite gives its
        # WAL and shared-memory files the database file's mode).
        os.chmod(state_dir, 0o700)
        os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()  # load at start, then writes from the writer thread
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            with self._transaction():
                if version < SCHEMA_VERSION and self._has_table("jobs"):  # written by tfcluster 0.1
                    from tfcluster.daemon.coordinator.migrate import from_version_1
                    from_version_1(self._db)
                for statement in SCHEMA.split(";"):
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _has_table(self, name: str) -> bool:
        return self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                (name,)).fetchone() is not None

    @contextlib.contextmanager
    def _transaction(self):
        """One transaction; whatever fails inside it, or in its COMMIT (a full disk), leaves none open."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def load(self) -> Loaded:
        with self._lock:
            tasks: dict[str, list[str]] = {}
            for job_id, doc in self._db.execute("SELECT job_id, doc FROM tasks"):
                tasks.setdefault(job_id, []).append(doc)
            evaluations: dict[str, list[str]] = {}
            for job_id, doc in self._db.execute("SELECT job_id, doc FROM evaluations"):
                evaluations.setdefault(job_id, []).append(doc)
            jobs = [(doc, tasks.get(job_id, []), evaluations.get(job_id, []))
                    for job_id, doc in self._db.execute("SELECT id, doc FROM jobs ORDER BY number")]
            nodes = [doc for (doc,) in self._db.execute("SELECT doc FROM nodes ORDER BY name")]
            trust = self._db.execute("SELECT kind, doc FROM trust").fetchall()
            counters = dict(self._db.execute("SELECT name, value FROM counters"))
        return Loaded(jobs=jobs, nodes=nodes, next_job_number=counters.get("next_job_number", 1), trust=trust,
                      cluster_tag=counters.get("cluster_tag") or self._new_cluster_tag())

    def _new_cluster_tag(self) -> int:
        tag = secrets.randbelow(36 ** 4 - 36 ** 3) + 36 ** 3  # four base-36 digits
        with self._lock, self._transaction():
            self._db.execute("INSERT INTO counters(name, value) VALUES('cluster_tag', ?)", (tag,))
        return tag

    def write(self, batch: Batch) -> None:
        with self._lock, self._transaction():
            db = self._db
            db.executemany("INSERT INTO jobs(id, number, request_id, doc) VALUES(?, ?, ?, ?) "
                           "ON CONFLICT(id) DO UPDATE SET doc = excluded.doc", batch.jobs)
            db.executemany("INSERT INTO tasks(job_id, key, doc) VALUES(?, ?, ?) "
                           "ON CONFLICT(job_id, key) DO UPDATE SET doc = excluded.doc", batch.tasks)
            db.executemany("INSERT INTO evaluations(job_id, checkpoint, doc) VALUES(?, ?, ?) "
                           "ON CONFLICT(job_id, checkpoint) DO UPDATE SET doc = excluded.doc", batch.evaluations)
            db.executemany("DELETE FROM evaluations WHERE job_id = ? AND checkpoint = ?", batch.dropped_evaluations)
            db.executemany("INSERT INTO nodes(name, doc) VALUES(?, ?) "
                           "ON CONFLICT(name) DO UPDATE SET doc = excluded.doc", batch.nodes)
            for table, column in (("jobs", "id"), ("tasks", "job_id"), ("evaluations", "job_id")):
                db.executemany(f"DELETE FROM {table} WHERE {column} = ?", [(j,) for j in batch.removed_jobs])
            db.executemany("DELETE FROM nodes WHERE name = ?", [(n,) for n in batch.removed_nodes])
            db.executemany("INSERT INTO trust(kind, key, doc) VALUES(?, ?, ?) "
                           "ON CONFLICT(kind, key) DO UPDATE SET doc = excluded.doc", batch.trust)
            db.executemany("DELETE FROM trust WHERE kind = ? AND key = ?", batch.dropped_trust)
            if batch.next_job_number:
                db.execute("INSERT INTO counters(name, value) VALUES('next_job_number', ?) "
                           "ON CONFLICT(name) DO UPDATE SET value = excluded.value", (batch.next_job_number,))

    def close(self) -> None:
        with self._lock:
            self._db.close()

