"""A job's code travels to the nodes that run it: a real coordinator with the archive in its store (placed
there as an upload leaves it), two real agents with state dirs of their own that fetch it once each, unpack it
into their caches and give each task a fresh working directory over it; a small cache drops only what no
running task uses; a node gets a job's code from another node that holds it when the coordinator sends it
there, and a node no task of the job needs gets it from nobody."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import tarfile
import textwrap

import grpc
import pytest

from harness import running_cluster, wait_until
from tfcluster import layout
from tfcluster.api.v1 import agent_pb2, agent_pb2_grpc
from tfcluster.codechunks import CodeError
from tfcluster.daemon.agent.code.fetch import Fetcher
from tfcluster.spec import JobSpec, RoleSpec

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tasks switch to their job's UID only under a root agent")

# Run from the archive itself, as `python3 main.py` in the task's working directory.
MAIN = textwrap.dedent("""
    import json, os, sys, time
    code = os.environ["TFCLUSTER_CODE_DIR"]
    found = {"cwd": os.getcwd(), "listing": sorted(os.listdir(".")), "code_dir": code,
             "data": open("data/input.txt").read(), "code_listing": sorted(os.listdir(code))}
    with open("written-by-the-task.txt", "w") as f:
        f.write("mine")
    try:
        open(os.path.join(code, "intruder.txt"), "w")
        found["code_writable"] = True
    except OSError:
        found["code_writable"] = False
    print(json.dumps(found), flush=True)
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
""")
CACHE_BYTES = 700_000  # one archive of ~200 KB and its tree fit, two do not


def archive(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def store(cluster, data: bytes) -> str:
    """Puts an archive in the coordinator's store, as a finished upload leaves it; returns its name."""
    digest = hashlib.sha256(data).hexdigest()
    directory = cluster.root / "coordinator" / "code"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{digest}.tar.gz").write_bytes(data)
    return f"sha256:{digest}"


def code_tree(padding: bytes) -> dict[str, bytes]:
    return {"main.py": MAIN.encode(), "data/input.txt": b"from the archive\n", "padding.bin": padding}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    extra = {"extra": ["--cache-bytes", str(CACHE_BYTES)]}
    # An agent killed here is started again at once; a loaded machine can take 3 s to start one, which must
    # not count as its node lost (the job would be restarted on b too).
    with running_cluster(tmp_path_factory.mktemp("code"), {"a": extra, "b": extra}, lost_after=8.0) as cluster:
        yield cluster


def submit(cluster, name: str, code: str, *args: str, nodes: tuple[str, ...] = ("a", "b")) -> str:
    """A job of one worker on each of nodes."""
    spec = JobSpec(name=name, strategy="multi_worker_mirrored", command=("python3", "main.py", *args),
                   workdir="/", roles={"worker": RoleSpec(count=len(nodes), nodes=nodes)}, code_sha256=code)
    with cluster.client() as client:
        return client.submit(spec)


def fetches(cluster, node: str) -> int:
    return cluster.agents[node].log().count("code: fetched sha256:")


def cache_entries(cluster, node: str) -> set[str]:
    return {p.name for p in (cluster.agent_state_dir(node) / "code").iterdir() if p.is_dir()}


def test_tasks_run_in_a_fresh_dir_over_the_code_each_node_fetched_once(cluster):
    code_a = store(cluster, archive(code_tree(os.urandom(200_000))))
    first = submit(cluster, "first", code_a)
    job = cluster.wait_job(first, timeout=90)
    assert job["state"] == "SUCCEEDED", job
    assert {t["node"] for t in job["tasks"]} == {"a", "b"}
    for task in job["tasks"]:
        found = json.loads(cluster.cli("logs", first, f"worker:{task['index']}", check=True).stdout.splitlines()[-1])
        state = cluster.agent_state_dir(task["node"])
        attempt = layout.attempt_dir(state, first, "worker", task["index"], task["attempt"])
        assert found["cwd"] == str(attempt / "code" / "cwd")
        assert found["code_dir"] == str(attempt / "code" / "tree"), "the job's own view, never the node's cache"
        assert found["listing"] == ["data", "main.py", "padding.bin"] and found["data"] == "from the archive\n"
        assert found["code_listing"] == found["listing"] and found["code_writable"] is False
        assert "written-by-the-task.txt" not in os.listdir(state / "code" / code_a.split(":")[1])
        assert not os.path.ismount(found["cwd"]), "unmounted once the attempt ended"
    assert fetches(cluster, "a") == fetches(cluster, "b") == 1
    assert "tasks work in overlay mounts over the cached code" in cluster.agents["a"].log(), \
        "a root agent on this kernel mounts an overlay"

    again = submit(cluster, "again", code_a)
    assert cluster.wait_job(again, timeout=90)["state"] == "SUCCEEDED"
    assert fetches(cluster, "a") == fetches(cluster, "b") == 1, "the same code is not fetched again"


def test_a_small_cache_drops_only_what_no_running_task_uses(cluster):
    code_a = store(cluster, archive(code_tree(os.urandom(200_000))))
    code_b = store(cluster, archive(code_tree(os.urandom(200_000))))
    before = {node: fetches(cluster, node) for node in ("a", "b")}
    holder = submit(cluster, "holder", code_a, "300")
    wait_until(lambda: all("listing" in line for line in _last_lines(cluster, holder)), 60, what="holder runs")
    other = submit(cluster, "other", code_b)  # over the cap with code_a: code_a's tasks still run
    assert cluster.wait_job(other, timeout=90)["state"] == "SUCCEEDED"
    hex_a, hex_b = code_a.split(":")[1], code_b.split(":")[1]
    for node in ("a", "b"):  # over the cap: what no task uses went, the running task's code stayed
        wait_until(lambda: cache_entries(cluster, node) == {hex_a}, 10,
                   what=f"node {node} to keep code_a alone ({cache_entries(cluster, node)})")
    cluster.cli("stop", holder, check=True)
    cluster.wait_job(holder, timeout=60)
    assert all(cache_entries(cluster, node) == {hex_a} for node in ("a", "b")), "within the cap nothing goes"
    later = submit(cluster, "later", code_b)
    assert cluster.wait_job(later, timeout=90)["state"] == "SUCCEEDED"
    for node in ("a", "b"):  # code_a, no longer used and the older, made room
        assert cache_entries(cluster, node) == {hex_b}
        assert fetches(cluster, node) == before[node] + 3


def test_a_node_may_fetch_only_the_code_of_a_job_placed_on_it(cluster):
    code = store(cluster, archive(code_tree(b"x")))
    job = submit(cluster, "placed", code, "300")
    wait_until(lambda: cluster.job(job)["state"] == "RUNNING", 60, what="the job to run")
    request = agent_pb2.FetchCodeRequest(sha256=code, job_id=job)
    with cluster.channel("node", "c") as channel:  # a node of the cluster with no task of the job
        with pytest.raises(grpc.RpcError) as info:
            list(agent_pb2_grpc.AgentServiceStub(channel).FetchCode(request, timeout=10))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND  # as for code the coordinator does not hold
    assert "the coordinator holds no code" in info.value.details()
    with cluster.channel("node", "a") as channel:
        chunks = list(agent_pb2_grpc.AgentServiceStub(channel).FetchCode(request, timeout=10))
    assert hashlib.sha256(b"".join(c.data for c in chunks)).hexdigest() == code.split(":")[1]
    with cluster.channel("user", "someone") as channel:
        with pytest.raises(grpc.RpcError) as info:
            list(agent_pb2_grpc.AgentServiceStub(channel).FetchCode(request, timeout=10))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    cluster.cli("stop", job, check=True)
    cluster.wait_job(job, timeout=60)


# Parameter servers and a worker that listen until stopped, and a chief that is done at once.
SERVERS = textwrap.dedent("""
    import os, socket, time
    if os.environ["TFCLUSTER_TASK_TYPE"] in ("ps", "worker"):
        server = socket.socket()
        server.bind(("127.0.0.1", int(os.environ["TFCLUSTER_PORT"])))
        server.listen()
        time.sleep(300)
    print("chief done", flush=True)
""")


def test_a_node_gets_the_code_from_the_node_the_coordinator_sends_it_to_and_no_other_node_does(cluster, tmp_path):
    tree = {"main.py": SERVERS.encode(), "padding.bin": os.urandom(250_000)}
    code = store(cluster, archive(tree))
    role = {"command": ("python3", "main.py"), "nodes": ("a",)}
    spec = JobSpec(name="relayed", strategy="parameter_server", command=("python3", "main.py"), workdir="/",
                   roles={"ps": RoleSpec(count=1, **role), "worker": RoleSpec(count=1, **role),
                          "chief": RoleSpec(count=1, nodes=("b",))}, code_sha256=code)
    with cluster.client() as client:
        job = client.submit(spec)
    assert cluster.wait_job(job, timeout=90)["state"] == "SUCCEEDED"
    peer = f"127.0.0.1:{cluster.port_ranges['a'][0]}"
    # The chief launched once the servers ran on a: its launch named a, and a was told to serve b.
    assert f"{job}: b may fetch its code from a" in cluster.coordinator.log()
    assert re.search(rf"code: fetched {code[:19]} \(\d+ bytes\) from {re.escape(peer)} for {job}",
                     cluster.agents["b"].log()), cluster.agents["b"].log()[-3000:] + cluster.agents["a"].log()[-3000:]
    (cluster.root / "coordinator" / "code" / f"{code.split(':')[1]}.tar.gz").unlink()  # only the nodes have it now
    fetch = Fetcher(cluster.address, lambda: cluster.credentials("node", "c"))  # no task of the job, never sent
    with pytest.raises(CodeError) as stranger:
        fetch(code.split(":")[1], job, (peer,), tmp_path / "refused")
    with pytest.raises(CodeError) as never_there:  # a job whose code node a never ran
        fetch(code.split(":")[1], "another-1-ab12", (peer,), tmp_path / "refused")
    assert "this node holds no code" in str(stranger.value) and "the coordinator" in str(stranger.value)
    assert str(stranger.value).replace(job, "JOB") == str(never_there.value).replace("another-1-ab12", "JOB"), \
        "a node not sent there hears what it would of code that is not there"


def test_a_restarted_agent_unmounts_what_ended_meanwhile_and_keeps_what_runs(cluster):
    code = store(cluster, archive(code_tree(b"small")))
    job = submit(cluster, "restart", code, "300")
    # A job of its own on node b: the restart of the first job's group, once a's agent reports the exit it
    # missed, stops that job's task on b too, and must not be mistaken for a's agent unmounting b's dirs.
    kept = submit(cluster, "kept", code, "300", nodes=("b",))
    wait_until(lambda: all("listing" in line for line in _last_lines(cluster, job)) and
               "listing" in _last_lines(cluster, kept, 1)[0], 60, what="the three tasks run")
    found = {t["node"]: (t, json.loads(line)) for t, line in zip(sorted(cluster.job(job)["tasks"],
                                                                        key=lambda t: t["index"]),
                                                                 _last_lines(cluster, job))}
    kept_cwd = json.loads(_last_lines(cluster, kept, 1)[0])["cwd"]
    assert all(os.path.ismount(f["cwd"]) for _, f in found.values()) and os.path.ismount(kept_cwd)
    cluster.agents["a"].kill()  # kill -9: its task runs on, and ends while no agent watches
    os.kill(found["a"][0]["pid"], signal.SIGKILL)
    wait_until(lambda: not _alive(found["a"][0]["pid"]), 10, what="the task on a to end")
    assert os.path.ismount(found["a"][1]["cwd"]), "nobody unmounted it yet"
    cluster.start_agent("a", extra=["--cache-bytes", str(CACHE_BYTES)])
    wait_until(lambda: not os.path.ismount(found["a"][1]["cwd"]), 10, what="the restarted agent to unmount it")
    assert cluster.job(kept)["state"] == "RUNNING" and os.path.ismount(kept_cwd), "node b's task runs in its own"
    for job_id in (job, kept):
        cluster.cli("stop", job_id, check=True)
        cluster.wait_job(job_id, timeout=60)
    wait_until(lambda: not os.path.ismount(kept_cwd), 10, what="node b to unmount it")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _last_lines(cluster, job_id: str, workers: int = 2) -> list[str]:
    lines = []
    for index in range(workers):
        result = cluster.cli("logs", job_id, f"worker:{index}")
        lines.append(result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "")
    return lines
