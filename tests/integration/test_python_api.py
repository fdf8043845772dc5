"""The Python API (`from tfcluster import Cluster`) drives jobs start to finish against a real coordinator and
agent over mutual TLS: a spec given as TOML text, a dict or a file, its workdir shipped; wait, typed statuses,
logs, scalars, stop; and each refusal raised as the exception of its kind, with the coordinator's words."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import LocalCluster, free_port, wait_until
from tfcluster import Cluster, ClusterError, InvalidRequest, NotFound, PermissionDenied, Unreachable
from tfcluster.statuses import JobStatus

# A task of the job reports an evaluation through its events file, as the built-in evaluator does, then stays a
# second: a task of milliseconds is reported once, by its exit, and a watcher would never see its job RUNNING.
REPORT = ('import json, os, time\n'
          'print("hello from", os.environ["TFCLUSTER_TASK_TYPE"], flush=True)\n'
          'with open(os.environ["TFCLUSTER_EVENTS_FILE"], "a") as f:\n'
          '    f.write(json.dumps({"kind": "evaluation", "checkpoint": "ckpt-7", "step": 7, "time": time.time(),\n'
          '                        "metrics": {"loss": 0.25, "accuracy": 0.9}}) + "\\n")\n'
          'time.sleep(1.0)\n')


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = LocalCluster(root=tmp_path_factory.mktemp("pyapi"))
    try:
        cluster.start_coordinator()
        cluster.start_agents({"a": {}})
        yield cluster
    finally:
        cluster.teardown()


def user(cluster: LocalCluster, name: str) -> Path:
    return cluster.person(name)


def test_a_job_from_toml_text_runs_its_shipped_code_to_success(cluster, tmp_path, monkeypatch, capfd):
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "report.py").write_text(REPORT)
    monkeypatch.setenv("TFCLUSTER_COORDINATOR", cluster.address)  # the CLI's configuration, read the same way
    monkeypatch.setenv("TFCLUSTER_TLS_DIR", str(cluster.admin_dir))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    seen = []
    with Cluster() as c:
        job = c.start(f'name = "api-toml"\nstrategy = "mirrored"\nworkdir = "{workdir}"\n'
                      f'command = ["python3", "report.py"]\n')
        assert "code: 1 file" in capfd.readouterr().err, "the workdir was packed and sent"
        ended = job.wait(on_change=lambda status: seen.append(status.state))  # each change, streamed
        assert isinstance(ended, JobStatus) and ended.state == "SUCCEEDED", ended
        assert seen[-1] == "SUCCEEDED" and "RUNNING" in seen, seen
        worker = ended.tasks[0]
        assert (worker.name, worker.exit_code, worker.signal, ended.last_failure) == ("worker:0", 0, None, None)
        assert job.log_text("worker:0") == "hello from worker\n"
        assert b"".join(job.logs()) == b"hello from worker\n", "no task named: the primary's log"
        wait_until(lambda: job.scalars(), 10, what="the evaluation to reach the coordinator")
        rows = job.scalars()
        assert [(r["metric"], r["value"], r["step"], r["checkpoint"]) for r in rows] == \
            [("accuracy", 0.9, 7, "ckpt-7"), ("loss", 0.25, 7, "ckpt-7")]
        assert job.id in [j.id for j in c.jobs(states=("SUCCEEDED",))]


def test_another_users_job_is_refused_as_permission_denied_and_its_owner_stops_it(cluster, tmp_path):
    alice = Cluster(cluster.address, user(cluster, "alice"))
    bob = Cluster(cluster.address, tls_dir=str(user(cluster, "bob")))
    with alice, bob:
        job = alice.start({"name": "alices", "strategy": "mirrored", "workdir": "/",
                           "command": ["sh", "-c", "echo started; sleep 300"]})
        wait_until(lambda: job.status().state == "RUNNING", 30, what="alice's job to run")
        assert job.status().owner == "alice"
        for refused in (lambda: bob.job(job.id).stop(), lambda: bob.job(job.id).stop(graceful=False),
                        lambda: list(bob.job(job.id).logs("worker:0")), lambda: bob.job(job.id).wait()):
            with pytest.raises(PermissionDenied, match=f"job {job.id} belongs to alice"):
                refused()
        assert job.status().state == "RUNNING", "the refusals changed nothing"
        assert job.stop() == "STOPPED"
        assert job.status().state == "STOPPED"


def test_bad_input_unknown_jobs_and_no_coordinator_raise_errors_of_their_kind(cluster, tmp_path):
    with Cluster(cluster.address, cluster.admin_dir) as c:
        with pytest.raises(InvalidRequest, match="strategy"):
            c.start({"name": "x", "strategy": "no-such-strategy", "command": ["true"], "workdir": "/"})
        with pytest.raises(InvalidRequest, match="not valid TOML"):
            c.start("name = \n")
        with pytest.raises(InvalidRequest, match="cannot read"):
            c.start(tmp_path / "absent.toml")
        with pytest.raises(InvalidRequest, match="TYPE:INDEX"):
            c.job("x").logs("boss:0")
        with pytest.raises(NotFound, match="unknown job 'nosuch-1-x'"):
            c.job("nosuch-1-x").status()
        spec = tmp_path / "job.toml"
        spec.write_text('name = "planned"\nstrategy = "mirrored"\ncommand = ["true"]\n')
        plan = c.plan(spec)
        assert plan.fits and [(t.task_type, t.node) for t in plan.tasks] == [("worker", "a")]
    with Cluster(f"127.0.0.1:{free_port()}", cluster.admin_dir) as nowhere:
        with pytest.raises(Unreachable, match="cannot reach the coordinator"):
            nowhere.status()
    assert issubclass(Unreachable, ClusterError) and InvalidRequest.exit_code == 2
