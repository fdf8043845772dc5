"""Many people, one cluster, tried the way bob would try it: with his own user certificate, over real TLS, against
a real coordinator, dashboard and agent, he cannot stop, read the logs of, follow, open, or see the environment
and command of alice's job, and every refusal names alice; his own job works; a viewer reads but cannot submit
or stop; an admin does everything; and the cluster keeps working after every refusal."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

import grpc
import pytest

from harness import LocalCluster, free_port, wait_until
from tfcluster.api.v1 import control_pb2, control_pb2_grpc

SECRET = "hunter2-in-alices-env"


class Person:
    """Credentials of the cluster's CA for one person, used by the CLI (TFCLUSTER_TLS_DIR), gRPC and HTTPS."""

    def __init__(self, cluster: LocalCluster, role: str, name: str):
        self.cluster, self.name = cluster, name
        self.dir = cluster.root / "people" / name
        cluster.cli("ca", "issue", "--dir", str(cluster.ca_dir), "--role", role, "--name", name, "--out",
                    str(self.dir), check=True)

    def cli(self, *args: str, check: bool = False):
        return self.cluster.cli(*args, check=check, env={"TFCLUSTER_TLS_DIR": str(self.dir)})

    def stub(self) -> control_pb2_grpc.ControlServiceStub:
        from tfcluster.security import Credentials
        return control_pb2_grpc.ControlServiceStub(Credentials.from_dir(self.dir).channel(self.cluster.address))

    def fetch(self, base: str, path: str) -> tuple[int, bytes]:
        context = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
        context.load_cert_chain(str(self.dir / "client.crt"), str(self.dir / "client.key"))
        try:
            with urllib.request.urlopen(base + path, context=context, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


@pytest.fixture(scope="module")
def people(tmp_path_factory):
    http = f"127.0.0.1:{free_port()}"
    cluster = LocalCluster(root=tmp_path_factory.mktemp("people"))
    try:
        cluster.start_coordinator("--http-listen", http)
        cluster.start_agents({"a": {"gpus": 4}})
        yield cluster, f"https://{http}", {name: Person(cluster, role, name) for role, name in
                                           (("user", "alice"), ("user", "bob"), ("viewer", "grafana"))}
    finally:
        cluster.teardown()


def start(person: Person, name: str, *command: str, running: bool = True) -> str:
    job_id = person.cli("start", "--name", name, "--strategy", "mirrored", "--gpus-per-task", "1",
                        "--env", f"API_KEY={SECRET}", "--", *command, check=True).stdout.strip()
    if running:
        wait_until(lambda: person.cluster.job(job_id)["state"] == "RUNNING", 30, what=f"{job_id} to run")
    return job_id


def refused(result, job_id: str, owner: str) -> bool:
    return result.returncode != 0 and f"job {job_id} belongs to {owner}" in result.stderr


def test_bob_cannot_stop_read_follow_or_open_alices_job_and_is_told_whose_it_is(people):
    cluster, dashboard, p = people
    alice, bob = p["alice"], p["bob"]
    job = start(alice, "alices", "sh", "-c", 'echo "key is $API_KEY"; sleep 300')
    wait_until(lambda: SECRET in alice.cli("logs", job, "worker:0").stdout, 20, what="alice's task to print")
    assert refused(bob.cli("stop", job), job, "alice")
    assert refused(bob.cli("stop", job, "--now"), job, "alice")
    assert refused(bob.cli("logs", job, "worker:0"), job, "alice")
    assert refused(bob.cli("dashboard", job), job, "alice")
    with pytest.raises(grpc.RpcError) as watch:
        next(iter(bob.stub().WatchJob(control_pb2.WatchJobRequest(job_id=job), timeout=10)))
    assert watch.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert watch.value.details() == f"job {job} belongs to alice"
    for path in (f"/api/jobs/{job}", f"/jobs/{job}", f"/api/jobs/{job}/tasks/worker:0/log"):
        status, body = bob.fetch(dashboard, path)
        assert status == 403 and f"job {job} belongs to alice".encode() in body, (path, status, body[:200])
    assert cluster.job(job)["state"] == "RUNNING", "a refusal changed nothing"
    status, body = alice.fetch(dashboard, f"/api/jobs/{job}/tasks/worker:0/log?tail=5")
    assert status == 200 and SECRET.encode() in body, "alice reads her own log on the dashboard"


def test_bob_sees_alices_job_state_owner_and_size_but_nothing_it_could_leak(people):
    cluster, dashboard, p = people
    alice, bob = p["alice"], p["bob"]
    job = start(alice, "leaky", "sh", "-c", 'echo "failing with $API_KEY"; exit 3', running=False)
    wait_until(lambda: cluster.job(job)["restarts"] >= 1 or cluster.job(job)["state"] == "FAILED", 30,
               what="alice's job to fail once")
    assert SECRET in json.dumps(json.loads(alice.cli("status", job, "--json", check=True).stdout))
    for args in (("status", job, "--json"), ("status", "--json")):
        text = bob.cli(*args, check=True).stdout
        assert SECRET not in text and "API_KEY" not in text, args
        seen = next(j for j in json.loads(text)["jobs"] if j["id"] == job)
        assert seen["owner"] == "alice" and seen["state"] == cluster.job(job)["state"]
        assert len(seen["tasks"]) == 1 and len(seen["tasks"][0]["gpus"]) == 1
        assert all(not t["address"] and not t["tf_config"] and not t["pid"] for t in seen["tasks"])
    table = bob.cli("status", check=True).stdout
    assert "alice" in table and SECRET not in table, "status shows the owner column"
    response = bob.stub().ListJobs(control_pb2.ListJobsRequest(), timeout=10)
    assert SECRET not in str(response) and any(j.owner == "alice" for j in response.jobs)
    status, body = bob.fetch(dashboard, "/api/jobs")
    rows = {row["id"]: row for row in json.loads(body)["jobs"]}
    assert status == 200 and SECRET.encode() not in body
    assert rows[job]["owner"] == "alice" and rows[job]["readable"] is False and rows[job]["gpus"] == 1


def test_bobs_own_job_works_viewers_read_but_cannot_submit_or_stop_and_an_admin_does_everything(people):
    cluster, dashboard, p = people
    alice, bob, viewer = p["alice"], p["bob"], p["grafana"]
    mine = start(bob, "bobs", "sh", "-c", 'echo "bob was here"; sleep 300')
    wait_until(lambda: "bob was here" in bob.cli("logs", mine, "worker:0").stdout, 20, what="bob's own log")
    assert bob.cli("status", mine, "--json", check=True).stdout.count("bob") >= 1
    link = bob.cli("dashboard", mine, check=True)
    assert "/login?token=" in link.stdout + link.stderr
    bob.cli("stop", mine, check=True)
    assert cluster.wait_job(mine)["state"] == "STOPPED"

    alices = start(alice, "watched", "sh", "-c", 'echo "$API_KEY"; sleep 300')
    result = viewer.cli("start", "--name", "viewers", "--strategy", "mirrored", "--", "true")
    assert result.returncode != 0 and "may not call SubmitJob" in result.stderr
    result = viewer.cli("stop", alices)
    assert result.returncode != 0 and "may not call StopJob" in result.stderr
    wait_until(lambda: SECRET in viewer.cli("logs", alices, "worker:0").stdout, 20, what="a viewer to read logs")
    status, _ = viewer.fetch(dashboard, f"/api/jobs/{alices}")
    assert status == 200, "the operators' read-only role reads every job"

    assert SECRET in cluster.cli("logs", alices, "worker:0", check=True).stdout, "the admin reads alice's log"
    cluster.cli("stop", alices, check=True)
    assert cluster.wait_job(alices)["state"] == "STOPPED"

    after = bob.cli("start", "--name", "after", "--strategy", "mirrored", "--", "true", check=True).stdout.strip()
    assert cluster.wait_job(after)["state"] == "SUCCEEDED", "the cluster works on after every refusal"
