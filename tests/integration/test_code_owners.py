"""Code is its uploaders', tried the way bob would try it: with his own user certificate, over real TLS,
against a real coordinator and real agents, bob cannot run the tree alice uploaded by naming its sha256 in a
raw SubmitJob, cannot learn from CodeStatus that the coordinator holds it, and cannot claim it by naming it
in an upload; each refusal reads exactly as the answer for code that is not there. Bob, who holds the same
tree, uploads it whole and owns it too, through a restart of the coordinator. A node gets a job's code, from
the coordinator or from another node's peer port, only for a task of its own, and is otherwise answered as
for code that is not there. Alice's jobs run after every attempt."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import textwrap

import grpc
import pytest

from harness import LocalCluster, wait_until
from test_people import Person
from tfcluster import wire
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc, control_pb2, control_pb2_grpc, types_pb2
from tfcluster.spec import JobSpec, RoleSpec

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tasks switch to their job's UID only under a root agent")

UNKNOWN = "sha256:" + "e" * 64
TRAIN = textwrap.dedent("""
    import sys, time
    print(open("secret.txt").read().strip(), flush=True)
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
""")


@pytest.fixture(scope="module")
def people(tmp_path_factory):
    cluster = LocalCluster(root=tmp_path_factory.mktemp("owners"))
    try:
        cluster.start_coordinator()
        cluster.start_agents({"a": {}, "b": {}})
        yield cluster, {name: Person(cluster, "user", name) for name in ("alice", "bob", "carol")}
    finally:
        cluster.teardown()


def workdir(root, secret: str, name: str):
    """A tree of code with a spec in it; the same secret makes the same tree, so the same archive."""
    root.mkdir(parents=True)
    (root / "train.py").write_text(TRAIN)
    (root / "secret.txt").write_text(secret + "\n")
    (root / "job.toml").write_text(f'name = "{name}"\nstrategy = "multi_worker_mirrored"\n'
                                   f'command = ["python3", "train.py"]\n')
    return root / "job.toml"


def archives(cluster) -> set[str]:
    return {p.name for p in (cluster.root / "coordinator" / "code").glob("*.tar.gz")}


def start(person: Person, spec, *args: str):
    """`tfcluster start` of the spec as person: (job id, what it said of the code)."""
    result = person.cli("start", *args, str(spec), check=True)
    said = re.search(r"^code: .*$", result.stderr, re.M)
    return result.stdout.strip(), said.group(0) if said else ""


def uploaded(cluster, person: Person, spec) -> tuple[str, str, int]:
    """person starts the spec's first upload: (the job, the archive's name, its size)."""
    before = archives(cluster)
    job, said = start(person, spec)
    assert said.endswith(", uploaded"), said
    (name,) = archives(cluster) - before
    return job, f"sha256:{name[:-len('.tar.gz')]}", (cluster.root / "coordinator" / "code" / name).stat().st_size


def owners(cluster, sha256: str) -> list[str]:
    return json.loads((cluster.root / "coordinator" / "code" / f"{sha256[7:]}.owners").read_text())["owners"]


def raw_spec(sha256: str, name: str, *args: str, nodes: tuple[str, ...] = ()):
    return wire.spec_to_proto(JobSpec(name=name, strategy="multi_worker_mirrored",
                                      command=("python3", "train.py", *args), workdir="/",
                                      roles={"worker": RoleSpec(count=1, nodes=nodes)}, code_sha256=sha256))


def submit_raw(stub, sha256: str, name: str = "raw") -> tuple[grpc.StatusCode, str] | str:
    """A SubmitJob naming the archive: the job's id, or (code, details) of the refusal."""
    try:
        return stub.SubmitJob(control_pb2.SubmitJobRequest(spec=raw_spec(sha256, name)), timeout=10).job_id
    except grpc.RpcError as e:
        return e.code(), e.details()


def same_words(one: tuple, other: tuple, names: tuple[str, str]) -> bool:
    """Two refusals that differ only by the name each echoes back."""
    return one[0] == other[0] and one[1].replace(names[0], "NAME") == other[1].replace(names[1], "NAME")


def succeeds(cluster, job_id: str) -> str:
    job = cluster.wait_job(job_id, timeout=90)
    assert job["state"] == "SUCCEEDED", job
    return cluster.cli("logs", job_id, "worker:0", check=True).stdout


def test_bob_cannot_run_see_or_claim_alices_code_by_its_name(people):
    cluster, p = people
    alice, bob = p["alice"], p["bob"]
    job, sha, size = uploaded(cluster, alice, workdir(cluster.root / "alice-tree", "alice's weights", "alices"))
    assert "alice's weights" in succeeds(cluster, job)
    assert owners(cluster, sha) == ["alice"]
    bobs = bob.stub()

    # A job naming her archive, through the raw API: refused in the words for an archive that is not there.
    refused, absent = submit_raw(bobs, sha), submit_raw(bobs, UNKNOWN)
    assert refused[0] == grpc.StatusCode.FAILED_PRECONDITION and "is not on the coordinator" in refused[1]
    assert same_words(refused, absent, (sha, UNKNOWN))

    # Asking whether it is there tells him nothing: the very answer for an archive that is not.
    asked = bobs.CodeStatus(control_pb2.CodeStatusRequest(sha256=sha, size=size), timeout=10)
    assert asked == bobs.CodeStatus(control_pb2.CodeStatusRequest(sha256=UNKNOWN, size=size), timeout=10)
    assert (asked.complete, asked.received) == (False, 0) and asked.max_bytes > 0

    # Naming it in an upload is no claim: he must send its bytes, which he does not have.
    for offset, data, code, why in ((0, b"x" * 100, grpc.StatusCode.FAILED_PRECONDITION, "send the rest"),
                                    (100, b"x" * (size - 100), grpc.StatusCode.INVALID_ARGUMENT,
                                     "send the archive again")):
        chunk = types_pb2.CodeChunk(sha256=sha, size=size, offset=offset, data=data)
        with pytest.raises(grpc.RpcError) as claimed:
            bobs.UploadCode(iter([chunk]), timeout=10)
        assert claimed.value.code() == code and why in claimed.value.details()
        assert same_words(submit_raw(bobs, sha), absent, (sha, UNKNOWN))
    assert owners(cluster, sha) == ["alice"]

    # Alice's code is hers as before: found at once, and her job runs from it again.
    again, said = start(alice, cluster.root / "alice-tree" / "job.toml")
    assert said.endswith("already on the cluster"), said
    assert "alice's weights" in succeeds(cluster, again)
    # An admin may use anyone's code.
    with cluster.channel() as channel:
        admins = submit_raw(control_pb2_grpc.ControlServiceStub(channel), sha, "admins")
    assert isinstance(admins, str) and "alice's weights" in succeeds(cluster, admins)


def test_bob_who_holds_the_same_tree_uploads_it_and_owns_it_too_through_a_restart(people):
    cluster, p = people
    alice, bob, carol = p["alice"], p["bob"], p["carol"]
    _, sha, size = uploaded(cluster, alice, workdir(cluster.root / "shared-alice", "the lab's model", "lab"))
    shutil.copytree(cluster.root / "shared-alice", cluster.root / "shared-bob")
    before = archives(cluster)
    job, said = start(bob, cluster.root / "shared-bob" / "job.toml")
    assert said.endswith(", uploaded") and sha[7:19] in said, "sent whole, as if it were not there"
    assert archives(cluster) == before, "one archive of one tree"
    assert owners(cluster, sha) == ["alice", "bob"]
    assert "the lab's model" in succeeds(cluster, job)
    assert isinstance(submit_raw(bob.stub(), sha, "bobs"), str), "his own code now, through the raw API too"

    cluster.coordinator.terminate()
    cluster.start_coordinator()
    wait_until(lambda: all(cluster.node_state(n) == "READY" for n in ("a", "b")), 60, what="the agents back")
    for person, complete in ((alice, True), (bob, True), (carol, False)):
        held = person.stub().CodeStatus(control_pb2.CodeStatusRequest(sha256=sha, size=size), timeout=10)
        assert (held.complete, held.received) == ((True, size) if complete else (False, 0)), person.name
    refused = submit_raw(carol.stub(), sha)
    assert same_words(refused, submit_raw(carol.stub(), UNKNOWN), (sha, UNKNOWN))
    job, said = start(alice, cluster.root / "shared-alice" / "job.toml")
    assert said.endswith("already on the cluster") and "the lab's model" in succeeds(cluster, job)


def test_an_archive_from_before_owners_is_its_kept_jobs_owners_and_admins_alone(people):
    cluster, p = people
    alice, bob = p["alice"], p["bob"]
    _, sha, _ = uploaded(cluster, alice, workdir(cluster.root / "old-tree", "from before", "old"))
    (cluster.root / "coordinator" / "code" / f"{sha[7:]}.owners").unlink()  # as an earlier release kept it
    assert isinstance(submit_raw(alice.stub(), sha, "olds"), str), "her kept job names it"
    assert same_words(submit_raw(bob.stub(), sha), submit_raw(bob.stub(), UNKNOWN), (sha, UNKNOWN))
    shutil.copytree(cluster.root / "old-tree", cluster.root / "old-tree-bob")
    job, said = start(bob, cluster.root / "old-tree-bob" / "job.toml")
    assert said.endswith(", uploaded"), said
    assert owners(cluster, sha) == ["alice", "bob"], "recorded now, alice kept as the owner of a job naming it"
    assert "from before" in succeeds(cluster, job)


def test_a_node_gets_a_jobs_code_only_for_a_task_of_its_own(people):
    cluster, p = people
    alice, bob = p["alice"], p["bob"]
    spec = workdir(cluster.root / "long-tree", "alice's long run", "long")
    job, sha, _ = uploaded(cluster, alice, spec)
    assert "alice's long run" in succeeds(cluster, job)
    _, other, _ = uploaded(cluster, bob, workdir(cluster.root / "bobs-tree", "bob's", "bobs"))
    running = alice.stub().SubmitJob(control_pb2.SubmitJobRequest(spec=raw_spec(sha, "long", "300", nodes=("a",))),
                                     timeout=10).job_id
    wait_until(lambda: cluster.job(running)["state"] == "RUNNING", 60, what="alice's job to run on a")

    def fetch(node: str, sha256: str, job_id: str = running):
        request = agent_pb2.FetchCodeRequest(sha256=sha256, job_id=job_id)
        with cluster.channel("node", node) as channel:
            try:
                return b"".join(c.data for c in agent_pb2_grpc.AgentServiceStub(channel).FetchCode(request, timeout=10))
            except grpc.RpcError as e:
                return e.code(), e.details()

    assert hashlib.sha256(fetch("a", sha)).hexdigest() == sha[7:], "node a runs a task of the job"
    absent = fetch("a", UNKNOWN)
    assert absent[0] == grpc.StatusCode.NOT_FOUND
    assert same_words(fetch("a", other), absent, (other[7:19], UNKNOWN[7:19])), "code the job does not name"
    assert same_words(fetch("b", sha), fetch("b", UNKNOWN), (sha[7:19], UNKNOWN[7:19])), "no task of it on b"

    # Node a's peer port, which holds the job's code: b was never sent there for it.
    peer = f"127.0.0.1:{cluster.port_ranges['a'][0]}"

    def get(sha256: str):
        request = agent_pb2.FetchCodeRequest(sha256=sha256, job_id=running)
        with cluster.credentials("node", "b").channel(peer, server_name="127.0.0.1") as channel:
            try:
                return b"".join(c.data for c in agent_pb2_grpc.AgentPeerServiceStub(channel).GetCode(request,
                                                                                                     timeout=30))
            except grpc.RpcError as e:
                return e.code(), e.details()

    refused, not_there = get(sha), get(UNKNOWN)
    assert refused[0] == grpc.StatusCode.NOT_FOUND and "this node holds no code" in refused[1]
    assert same_words(refused, not_there, (sha[:19], UNKNOWN[:19]))
    assert same_words(get(other), not_there, (other[:19], UNKNOWN[:19]))
    assert cluster.job(running)["state"] == "RUNNING", "alice's job runs on"
    alice.cli("stop", running, check=True)
    cluster.wait_job(running, timeout=60)
