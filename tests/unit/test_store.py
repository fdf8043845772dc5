"""The coordinator's records in a store: only what changed written, everything read back as it was; retention;
and a state dir written by tfcluster 0.1 read into this version's records. (store contract: test_store_contract.py)"""

from __future__ import annotations

import json
import sqlite3

import pytest
from coresim import Sim, info, make_spec

from tfcluster.daemon.coordinator.core.access.trust import Trust
from tfcluster.daemon.coordinator.core.cluster import Cluster
from tfcluster.daemon.coordinator.core.model import job as J
from tfcluster.daemon.coordinator.core.model.node import Drain
from tfcluster.daemon.coordinator.store import migrate
from tfcluster.daemon.coordinator.store.open import open_store
from tfcluster.daemon.coordinator.store.documents import dumps, from_documents, plain
from tfcluster.daemon.coordinator.store.records import Batch, Writer
from tfcluster.model import Evaluation
from tfcluster.states import JobState


def load(store) -> Cluster:
    cluster = Cluster()
    state = from_documents(migrate.upgrade(store))
    for job in state.jobs:
        cluster.add_job(job)
    for node in state.nodes:
        cluster.add_node(node)
    cluster.jobs.continue_numbering(state.next_job_number)
    return cluster


def collect(writer: Writer, cluster: Cluster) -> Batch:
    return writer.collect(cluster.changes)


def write(store, writer: Writer, batch: Batch) -> None:
    writer.written(batch, store.write(list(batch.writes.values())))


def keys(batch: Batch, kind: str) -> list[str]:
    return [key for k, key in batch.writes if k == kind]


def comparable(job: J.Job) -> dict:
    """A job's stored part (what a restarted coordinator must find)."""
    keep = {f: getattr(job, f) for f in ("id", "spec", "number", "request_id", "state", "restarts", "preemptions",
                                        "evaluator_restarts", "message", "created", "finished", "outcome",
                                        "restarting", "not_before", "last_failure", "final_evaluation_until",
                                        "cluster_json", "checkpoint_node", "syncing", "evaluations")}
    keep["tasks"] = [{k: v for k, v in t.__dict__.items() if k not in ("seen", "unsaved", "_tracker")} for t in job.tasks]
    return keep


@pytest.fixture
def store(tmp_path):
    s = open_store("", tmp_path)
    yield s
    s.close()


def test_everything_read_back_as_it_was(store):
    sim = Sim(info("n1", 2), info("n2", 2))
    a, actions = sim.submit(make_spec(gpus=1, worker=2, restart={"max_restarts": 2}), "a")
    sim.running(a, actions)
    sim.exit(a, "worker:1", 3, log_tail=["Traceback", "boom"])  # a failure: last_failure, STOPPING, a stop asked
    b, _ = sim.submit(make_spec(strategy="mirrored", worker=1, gpus=2), "b")  # waits PENDING
    a.add_evaluation(Evaluation("ckpt-1", 10, {"loss": 0.5}, 1.0))
    writer = Writer()
    write(store, writer, collect(writer, sim.c))
    back = load(store)
    assert set(back.jobs) == {a.id, b.id}
    assert comparable(back.jobs[a.id]) == comparable(a) and comparable(back.jobs[b.id]) == comparable(b)
    assert back.jobs[a.id].last_failure.exit.log_tail == ("Traceback", "boom")
    assert {n: back.nodes[n].info for n in back.nodes} == {n: sim.c.nodes[n].info for n in sim.c.nodes}
    assert back.jobs.next_number == sim.c.jobs.next_number == 3
    assert set(back.jobs.live) == {a.id, b.id}


def test_only_what_changed_is_written(store):
    sim = Sim(info("n1"), info("n2"))
    job, actions = sim.submit(make_spec(worker=2))
    writer = Writer()
    first = collect(writer, sim.c)
    write(store, writer, first)
    assert len(keys(first, "job")) == 1 and len(keys(first, "task")) == 2 and len(keys(first, "node")) == 2
    assert not collect(writer, sim.c), "nothing changed: nothing to write"
    sim.report(job, actions[0].attempt.type, actions[0].attempt.index, "RUNNING")
    second = collect(writer, sim.c)
    assert keys(second, "task") == [f"{job.id}/{actions[0].attempt.task_key}"] and keys(second, "node") == []
    write(store, writer, second)
    for i in range(5):
        job.add_evaluation(Evaluation(f"ckpt-{i}", i, {"loss": 1.0 / (i + 1)}, float(i)))
    third = collect(writer, sim.c)
    assert len(keys(third, "evaluation")) == 5
    write(store, writer, third)
    job.add_evaluation(Evaluation("ckpt-5", 5, {"loss": 0.1}, 5.0))
    assert keys(collect(writer, sim.c), "evaluation") == [f"{job.id}/ckpt-5"], "one new evaluation: one document"


def test_trimmed_and_replaced_evaluations(store, monkeypatch):
    monkeypatch.setattr(J, "MAX_EVALUATIONS_KEPT", 3)
    sim = Sim(info("n1"))
    job, _ = sim.submit(make_spec(strategy="mirrored", worker=1))
    writer = Writer()
    for i in range(5):
        job.add_evaluation(Evaluation(f"ckpt-{i}", i, {"m": i}, float(i)))
        write(store, writer, collect(writer, sim.c))
    job.add_evaluation(Evaluation("ckpt-3", 3, {"m": 33}, 9.0))  # evaluated again: replaces its entry
    write(store, writer, collect(writer, sim.c))
    back = load(store).jobs[job.id]
    assert [(e.checkpoint, e.metrics["m"]) for e in back.evaluations] == [("ckpt-2", 2), ("ckpt-4", 4), ("ckpt-3", 33)]


def test_an_ended_jobs_late_evaluation_is_stored(store):
    """A result that reaches the core after its job ended (an agent's resends after a reconnect) is kept, and the
    store has it after the job's end was written."""
    sim = Sim(info("n1"))
    job, actions = sim.submit(make_spec(strategy="mirrored", worker=1, evaluator={"count": 1, "gpus": 0}))
    sim.running(job, actions)
    writer = Writer()
    sim.exit(job, "worker:0", 0, final_checkpoint="ckpt-1")
    sim.exit(job, "evaluator:0", 0)
    assert job.ended
    write(store, writer, collect(writer, sim.c))
    evaluator = job.evaluator()
    sim.c.evaluation(evaluator.node, job.attempt_of(evaluator), Evaluation("ckpt-1", 1, {"m": 1}, 5.0), sim.now)
    write(store, writer, collect(writer, sim.c))
    assert [e.checkpoint for e in load(store).jobs[job.id].evaluations] == ["ckpt-1"]


def test_retention_removes_the_oldest_ended_jobs_with_their_rows(store):
    sim = Sim(info("n1"))
    sim.c.jobs.keep_finished_jobs = 2
    writer = Writer()
    ids = []
    for _ in range(4):
        job, actions = sim.submit(make_spec(strategy="mirrored", worker=1))
        sim.running(job, actions)
        job.add_evaluation(Evaluation("ckpt-1", 1, {}, 1.0))
        sim.exit(job, "worker:0", 0)
        ids.append(job.id)
        sim.now += 1
    sim.c.prune(sim.now)
    assert set(sim.c.jobs) == set(ids[2:])
    write(store, writer, collect(writer, sim.c))
    assert set(load(store).jobs) == set(ids[2:])
    rows = sqlite3.connect(store.path).execute("SELECT DISTINCT job_id FROM tasks UNION SELECT job_id FROM "
                                               "evaluations").fetchall()
    assert {r[0] for r in rows} == set(ids[2:])
    sim.c.jobs.keep_finished_seconds = 0.5  # ... and those ended longer ago than allowed
    sim.now += 1
    sim.c.prune(sim.now)
    assert sim.c.jobs == {} and sim.c.jobs.next_number == 5, "job numbers are never given out twice"


def test_a_failed_write_is_written_again_by_the_next(store, monkeypatch):
    sim = Sim(info("n1"))
    job, _ = sim.submit(make_spec(strategy="mirrored", worker=1))
    writer = Writer()
    batch = collect(writer, sim.c)
    writer.failed(batch, sim.c.changes)  # the disk was full
    again = collect(writer, sim.c)
    assert again.writes == batch.writes and again.next_job_number == 2
    write(store, writer, again)
    assert set(load(store).jobs) == {job.id}


def test_a_batch_takes_the_nodes_that_changed_and_no_node_that_left(store):
    """Nodes tell the writer when they change (it does not look at all of them for each write): a drained node is
    written, one removed since it changed is not, and one whose write failed is written by the next."""
    sim = Sim(info("n1"), info("n2"), info("n3"))
    writer = Writer()
    write(store, writer, collect(writer, sim.c))
    assert not collect(writer, sim.c), "nothing changed: nothing to write"
    sim.c.drain("n1", Drain("disk", "admin", sim.now), False, sim.now)
    sim.c.drain("n2", Drain("disk", "admin", sim.now), False, sim.now)
    sim.c.remove_node("n2", sim.now)
    batch = collect(writer, sim.c)
    assert sorted(batch.writes) == [("node", "n1"), ("node", "n2")]
    assert type(batch.writes[("node", "n2")]).__name__ == "Delete", "a node that left is deleted, not written"
    writer.failed(batch, sim.c.changes)  # the store was away
    again = collect(writer, sim.c)
    assert again.writes == batch.writes
    write(store, writer, again)
    assert not collect(writer, sim.c)
    back = load(store)
    assert sorted(back.nodes) == ["n1", "n3"] and back.nodes["n1"].drain.reason == "disk"


V1_JOB = {
    "id": "digits-3", "spec": {"name": "digits", "strategy": "multi_worker_mirrored", "command": ["python3", "t.py"],
                               "workdir": "/srv", "checkpoint_dir": "", "model_dir": "", "env": {"E": "1"}, "gpus": 1,
                               "roles": {"worker": {"count": 2, "gpus": None, "command": [], "env": {}, "nodes": [],
                                                    "entrypoint": ""}},
                               "restart": {"max_restarts": 3, "backoff_seconds": 0.0, "permanent_exit_codes": [],
                                           "hang_seconds": 0.0},
                               "stop_grace_seconds": 30.0, "evaluator_deadline_seconds": 600.0},
    "strategy": "multi_worker_mirrored", "state": "RUNNING",
    "tasks": [{"type": "worker", "index": i, "node": f"n{i}", "host": f"10.0.0.{i}", "port": 20001,
               "gpus": [{"index": 0, "uuid": f"GPU-{i}", "name": "A100", "memory_mib": 1}], "state": "RUNNING",
               "attempt": 2, "pid": 100 + i, "exit_code": None, "signal": None, "message": "", "log_tail": [],
               "tf_config": "{}", "stop_requested": False, "busy_port": 0, "ready": True, "final_checkpoint": "",
               "output_bytes": 5, "checkpoint": ""} for i in range(2)],
    "restarts": 1, "preemptions": 0, "message": "", "created": 10.0, "finished": 0.0, "outcome": "",
    "not_before": 0.0, "last_failure": {"task": "worker:1", "node": "n1", "exit_code": 1, "signal": None,
                                        "message": "", "log_tail": ["boom"], "time": 12.0, "busy_port": 0},
    "evaluations": [{"checkpoint": "/x/ckpt-1", "step": 5, "metrics": {"loss": 0.3}, "time": 11.0}],
    "final_evaluation_until": 0.0, "evaluator_restarts": 0, "restarting": [], "last_progress": 13.0,
    "node_state_dirs": {"n0": "/var/lib/a", "n1": "/var/lib/b"}, "node_peers": {"n0": "10.0.0.0:20000"},
    "checkpoint_node": "n0", "syncing": 0, "sync_source": "", "sync_until": 0.0, "syncs": 0}


def test_the_state_of_a_0_1_coordinator_is_read_into_these_records(tmp_path):
    db = sqlite3.connect(tmp_path / "coordinator.sqlite3")
    db.executescript("CREATE TABLE jobs (id TEXT PRIMARY KEY, seq INTEGER NOT NULL, state TEXT NOT NULL, "
                     "doc TEXT NOT NULL); CREATE TABLE nodes (name TEXT PRIMARY KEY, doc TEXT NOT NULL);"
                     "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);")
    db.execute("INSERT INTO jobs VALUES ('digits-3', 1, 'RUNNING', ?)", (json.dumps(V1_JOB),))
    node = {"info": {"name": "n0", "address": "10.0.0.0", "port_range": [20001, 20999], "gpus": [], "hostname": "h",
                     "cpu_count": 4, "memory_bytes": 8, "agent_version": "0.1.0", "state_dir": "/var/lib/a",
                     "peer_port": 20000}, "state": "READY"}
    db.execute("INSERT INTO nodes VALUES ('n0', ?)", (json.dumps(node),))
    db.execute("INSERT INTO counters VALUES ('job', 3)")
    db.commit()
    db.close()
    store = open_store("", tmp_path)
    back = load(store)
    job = back.jobs["digits-3"]
    assert job.state == JobState.RUNNING and job.number == 3 and job.restarts == 1 and job.spec.env == {"E": "1"}
    assert [(t.key, t.state, t.attempt, t.pid, t.address) for t in job.tasks] == [
        ("worker:0", "RUNNING", 2, 100, "10.0.0.0:20001"), ("worker:1", "RUNNING", 2, 101, "10.0.0.1:20001")]
    assert job.tasks[0].checkpoint_dir == "/var/lib/a/jobs/digits-3/checkpoints" and job.tasks[0].peer
    assert json.loads(job.cluster_json) == {"worker": ["10.0.0.0:20001", "10.0.0.1:20001"]}
    assert job.last_failure.describe() == "worker:1 on n1 exited with code 1"
    assert [e.checkpoint for e in job.evaluations] == ["/x/ckpt-1"]
    assert back.nodes["n0"].info.peer_port == 20000
    assert back.jobs.next_number == 4, "no job id is issued twice"
    store.close()
    store = open_store("", tmp_path)
    counters = {d.key: d.body for d in store.load() if d.kind == "counter"}
    assert counters["next_job_number"] == "4" and "job" not in counters, "read once; the upgraded state stays"
    assert migrate.upgrade(store) == store.load(), "nothing left to upgrade"
    store.close()


def test_removed_nodes_and_expired_tokens_leave_the_store(store):
    sim = Sim(info("n1"), info("n2"))
    trust = Trust(changes=sim.c.changes)
    trust.create_token(sim.now, ttl=60)
    writer = Writer()
    write(store, writer, writer.collect(sim.c.changes))
    assert {d.kind for d in store.load()} >= {"node", "token"}
    sim.c.remove_node("n2", sim.now)
    trust.expire(sim.now + 60 + 2 * 86400)
    batch = writer.collect(sim.c.changes)
    assert {(type(w).__name__, w.kind) for w in batch.writes.values()} == {("Delete", "node"), ("Delete", "token")}
    write(store, writer, batch)
    assert [d.key for d in store.load() if d.kind in ("node", "token")] == ["n1"]


def test_records_become_the_documents_asdict_would_make_with_nothing_mutable_shared():
    import dataclasses

    from tfcluster.model import TaskExit
    spec = make_spec("parameter_server", env={"A": "1"}, restart={"max_restarts": 2, "permanent_exit_codes": [7]},
                     chief=1, worker=2, ps=1)
    exit = TaskExit(exit_code=1, message="failed", log_tail=("a", "b"))
    for record in (spec, exit):
        assert dumps(plain(record)) == dumps(dataclasses.asdict(record))
    doc = plain(spec)
    assert doc["env"] == spec.env and doc["env"] is not spec.env
    assert doc["roles"]["worker"]["command"] == spec.roles["worker"].command

