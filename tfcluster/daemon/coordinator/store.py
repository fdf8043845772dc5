"""The coordinator's durable state in SQLite: jobs (as JSON documents), nodes, and the job id sequence.

A write happens after every change the coordinator makes, in one transaction, so a restarted coordinator
finds every job it had accepted.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import asdict
from pathlib import Path

from tfcluster.daemon.coordinator.cluster import Node, NodeInfo
from tfcluster.daemon.coordinator.jobs import Job
from tfcluster.daemon.coordinator.scheduler import Gpu

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    state TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY,
    doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""


class Store:
    def __init__(self, state_dir: Path):
        state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / "coordinator.sqlite3"
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)

    def next_job_number(self) -> int:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("INSERT INTO counters(name, value) VALUES('job', 1) "
                                 "ON CONFLICT(name) DO UPDATE SET value = value + 1")
                (value,) = self._db.execute("SELECT value FROM counters WHERE name = 'job'").fetchone()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            return value

    def save(self, jobs: list[Job], nodes: list[Node]) -> None:
        if not jobs and not nodes:
            return
        with self._lock:
            self._db.execute("BEGIN")
            try:
                for job in jobs:
                    self._db.execute(
                        "INSERT INTO jobs(id, seq, state, doc) VALUES(?, ?, ?, ?) "
                        "ON CONFLICT(id) DO UPDATE SET state = excluded.state, doc = excluded.doc",
                        (job.id, int(job.created * 1e6), job.state, job.to_json()))
                for node in nodes:
                    doc = {"info": asdict(node.info), "state": node.state}
                    self._db.execute("INSERT INTO nodes(name, doc) VALUES(?, ?) "
                                     "ON CONFLICT(name) DO UPDATE SET doc = excluded.doc",
                                     (node.info.name, json.dumps(doc)))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def load_jobs(self) -> list[Job]:
        with self._lock:
            rows = self._db.execute("SELECT doc FROM jobs ORDER BY seq").fetchall()
        return [Job.from_json(doc) for (doc,) in rows]

    def load_nodes(self) -> list[Node]:
        with self._lock:
            rows = self._db.execute("SELECT doc FROM nodes ORDER BY name").fetchall()
        nodes = []
        for (doc,) in rows:
            data = json.loads(doc)
            info = data["info"]
            info["gpus"] = tuple(Gpu(**g) for g in info["gpus"])
            info["port_range"] = tuple(info["port_range"])
            nodes.append(Node(info=NodeInfo(**info), state=data["state"]))
        return nodes

    def close(self) -> None:
        with self._lock:
            self._db.close()
