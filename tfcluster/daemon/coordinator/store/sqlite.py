"""The embedded store: the documents in one SQLite file (`--store sqlite:///PATH`, the default under the state dir).

The tables are this module's own affair: one per kind of record (the trust kinds share one, the counters hold
integers), each row with its revision, and one row holding the last revision given. A file of a release without
the usage ledger gets its table on open, and one without sweeps their table (with no change of layout). The file of a 0.2 or 0.3 coordinator is the same but for the revisions,
added on open (its rows start at revision 1, and that release can still open the file); a 0.1 file's jobs table is reshaped to hold the same documents it held, which
migrate.py then brings to this release's shape. WAL mode with synchronous=FULL: once `write` returns, the
batch survives a kill -9 and a power cut.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from tfcluster.daemon.coordinator.store.api import Conflict, Delete, Document, Put, Revisions, Write, validate

LAYOUT_VERSION = 5  # 4: no usage table; 3: 0.2 and 0.3 (no revisions); below 3 with a jobs table: 0.1
TABLES = """
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
CREATE TABLE IF NOT EXISTS usage (
    job_id TEXT PRIMARY KEY,
    doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sweeps (
    id TEXT PRIMARY KEY,
    doc TEXT NOT NULL,
    revision INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS usage_hours (
    key TEXT PRIMARY KEY,
    doc TEXT NOT NULL,
    revision INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS store_revision (
    value INTEGER NOT NULL
);
"""
# Tables that came without a new layout: a release before them opens the file as it was and ignores them.
UNLAYERED_TABLES = [TABLES[TABLES.index(f"CREATE TABLE IF NOT EXISTS {name}"):].partition(";")[0]
                    for name in ("sweeps", "usage_hours")]
# table -> its key columns, and the column that holds the document
KEY_COLUMNS = {"jobs": ("id",), "tasks": ("job_id", "key"), "evaluations": ("job_id", "checkpoint"),
               "nodes": ("name",), "counters": ("name",), "trust": ("kind", "key"), "usage": ("job_id",),
               "sweeps": ("id",), "usage_hours": ("key",)}
TABLE_OF = {"job": "jobs", "task": "tasks", "evaluation": "evaluations", "node": "nodes", "counter": "counters",
            "token": "trust", "removal": "trust", "holder": "trust", "usage": "usage", "sweep": "sweeps",
            "usage_hour": "usage_hours"}
KIND_OF = {"jobs": "job", "tasks": "task", "evaluations": "evaluation", "nodes": "node", "counters": "counter",
           "usage": "usage", "sweeps": "sweep", "usage_hours": "usage_hour"}


def _row(w: Write) -> tuple[str, tuple]:
    """The table a document lives in, and its key columns' values there."""
    table = TABLE_OF[w.kind]
    if table == "trust":
        return table, (w.kind, w.key)
    if table in ("tasks", "evaluations"):
        job_id, sep, rest = w.key.partition("/")
        if not sep:
            raise ValueError(f"{w.kind} key {w.key!r}: expected JOB_ID/NAME")
        return table, (job_id, rest)
    return table, (w.key,)


# The columns a document sets besides its key: the counters hold integers; the jobs table keeps a job's number
# and request id beside it (older releases read them there).
BODY_COLUMNS = {table: ("doc",) for table in KEY_COLUMNS} | {"counters": ("value",),
                                                             "jobs": ("number", "request_id", "doc")}


def _body(table: str, body: str) -> tuple:
    if table == "counters":
        return (int(json.loads(body)),)
    if table == "jobs":
        doc = json.loads(body)
        return int(doc.get("number", 0)), doc.get("request_id", ""), body
    return (body,)


def _where(table: str) -> str:
    return " AND ".join(f"{c} = ?" for c in KEY_COLUMNS[table])


# Each statement writes a row only if it has the expected revision (inserting: only if there is none).
INSERT = {t: f"INSERT INTO {t}({', '.join((*KEY_COLUMNS[t], *BODY_COLUMNS[t], 'revision'))}) "
             f"VALUES({', '.join('?' * (len(KEY_COLUMNS[t]) + len(BODY_COLUMNS[t]) + 1))})" for t in KEY_COLUMNS}
UPDATE = {t: f"UPDATE {t} SET {', '.join(f'{c} = ?' for c in (*BODY_COLUMNS[t], 'revision'))} "
             f"WHERE {_where(t)} AND revision = ?" for t in KEY_COLUMNS}
DELETE = {t: f"DELETE FROM {t} WHERE {_where(t)} AND revision = ?" for t in KEY_COLUMNS}


def _statement(w: Write, revision: int) -> tuple[str, tuple]:
    """The SQL that writes one document, and its parameters."""
    table, key = _row(w)
    if isinstance(w, Delete):
        return DELETE[table], (*key, w.expect)
    if w.expect == 0:
        return INSERT[table], (*key, *_body(table, w.body), revision)
    return UPDATE[table], (*_body(table, w.body), revision, *key, w.expect)


class SqliteStore:
    def __init__(self, path: Path, private_dir: bool = False):
        """private_dir: the file's directory is the coordinator's own (its state dir), readable by it alone."""
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if private_dir:
            # Job specs hold their environment (secrets, often): the owner alone reads the state.
            os.chmod(path.parent, 0o700)
        self.path = self.location = str(path)
        # SQLite gives its WAL and shared-memory files the database file's mode.
        os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()  # load at start, then writes from the writer thread
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > LAYOUT_VERSION:  # its documents may hold what this release cannot read: never guess
                self._db.close()
                raise RuntimeError(f"{self.path}: written by a newer tfcluster (store layout {version}; this release "
                                   f"reads up to {LAYOUT_VERSION}): run that release, or restore a backup made "
                                   f"before the upgrade")
            with self._transaction():
                if version < LAYOUT_VERSION:
                    self._upgrade_layout(version)
                for table in UNLAYERED_TABLES:  # sweeps, the usage ledger's hours
                    self._db.execute(table)

    def _upgrade_layout(self, version: int) -> None:
        db = self._db
        if version < 3 and "seq" in self._columns_of("jobs"):  # 0.1: one document per job, keyed by seq
            db.execute("ALTER TABLE jobs RENAME TO jobs_v1")
            db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, number INTEGER NOT NULL, request_id TEXT NOT NULL, "
                       "doc TEXT NOT NULL)")
            db.execute("INSERT INTO jobs(id, number, request_id, doc) SELECT id, seq, '', doc FROM jobs_v1")
            db.execute("DROP TABLE jobs_v1")
        for statement in TABLES.split(";"):
            db.execute(statement)
        for table in KEY_COLUMNS:
            if "revision" not in self._columns_of(table):
                db.execute(f"ALTER TABLE {table} ADD COLUMN revision INTEGER NOT NULL DEFAULT 1")
        if db.execute("SELECT 1 FROM store_revision").fetchone() is None:
            db.execute("INSERT INTO store_revision(value) VALUES(1)")
        db.execute(f"PRAGMA user_version = {LAYOUT_VERSION}")

    def _columns_of(self, table: str) -> set[str]:
        return {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}

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

    def load(self) -> list[Document]:
        documents = []
        with self._lock:
            for table, keys in KEY_COLUMNS.items():
                body = "value" if table == "counters" else "doc"
                for *key, text, revision in self._db.execute(f"SELECT {', '.join(keys)}, {body}, revision FROM {table}"):
                    kind, name = key if table == "trust" else (KIND_OF[table], "/".join(key))
                    documents.append(Document(kind, name, str(text), revision))
        return documents

    def write(self, writes: Sequence[Write]) -> Revisions:
        """Each statement checks the expected revision in its WHERE clause (or, inserting, the primary key): the
        writes of one kind of statement go in one executemany, and fewer rows changed than written is a Conflict."""
        validate(writes)
        with self._lock, self._transaction():
            self._db.execute("UPDATE store_revision SET value = value + 1")
            revision = self._db.execute("SELECT value FROM store_revision").fetchone()[0]
            statements: dict[str, list[tuple[Write, tuple]]] = {}
            for w in writes:
                sql, parameters = _statement(w, revision)
                statements.setdefault(sql, []).append((w, parameters))
            for sql, rows in statements.items():
                try:
                    changed = self._db.executemany(sql, [parameters for _, parameters in rows]).rowcount
                except sqlite3.IntegrityError:  # inserted, but there already
                    changed = -1
                if changed != len(rows):
                    raise self._conflict([w for w, _ in rows], revision)
            return {(w.kind, w.key): revision for w in writes if isinstance(w, Put)}

    def _conflict(self, writes: list[Write], revision: int) -> Conflict:
        """Names the write that found its document at another revision (the others of its statement may have
        been applied already, at this batch's revision; the transaction is rolled back after)."""
        for w in writes:
            table, key = _row(w)
            row = self._db.execute(f"SELECT revision FROM {table} WHERE {_where(table)}", key).fetchone()
            found = row[0] if row else 0
            if found not in (w.expect, revision) and (found or isinstance(w, Put)):
                return Conflict(f"{w.kind} {w.key!r} is at revision {found}, the write expected {w.expect}")
        return Conflict(f"one of {len(writes)} {writes[0].kind} documents to delete is gone already")

    def close(self) -> None:
        with self._lock:
            self._db.close()
