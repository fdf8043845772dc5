"""etcd as the store, on a real three-member etcd cluster on loopback: a coordinator on etcd keeps every job,
join token and removal across a kill -9 with nothing on its own disk; `coordinator migrate-store` moves a
SQLite cluster to etcd; batches beyond one etcd transaction; a writer whose guard key moved is refused; a
watch sees every change; one member down changes nothing, and without quorum a write fails at once, saying so,
and succeeds again once quorum is back."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from etcdcluster import EtcdCluster, needs_etcd
from harness import job_processes, wait_until
from tfcluster.daemon.coordinator.store.api import Conflict, Delete, Put, StoreUnavailable
from tfcluster.daemon.coordinator.store.etcd import EtcdStore, Guard
from tfcluster.daemon.coordinator.store.etcd_gateway import NO_QUORUM

pytestmark = needs_etcd


def job_states(cluster) -> dict[str, str]:
    return {j["id"]: j["state"] for j in json.loads(cluster.cli("status", "--all", "--json", check=True).stdout)["jobs"]}


def test_a_coordinator_on_etcd_keeps_every_job_token_and_removal(make_cluster, etcd_cluster, etcd_prefix):
    url = etcd_cluster.url(etcd_prefix)
    cluster = make_cluster(3.0, "--store", url, "--etcd-insecure")
    cluster.start_agent("a")
    cluster.start_agent("b")
    done = cluster.cli("start", "--name", "short", "--strategy", "mirrored", "--wait", "--", "true",
                       check=True).stdout.strip()
    running = cluster.cli("start", "--name", "long", "--strategy", "mirrored", "--", "sleep", "600",
                          check=True).stdout.strip()
    wait_until(lambda: job_states(cluster).get(running) == "RUNNING", 30, what="the long job RUNNING")
    assert "node b removed" in cluster.cli("node", "remove", "b", check=True).stdout
    before = job_states(cluster)
    cluster.coordinator.kill()
    shutil.rmtree(cluster.root / "coordinator", ignore_errors=True)  # the state is etcd's alone
    cluster.start_coordinator("--store", url, "--etcd-insecure")
    assert job_states(cluster) == before == {done: "SUCCEEDED", running: "RUNNING"}
    cluster.start_agent("c")  # joins with the reusable token made before the restart: etcd kept it
    cluster.agents["b"].kill()
    cluster.start_agent("b", wait=False)  # the removal holds: b is refused
    wait_until(lambda: "was removed from the cluster" in cluster.agents["b"].log(), 30, what="b refused")
    assert not (cluster.root / "coordinator" / "coordinator.sqlite3").exists()


def test_without_quorum_changes_are_refused_saying_so_and_running_tasks_keep_running(make_cluster, tmp_path):
    etcd = EtcdCluster(tmp_path / "etcd").start_all()
    try:
        cluster = make_cluster(3.0, "--store", etcd.url(), "--etcd-insecure")
        cluster.start_agents({"a": {}, "b": {}})
        job = cluster.cli("start", "--name", "long", "--strategy", "mirrored", "--", "sleep", "600",
                          check=True).stdout.strip()
        wait_until(lambda: job_processes(job), 30, what="the job's task running")
        task = job_processes(job)[0].pid
        for member in etcd.members[:2]:
            etcd.stop(member)
        refused = cluster.cli("start", "--name", "later", "--strategy", "mirrored", "--", "true", timeout=60)
        assert refused.returncode != 0 and NO_QUORUM in refused.stderr, refused.stderr
        idle = ({"a", "b"} - {cluster.job(job)["tasks"][0]["node"]}).pop()
        for change in (("token", "create"), ("node", "remove", idle)):
            refused = cluster.cli(*change, timeout=60)
            assert refused.returncode == 1 and NO_QUORUM in refused.stderr, (change, refused.stderr)
        assert cluster.job(job)["state"] == "RUNNING", "status answers"
        assert cluster.coordinator.alive and task in [p.pid for p in job_processes(job)]
        for member in etcd.members[:2]:
            etcd.start(member)
        etcd.wait_healthy()
        attempts = []
        later = wait_until(lambda: _submitted(cluster, attempts), 60, what="a submission once quorum is back")
        assert cluster.wait_job(later)["state"] == "SUCCEEDED"
        # Every refused submission stayed in the coordinator's memory and was stored with quorum back, as
        # docs/ha.md says (the first one, and any retry refused while the lease was not yet renewed).
        names = [j["name"] for j in json.loads(cluster.cli("status", "--all", "--json", check=True).stdout)["jobs"]]
        assert sorted(names) == ["later"] * (1 + len(attempts)) + ["long"]
        assert task in [p.pid for p in job_processes(job)], "the running task was never touched"
    finally:
        etcd.stop_all()


def _submitted(cluster, attempts: list) -> str:
    attempts.append(1)
    result = cluster.cli("start", "--name", "later", "--strategy", "mirrored", "--", "true", timeout=60)
    return result.stdout.strip() if result.returncode == 0 else ""


def test_migrate_store_moves_a_sqlite_cluster_to_etcd(make_cluster, etcd_cluster, etcd_prefix):
    cluster = make_cluster()
    cluster.start_agent("a")
    job = cluster.cli("start", "--name", "short", "--strategy", "mirrored", "--wait", "--", "true",
                      check=True).stdout.strip()
    cluster.coordinator.terminate()
    cluster.agents["a"].kill()
    source = f"sqlite://{cluster.root}/coordinator/coordinator.sqlite3"
    url = etcd_cluster.url(etcd_prefix)
    refused = cluster.cli("coordinator", "migrate-store", "--from", source, "--to", url)
    assert refused.returncode == 2 and "give --etcd-ca" in refused.stderr, refused.stderr
    moved = cluster.cli("coordinator", "migrate-store", "--from", source, "--to", url, "--etcd-insecure")
    assert moved.returncode == 0, moved.stderr
    assert "WITHOUT TLS (--etcd-insecure)" in moved.stderr, moved.stderr
    assert moved.stdout.startswith("copied ") and "1 job" in moved.stdout and f"to {url}" in moved.stdout
    again = cluster.cli("coordinator", "migrate-store", "--from", source, "--to", url, "--etcd-insecure")
    assert again.returncode == 1 and "holds" in again.stderr and "give --force" in again.stderr
    forced = cluster.cli("coordinator", "migrate-store", "--from", source, "--to", url, "--force", "--etcd-insecure")
    assert forced.returncode == 0, forced.stderr
    (cluster.root / "coordinator" / "coordinator.sqlite3").unlink()  # from now on, etcd alone holds the cluster
    cluster.start_coordinator("--store", url, "--etcd-insecure")
    assert job_states(cluster) == {job: "SUCCEEDED"}
    cluster.start_agent("a")  # its certificate's holder record and the join token came along
    second = cluster.cli("start", "--name", "after", "--strategy", "mirrored", "--wait", "--", "true",
                         check=True).stdout.strip()
    assert second != job and job_states(cluster)[second] == "SUCCEEDED"


def test_a_batch_larger_than_one_etcd_transaction_is_written_whole(etcd_cluster, etcd_prefix):
    store = EtcdStore(etcd_cluster.endpoints.split(","), etcd_prefix)
    big = "x" * 300_000  # four of these are more than one request may carry
    writes = [Put("task", f"a-1-xyz1/worker:{i}", "{}") for i in range(300)] + \
             [Put("evaluation", f"a-1-xyz1//c/ckpt-{i}", json.dumps({"pad": big})) for i in range(6)] + \
             [Put("job", "a-1-xyz1", "{}")]
    revisions = store.write(writes)
    assert {(d.kind, d.key): d.revision for d in store.load()} == revisions and len(revisions) == 307
    store.write([Delete(kind, key, revision) for (kind, key), revision in revisions.items()])
    assert store.load() == [] and store.count() == 0


def test_a_split_batch_puts_a_job_after_its_tasks_and_deletes_it_before_them(etcd_cluster, etcd_prefix):
    store = EtcdStore(etcd_cluster.endpoints.split(","), etcd_prefix, max_txn_ops=4)
    batch = [Put("job", "a-2-xyz1", "{}"), *(Put("task", f"a-2-xyz1/worker:{i}", "{}") for i in range(5)),
             *(Delete("task", f"a-1-xyz1/worker:{i}", 1) for i in range(5)), Delete("job", "a-1-xyz1", 1)]
    chunks = [[(w.kind, type(w).__name__) for w in chunk] for chunk in store._chunks(batch)]
    flat = [item for chunk in chunks for item in chunk]
    assert max(len(c) for c in chunks) == 3, "one compare of each transaction is kept for the guard"
    assert flat.index(("job", "Put")) > max(i for i, w in enumerate(flat) if w == ("task", "Put"))
    assert flat.index(("job", "Delete")) < min(i for i, w in enumerate(flat) if w == ("task", "Delete"))


def test_a_batch_cut_short_by_the_store_is_retried_without_a_conflict(etcd_cluster, etcd_prefix, monkeypatch):
    store = EtcdStore(etcd_cluster.endpoints.split(","), etcd_prefix, max_txn_ops=11)
    first = store.write([Put("node", f"n{i}", "{}") for i in range(25)])
    transaction, calls = store._transaction, []

    def fails_second(writes):
        calls.append(len(writes))
        if len(calls) == 2:
            raise StoreUnavailable(NO_QUORUM)
        return transaction(writes)
    monkeypatch.setattr(store, "_transaction", fails_second)
    batch = [Put("node", f"n{i}", '{"v":2}', first[("node", f"n{i}")]) for i in range(20)] + \
            [Delete("node", f"n{i}", first[("node", f"n{i}")]) for i in range(20, 25)]
    with pytest.raises(StoreUnavailable):
        store.write(batch)
    assert calls == [10, 10], "the first transaction was stored, the second was not"
    store.write(batch)  # the writer retries what it still believes: the store knows what it wrote already
    assert {d.key: d.body for d in store.load()} == {f"n{i}": '{"v":2}' for i in range(20)}


def test_a_transaction_whose_answer_was_lost_counts_as_written_once_read_back(etcd_cluster, etcd_prefix,
                                                                             monkeypatch):
    store = EtcdStore(etcd_cluster.endpoints.split(","), etcd_prefix)
    first = store.write([Put("node", "n1", "{}"), Put("node", "n2", "{}")])
    transaction = store._transaction

    def committed_but_unanswered(writes):
        transaction(writes)
        raise StoreUnavailable(f"{NO_QUORUM} (etcd: request timed out)")
    monkeypatch.setattr(store, "_transaction", committed_but_unanswered)
    batch = [Put("node", "n1", '{"v":2}', first[("node", "n1")]), Delete("node", "n2", first[("node", "n2")]),
             Put("node", "n3", "{}")]
    with pytest.raises(StoreUnavailable):
        store.write(batch)
    monkeypatch.setattr(store, "_transaction", transaction)
    store.write(batch)  # retried as the writer still sees it: no Conflict with its own committed write
    assert {d.key: d.body for d in store.load()} == {"n1": '{"v":2}', "n3": "{}"}


def test_a_writer_whose_guard_key_moved_is_refused(etcd_cluster, etcd_prefix):
    store = EtcdStore(etcd_cluster.endpoints.split(","), etcd_prefix)
    leader_key = f"{etcd_prefix}-leader"
    held = store.gateway.call("/v3/kv/put", {"key": _b64(leader_key), "value": _b64("me")})
    store.guard = Guard(leader_key, int(held["header"]["revision"]))
    store.write([Put("node", "n1", "{}")])
    store.gateway.call("/v3/kv/put", {"key": _b64(leader_key), "value": _b64("another")})
    with pytest.raises(Conflict, match=f"the key {leader_key} is at revision .*this writer no longer holds it"):
        store.write([Put("node", "n2", "{}")])
    assert [d.key for d in store.load()] == ["n1"]


def test_a_watch_sees_every_change_after_a_revision(etcd_cluster, etcd_prefix):
    store = EtcdStore(etcd_cluster.endpoints.split(","), etcd_prefix)
    store.write([Put("node", "before", "{}")])
    store.load()
    since = store.revision
    put = store.write([Put("node", "n1", '{"v":1}'), Put("job", "a-1-xyz1", "{}")])
    store.write([Delete("node", "n1", put[("node", "n1")])])
    changes = store.watch(since)
    seen = [next(changes) for _ in range(3)]
    assert [(c.kind, c.key, c.body) for c in seen] == [("node", "n1", '{"v":1}'), ("job", "a-1-xyz1", "{}"),
                                                       ("node", "n1", None)]
    assert seen[0].revision == put[("node", "n1")] < seen[2].revision
    changes.close()


def test_one_member_down_changes_nothing_and_no_quorum_is_said_at_once(tmp_path):
    etcd = EtcdCluster(tmp_path).start_all()
    try:
        store = EtcdStore(etcd.endpoints.split(","), "/tfcluster")
        etcd.stop(etcd.members[0])
        store.write([Put("node", "n1", "{}")])  # two of three: still a quorum
        etcd.stop(etcd.members[1])
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=NO_QUORUM):
            store.write([Put("node", "n2", "{}")])
        assert time.monotonic() - started < 30
        for member in etcd.members[:2]:
            etcd.start(member)
        etcd.wait_healthy()
        # The refused write, retried as its writer still sees it: etcd may have committed it once quorum came
        # back (a member holds a proposal it timed out on); either way the retry is no Conflict.
        wait_until(lambda: _writes(store, Put("node", "n2", "{}")), 30, what="writes once quorum is back")
        store.write([Put("node", "n3", "{}")])
        assert {d.key for d in store.load()} == {"n1", "n2", "n3"}
    finally:
        etcd.stop_all()


def _writes(store: EtcdStore, put: Put) -> bool:
    try:
        store.write([put])
        return True
    except StoreUnavailable:
        return False


def _b64(text: str) -> str:
    import base64
    return base64.b64encode(text.encode()).decode()
