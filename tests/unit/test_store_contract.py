"""The store contract (store/api.py), the same for every store: documents put and deleted by kind and key with the
revision the writer expects, a refused expectation refuses the whole batch, and what a write acknowledged is
there when the store is opened again (after a kill -9, for a store that outlives its process). Then how --store
picks a store, and a SQLite file of an earlier release opened by this one."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from tfcluster.daemon.coordinator.store.api import KINDS, Conflict, Delete, MemoryStore, Put, Store, StoreUrlError
from tfcluster.daemon.coordinator.store.etcd_gateway import EtcdTls
from tfcluster.daemon.coordinator.store.open import open_store
from tfcluster.daemon.coordinator.store.sqlite import LAYOUT_VERSION, SqliteStore


@dataclass
class Kind:
    """One kind of store: the URL that opens it at a location (a test's tmp dir, or its etcd prefix)."""
    name: str
    url: Callable[[pytest.FixtureRequest, Path], str]
    outlives_process: bool


def _sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"sqlite://{tmp_path}/state/documents.sqlite3"


def _memory(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"memory://{uuid.uuid4().hex}"


def _etcd(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A prefix of its own on the session's three-member etcd cluster (skipped without etcd)."""
    return request.getfixturevalue("etcd_cluster").url(request.getfixturevalue("etcd_prefix"))


STORES = [Kind("sqlite", _sqlite, True), Kind("memory", _memory, False), Kind("etcd", _etcd, True)]


def etcd_tls(kind: Kind) -> EtcdTls | None:
    """The tests' etcd serves loopback alone, over plain HTTP: said out loud, as a coordinator must."""
    return EtcdTls(insecure=True) if kind.name == "etcd" else None


@pytest.fixture(params=STORES, ids=[k.name for k in STORES])
def kind(request) -> Kind:
    return request.param


@pytest.fixture
def reopen(kind, request, tmp_path) -> Callable[[], Store]:
    url = kind.url(request, tmp_path)
    return lambda: open_store(url, tmp_path / "unused", etcd_tls(kind))


@pytest.fixture
def store(reopen):
    s = reopen()
    yield s
    s.close()


def revisions(store: Store) -> dict[tuple[str, str], int]:
    return {(d.kind, d.key): d.revision for d in store.load()}


def bodies(store: Store) -> dict[tuple[str, str], str]:
    return {(d.kind, d.key): d.body for d in store.load()}


JOB = json.dumps({"id": "a-1-xyz1", "number": 1, "request_id": "r1"})


def test_every_kind_is_put_read_back_and_deleted(store):
    docs = {("job", "a-1-xyz1"): JOB, ("task", "a-1-xyz1/worker:0"): '{"state":"RUNNING"}',
            ("evaluation", "a-1-xyz1//shared/ckpt/ckpt-10"): '{"step":10}', ("node", "n1"): '{"state":"READY"}',
            ("token", "abc123"): '{"id":"abc123"}', ("removal", "n2"): '{"node":"n2"}',
            ("holder", "n1"): '{"node":"n1"}', ("counter", "next_job_number"): "7",
            ("usage", "a-0-xyz1"): '{"gpu_seconds":3600.0}', ("sweep", "a-sweep1-xyz1"): '{"number":1}',
            ("usage_hour", "hour/1764950400/0123456789abcdef"): '{"jobs":40}'}
    assert {k for k, _ in docs} == set(KINDS)
    written = store.write([Put(kind, key, body) for (kind, key), body in docs.items()])
    assert bodies(store) == docs
    assert revisions(store) == written and all(r > 0 for r in written.values())
    store.write([Delete(kind, key, written[(kind, key)]) for kind, key in docs if kind != "node"])
    assert bodies(store) == {("node", "n1"): '{"state":"READY"}'}


def test_a_write_needs_the_revision_the_document_has(store):
    first = store.write([Put("node", "n1", '{"v":1}')])[("node", "n1")]
    with pytest.raises(Conflict, match="node 'n1'"):
        store.write([Put("node", "n1", '{"v":2}')])  # expected absent: it exists
    second = store.write([Put("node", "n1", '{"v":2}', first)])[("node", "n1")]
    assert second > first
    with pytest.raises(Conflict):
        store.write([Put("node", "n1", '{"v":3}', first)])  # a stale writer
    with pytest.raises(Conflict):
        store.write([Delete("node", "n1", first)])
    with pytest.raises(Conflict):
        store.write([Delete("node", "n2", 1)])  # nothing to delete
    assert bodies(store) == {("node", "n1"): '{"v":2}'}
    store.write([Delete("node", "n1", second)])
    third = store.write([Put("node", "n1", '{"v":4}')])[("node", "n1")]
    assert third > second, "a revision is never given twice: a writer that saw the old document is refused"


def test_a_batch_with_one_refused_write_stores_nothing(store):
    kept = store.write([Put("counter", "next_job_number", "2"), Put("node", "n1", "{}")])
    before = store.load()
    with pytest.raises(Conflict):
        store.write([Put("job", "a-1-xyz1", JOB), Put("counter", "next_job_number", "3", kept[("counter",
                                                                                             "next_job_number")]),
                     Delete("node", "n1", kept[("node", "n1")]), Put("node", "n2", "{}", 99)])
    assert sorted(store.load(), key=str) == sorted(before, key=str)


def test_a_malformed_batch_is_refused_whole(store):
    with pytest.raises(ValueError, match="unknown document kind"):
        store.write([Put("node", "n1", "{}"), Put("tables", "x", "{}")])
    with pytest.raises(ValueError, match="twice"):
        store.write([Put("node", "n1", "{}"), Put("node", "n1", "{}")])
    assert store.load() == []


def test_what_was_written_is_there_when_opened_again(store, reopen):
    written = store.write([Put("job", "a-1-xyz1", JOB), Put("task", "a-1-xyz1/worker:0", "{}")])
    store.close()
    again = reopen()
    try:
        assert revisions(again) == written and bodies(again)[("job", "a-1-xyz1")] == JOB
        again.write([Put("job", "a-1-xyz1", JOB, written[("job", "a-1-xyz1")])])  # the revisions read are current
    finally:
        again.close()


def test_two_writers_on_one_store_the_stale_one_is_refused(store, reopen):
    base = store.write([Put("node", "n1", '{"by":"a"}')])[("node", "n1")]
    other = reopen()  # another coordinator, on the same documents
    try:
        other.write([Put("node", "n1", '{"by":"b"}', revisions(other)[("node", "n1")])])
        with pytest.raises(Conflict):
            store.write([Put("node", "n1", '{"by":"a again"}', base)])
        assert bodies(store)[("node", "n1")] == '{"by":"b"}'
    finally:
        other.close()


@pytest.mark.parametrize("kind", [k for k in STORES if k.outlives_process], ids=lambda k: k.name)
def test_what_a_write_acknowledged_survives_a_kill_9(kind, request, tmp_path):
    url = kind.url(request, tmp_path)
    child = f"""
import os, signal
from pathlib import Path
from tfcluster.daemon.coordinator.store.api import Put
from tfcluster.daemon.coordinator.store.etcd_gateway import EtcdTls
from tfcluster.daemon.coordinator.store.open import open_store
store = open_store({url!r}, Path({str(tmp_path)!r}), {etcd_tls(kind)!r})
for i in range(20):
    store.write([Put("task", f"a-1-xyz1/worker:{{i}}", "{{}}")])
print("acknowledged", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == -9 and done.stdout == "acknowledged\n", done.stderr
    store = open_store(url, tmp_path, etcd_tls(kind))
    try:
        assert set(bodies(store)) == {("task", f"a-1-xyz1/worker:{i}") for i in range(20)}
    finally:
        store.close()


# ---- choosing a store -----------------------------------------------------------------------------

def test_the_store_url_picks_the_store(tmp_path):
    default = open_store("", tmp_path / "state")
    assert default.location == str(tmp_path / "state" / "coordinator.sqlite3")
    assert oct(os.stat(tmp_path / "state").st_mode & 0o777) == "0o700"
    default.close()
    chosen = open_store(f"sqlite://{tmp_path}/elsewhere/cluster.db", tmp_path / "state")
    assert chosen.location == f"{tmp_path}/elsewhere/cluster.db" and Path(chosen.location).exists()
    chosen.close()
    assert isinstance(open_store("memory://", tmp_path), MemoryStore)


@pytest.mark.parametrize("url, says", [
    ("sqlite://relative/path.db", "ABSOLUTE"), ("sqlite:///var/lib/", "ABSOLUTE"), ("/var/lib/x.db", "a URL"),
    ("etcd://", "HOST:PORT"), ("etcd://h1,h2:2379/p", "HOST:PORT"), ("postgres://db/x", "unknown scheme 'postgres'")])
def test_a_store_url_that_names_no_store_is_an_error_naming_the_flag(tmp_path, url, says):
    with pytest.raises(StoreUrlError, match=f"^--store '{url}': .*{says}"):
        open_store(url, tmp_path)


# ---- SQLite files of earlier releases ---------------------------------------------------------------

V3_TABLES = """
CREATE TABLE jobs (id TEXT PRIMARY KEY, number INTEGER NOT NULL, request_id TEXT NOT NULL, doc TEXT NOT NULL);
CREATE TABLE tasks (job_id TEXT NOT NULL, key TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (job_id, key));
CREATE TABLE evaluations (job_id TEXT NOT NULL, checkpoint TEXT NOT NULL, doc TEXT NOT NULL,
                          PRIMARY KEY (job_id, checkpoint));
CREATE TABLE nodes (name TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE trust (kind TEXT NOT NULL, key TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (kind, key));
PRAGMA user_version = 3;
"""


def test_a_file_of_0_2_or_0_3_opens_with_every_document_and_stays_readable_by_them(tmp_path):
    path = tmp_path / "coordinator.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(V3_TABLES)
    db.execute("INSERT INTO jobs VALUES ('a-1-xyz1', 1, 'r1', ?)", (JOB,))
    db.execute("INSERT INTO tasks VALUES ('a-1-xyz1', 'worker:0', '{}')")
    db.execute("INSERT INTO evaluations VALUES ('a-1-xyz1', '/c/ckpt-1', '{}')")
    db.execute("INSERT INTO nodes VALUES ('n1', '{}')")
    db.execute("INSERT INTO counters VALUES ('next_job_number', 2), ('cluster_tag', 50000)")
    db.execute("INSERT INTO trust VALUES ('holder', 'n1', '{}')")
    db.commit()
    db.close()
    store = SqliteStore(path)
    assert bodies(store) == {("job", "a-1-xyz1"): JOB, ("task", "a-1-xyz1/worker:0"): "{}",
                             ("evaluation", "a-1-xyz1//c/ckpt-1"): "{}", ("node", "n1"): "{}",
                             ("counter", "next_job_number"): "2", ("counter", "cluster_tag"): "50000",
                             ("holder", "n1"): "{}"}
    current = revisions(store)
    store.write([Put("task", "a-1-xyz1/worker:0", '{"v":2}', current[("task", "a-1-xyz1/worker:0")]),
                 Put("job", "a-2-xyz1", json.dumps({"number": 2, "request_id": ""}))])
    store.close()
    # What the earlier release reads: the same columns, this release's rows among them.
    db = sqlite3.connect(path)
    assert db.execute("SELECT id, number FROM jobs ORDER BY number").fetchall() == [("a-1-xyz1", 1), ("a-2-xyz1", 2)]
    assert db.execute("SELECT doc FROM tasks").fetchall() == [('{"v":2}',)]
    db.close()


def test_a_file_without_the_usage_ledger_gets_its_table(tmp_path):
    path = tmp_path / "coordinator.sqlite3"
    SqliteStore(path).close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE usage")
    db.execute("PRAGMA user_version = 4")
    db.commit()
    db.close()
    store = SqliteStore(path)
    store.write([Put("usage", "a-1-xyz1", '{"gpu_seconds":1.0}')])
    store.close()
    assert bodies(SqliteStore(path)) == {("usage", "a-1-xyz1"): '{"gpu_seconds":1.0}'}


def test_a_file_of_a_newer_release_is_refused_not_misread(tmp_path):
    path = tmp_path / "coordinator.sqlite3"
    SqliteStore(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {LAYOUT_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(RuntimeError, match=f"newer tfcluster \\(store layout {LAYOUT_VERSION + 1}; this release "
                                           f"reads up to {LAYOUT_VERSION}\\)"):
        SqliteStore(path)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == LAYOUT_VERSION + 1


def test_an_etcd_nobody_answers_at_is_an_error_naming_its_endpoints(tmp_path):
    from harness import free_port
    from tfcluster.daemon.coordinator.store.api import StoreUnavailable
    endpoints = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    with pytest.raises(StoreUnavailable, match=f"cannot reach etcd at {endpoints}: .*connection refused"):
        open_store(f"etcd://{endpoints}/tfcluster", tmp_path, EtcdTls(insecure=True))


def test_etcd_tls_files_go_with_an_etcd_store_only(tmp_path):
    with pytest.raises(StoreUrlError, match="--etcd-ca/--etcd-cert/--etcd-key go with --store etcd://"):
        open_store("", tmp_path, EtcdTls(ca="/etc/etcd/ca.pem"))
    with pytest.raises(StoreUrlError, match="--etcd-insecure goes with --store etcd://"):
        open_store("sqlite:///tmp/x.sqlite3", tmp_path, EtcdTls(insecure=True))
    with pytest.raises(StoreUrlError, match="--etcd-cert and --etcd-key go together"):
        open_store("etcd://127.0.0.1:2379", tmp_path, EtcdTls(ca="/ca.pem", cert="/c.pem"))
    with pytest.raises(StoreUrlError, match="--etcd-insecure and --etcd-ca contradict each other"):
        open_store("etcd://127.0.0.1:2379", tmp_path, EtcdTls(ca="/ca.pem", insecure=True))


def test_etcd_over_plain_http_is_refused_unless_said_out_loud(tmp_path):
    """Whoever reaches etcd reads and changes the whole state: without TLS files or --etcd-insecure the store is
    not opened, and nothing is sent to etcd (no member listens here)."""
    from harness import free_port
    from tfcluster.daemon.coordinator.store.api import StoreUnavailable
    url = f"etcd://127.0.0.1:{free_port()}/tfcluster"
    with pytest.raises(StoreUrlError) as refused:
        open_store(url, tmp_path)
    assert str(refused.value) == (
        f"--store {url}: etcd would be reached over plain HTTP: give --etcd-ca, --etcd-cert and --etcd-key (etcd "
        f"with client-certificate auth), or --etcd-insecure if you accept that anyone who can reach etcd reads and "
        f"changes the cluster's state")
    with pytest.raises(StoreUnavailable, match="connection refused"):  # told so: it goes on to reach etcd
        open_store(url, tmp_path, EtcdTls(insecure=True))
