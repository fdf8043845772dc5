"""A job's code travels from a directory only the client has to hosts that share nothing but the network.

Three network-namespace hosts, each agent with a state dir (code cache, environments) of its own. Every
`tfcluster start` here runs in a mount namespace of its own, where a tmpfs is mounted over an empty directory
and the job's tree written there: no agent and no coordinator can see those files, so a task that runs and reads
them got them through the archive. The coordinator holds at most CODE_CAP of code per archive, the agents cache at
most CACHE_CAP each and build environments with uv from a wheel this module writes (--uv-find-links, no index),
as an air-gapped site would. No TensorFlow needed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from harness import PYTHON, LocalCluster, wait_until
from tfcluster.demo.hosts import TestHosts, unavailable
from wheels import write_wheel

WHY_NOT = unavailable() or (None if shutil.which("unshare") else "util-linux's `unshare` is not installed")
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")

HOSTS = ("h1", "h2", "h3")
CODE_CAP = "4M"  # the coordinator's --max-code-bytes
CACHE_CAP = 2500 << 10  # each agent's --cache-bytes: two ~1 MiB entries fit, three do not
IGNORED_BYTES = 200 << 20
SAID = re.compile(r"code: (\d+) files?, (.+?), sha256:([0-9a-f]{12})\.\.\., (uploaded|already on the cluster)")

# Reads its data through its working directory, and says whether the client's path exists where it runs.
MAIN = """import hashlib, json, os, sys
print(json.dumps({"cwd": os.getcwd(), "code": os.environ["TFCLUSTER_CODE_DIR"],
                  "data": hashlib.sha256(open("data/words.txt", "rb").read()).hexdigest(),
                  "client_dir_here": os.path.exists(os.path.join(sys.argv[1], "main.py")),
                  "ignored_here": os.path.exists("data/model.huge")}))
"""
PROBE = "import os, sys, tinypkg\nprint(tinypkg.VALUE, sys.prefix == os.environ['VIRTUAL_ENV'])\n"
# Holds its code in use until told to go on, then reads its data again.
HOLD = """import hashlib, os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print(hashlib.sha256(open("data.bin", "rb").read()).hexdigest())
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("travels")
    write_wheel(root / "wheels")
    extra = ["--cache-bytes", str(CACHE_CAP), "--uv-find-links", str(root / "wheels")]
    with TestHosts(len(HOSTS)) as hosts, pytest.MonkeyPatch.context() as patch:
        patch.setenv("UV_NO_INDEX", "1")  # the site's own setting, which the agents pass on to uv: no index at all
        cluster = LocalCluster(root=root / "cluster", coordinator_host=hosts.coordinator_ip)
        try:
            cluster.start_coordinator("--max-code-bytes", CODE_CAP)
            cluster.start_agents({name: {"host_prefix": hosts.prefix(i), "extra": extra}
                                  for i, name in enumerate(HOSTS, start=1)})
            cluster.laptop = root / "laptop"  # empty here, as on every host: the client's files are in its tmpfs
            cluster.laptop.mkdir()
            yield cluster
        finally:
            cluster.teardown()


def tar_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    now = time.time()  # as files just written: a tree written again does not look unchanged to the client
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, now
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def start_from_laptop(cluster: LocalCluster, files: dict[str, bytes], sparse: dict[str, int] | None = None):
    """`tfcluster start spec.toml` in a mount namespace where the tree (files, and sparse files of the sizes given)
    exists only in a tmpfs over cluster.laptop; the mount ends with the namespace's last process."""
    script = ['set -e', 'mount -t tmpfs -o mode=0755 tfcluster-laptop "$1"', 'tar -x -C "$1"',
              *(f'truncate -s {size} "$1/{path}"' for path, size in (sparse or {}).items()),
              'cd "$1"', 'exec "$2" -m tfcluster.cli start spec.toml']
    environment = {**os.environ, **cluster.client_env(), "XDG_CACHE_HOME": str(cluster.root / "client-cache")}
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script), "sh",
                           str(cluster.laptop), PYTHON], input=tar_of(files), capture_output=True, timeout=120,
                          env=environment)


def spec(name: str, command: list[str], nodes: tuple[str, ...] = HOSTS, environment: str = "") -> bytes:
    strategy = "multi_worker_mirrored" if len(nodes) > 1 else "mirrored"
    table = f'[environment]\nrequirements = "{environment}"\n' if environment else ""
    return (f'name = "{name}"\nstrategy = "{strategy}"\ncommand = {json.dumps(command)}\nworkdir = "."\n{table}'
            f'[roles.worker]\ncount = {len(nodes)}\nnodes = {json.dumps(list(nodes))}\n').encode()


def submitted(result: subprocess.CompletedProcess) -> tuple[str, re.Match]:
    """The job id `start` printed, and what it said of the code it sent."""
    assert result.returncode == 0, result.stderr.decode()
    said = SAID.search(result.stderr.decode())
    assert said, result.stderr.decode()
    return result.stdout.decode().split()[0], said


def outputs(cluster: LocalCluster, job_id: str) -> dict[str, str]:
    """Each task's last output line, by the node it ran on."""
    job = cluster.job(job_id)
    return {task["node"]: cluster.cli("logs", job_id, f"worker:{task['index']}", check=True).stdout.splitlines()[-1]
            for task in job["tasks"]}


def succeeded(cluster: LocalCluster, job_id: str, timeout: float = 90) -> dict:
    job = cluster.wait_job(job_id, timeout=timeout)
    assert job["state"] == "SUCCEEDED", f"{job['state']}: {job['message']}\n{job.get('last_failure')}"
    return job


def store(cluster: LocalCluster) -> dict[str, tuple[int, int]]:
    """The coordinator's code store: each file's size and inode (an upload writes a new file; a CodeStatus asking
    for a held archive touches its modification time, which restarts its retention)."""
    directory = cluster.root / "coordinator" / "code"
    return {p.name: (p.stat().st_size, p.stat().st_ino) for p in directory.iterdir()} if directory.exists() else {}


def uploads(cluster: LocalCluster) -> int:
    return len(re.findall(r"code sha256:[0-9a-f]+ stored", cluster.coordinator.log()))


def cached(cluster: LocalCluster, node: str) -> set[str]:
    """The hashes whose trees the node's code cache holds."""
    return {p.name for p in (cluster.agent_state_dir(node) / "code").iterdir() if re.fullmatch(r"[0-9a-f]{64}", p.name)}


WORDS = b"the tree exists only where the client runs\n" * 50
TREE = {"main.py": MAIN.encode(), "data/words.txt": WORDS, ".gitignore": b"*.huge\n"}


@pytest.fixture(scope="module")
def first_run(cluster):
    """The tree (with a .gitignored 200 MB file beside it) started once on the three hosts."""
    files = {**TREE, "spec.toml": spec("laptop", ["python3", "main.py", str(cluster.laptop)])}
    began = time.monotonic()
    job_id, said = submitted(start_from_laptop(cluster, files, sparse={"data/model.huge": IGNORED_BYTES}))
    succeeded(cluster, job_id)
    print(f"\nfirst start from the client's tmpfs to SUCCEEDED on {len(HOSTS)} hosts: {time.monotonic() - began:.2f} s")
    return job_id, said, files


def test_a_tree_only_the_client_has_runs_on_three_hosts_without_its_ignored_200mb_file(cluster, first_run):
    job_id, said, _ = first_run
    assert said.group(4) == "uploaded" and said.group(1) == "4"  # main.py, words.txt, .gitignore, spec.toml
    archive = next((cluster.root / "coordinator" / "code").glob(f"{said.group(3)}*.tar.gz"))
    assert archive.stat().st_size < 10_000  # not the 200 MB file, even compressed (a sparse file packs small)
    ran = {node: json.loads(line) for node, line in outputs(cluster, job_id).items()}
    assert sorted(ran) == list(HOSTS)  # one task on each host
    for node, found in ran.items():
        cached = cluster.agent_state_dir(node) / "code" / archive.name[:-len(".tar.gz")]
        assert found["code"].endswith("/code/tree") and found["code"].startswith(str(cluster.agent_state_dir(node)))
        assert found["cwd"] != found["code"] and found["data"] == hashlib.sha256(WORDS).hexdigest()
        assert not found["client_dir_here"] and not found["ignored_here"]
        assert sorted(os.listdir(cached)) == [".gitignore", "data", "main.py", "spec.toml"]
        assert os.listdir(cached / "data") == ["words.txt"]
        assert cluster.agents[node].log().count("code: fetched sha256:") == 1
    assert os.listdir(cluster.laptop) == []  # and nothing left over the client's directory


def test_the_same_tree_started_again_uploads_nothing(cluster, first_run):
    first_id, first_said, files = first_run
    held, stored = store(cluster), uploads(cluster)
    assert stored >= 1 and f"{first_said.group(3)}" in "".join(held)  # the first start's upload, as logged
    # Written anew (new modification times): packed again, to the same archive, which the coordinator holds.
    job_id, said = submitted(start_from_laptop(cluster, files, sparse={"data/model.huge": IGNORED_BYTES}))
    assert said.group(4) == "already on the cluster" and said.group(3) == first_said.group(3)
    assert store(cluster) == held and uploads(cluster) == stored
    succeeded(cluster, job_id)
    assert all(cluster.agents[node].log().count("code: fetched sha256:") == 1 for node in HOSTS)  # cached


def test_a_tree_over_the_coordinators_cap_is_refused_with_its_largest_paths(cluster):
    files = {"spec.toml": spec("too-big", ["python3", "main.py"]), "main.py": b"print('never')\n",
             "weights/big.bin": os.urandom(3 << 20), "weights/medium.bin": os.urandom(3 << 19)}
    held, stored, jobs = store(cluster), uploads(cluster), len(cluster.status()["jobs"])
    result = start_from_laptop(cluster, files)
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    assert "is over the coordinator's cap of 4 MiB; largest: weights/big.bin 3.1 MB, weights/medium.bin 1.6 MB, " \
           "spec.toml" in stderr, stderr
    assert result.stdout == b"" and len(cluster.status()["jobs"]) == jobs
    assert store(cluster) == held and uploads(cluster) == stored


def environment_files(cluster: LocalCluster, node: str) -> dict[str, float]:
    """The node's built environments: each key with the time its build log was written (a build writes it
    anew; the ready mark's time is when a task last used the environment)."""
    root = cluster.agent_state_dir(node) / "envs"
    return {p.parent.name: (p.parent / "build.log").stat().st_mtime for p in root.glob("*/ready")}


def test_a_wheel_from_find_links_builds_one_environment_per_host_and_the_next_job_reuses_it(cluster):
    files = {"requirements.txt": b"tinypkg\n", "probe.py": PROBE.encode(),
             "spec.toml": spec("env", ["python3", "probe.py"], environment="requirements.txt")}
    began = time.monotonic()
    first, _ = submitted(start_from_laptop(cluster, files))
    succeeded(cluster, first)
    first_seconds = time.monotonic() - began
    assert set(outputs(cluster, first).values()) == {"42 True"}  # `python3` is the environment's, with the wheel
    built = {node: environment_files(cluster, node) for node in HOSTS}
    assert all(len(keys) == 1 for keys in built.values()), built  # one build on each host
    assert len({key for keys in built.values() for key in keys}) == 1  # the same Python and platform everywhere
    for node, keys in built.items():
        assert "+ tinypkg==1.0" in (cluster.agent_state_dir(node) / "envs" / next(iter(keys)) / "build.log").read_text()
    log = cluster.cli("logs", first, "env", "--node", "h2", check=True).stdout
    assert "+ tinypkg==1.0" in log and "environment ready" in log
    # Other code, the same requirements: the environment is found built on every host.
    files["probe.py"] += b"print('second')\n"
    began = time.monotonic()
    second, said = submitted(start_from_laptop(cluster, files))
    succeeded(cluster, second)
    second_seconds = time.monotonic() - began
    assert said.group(4) == "uploaded" and set(outputs(cluster, second).values()) == {"second"}
    assert {node: environment_files(cluster, node) for node in HOSTS} == built
    for node in HOSTS:
        jobs = cluster.agent_state_dir(node) / "jobs"
        assert (jobs / second / "environment").read_text() == (jobs / first / "environment").read_text()
    print(f"\nstart to SUCCEEDED on {len(HOSTS)} hosts: {first_seconds:.2f} s building the environment, "
          f"{second_seconds:.2f} s reusing it")


def hold_tree(name: str, go: Path) -> dict[str, bytes]:
    return {"spec.toml": spec(name, ["python3", "hold.py", str(go)], nodes=("h1",)), "hold.py": HOLD.encode(),
            "data.bin": os.urandom(512 << 10)}  # incompressible: ~1 MiB in the cache, archive and tree


def test_a_cache_under_pressure_evicts_only_entries_no_task_uses(cluster, tmp_path):
    go = tmp_path / "go"
    pinned_files = hold_tree("pinned", go)
    pinned, said = submitted(start_from_laptop(cluster, pinned_files))
    wait_until(lambda: cluster.job(pinned)["state"] == "RUNNING", 60, what="the pinned job to run")
    go_on = tmp_path / "go-on"
    go_on.touch()
    code = {"pinned": said.group(3)}  # each tree's hash, as the client said it (12 hex digits)
    for name in ("unused", "newest"):  # each ends at once: its entry is then unused
        job_id, said = submitted(start_from_laptop(cluster, hold_tree(name, go_on)))
        succeeded(cluster, job_id)
        code[name] = said.group(3)
    held = {h[:12]: h for h in cached(cluster, "h1")}
    # Three ~1 MiB entries are over the cap: the older unused one went, not the even older one still in use.
    assert code["pinned"] in held and code["newest"] in held and code["unused"] not in held, (code, held)
    removed = re.findall(r"code cache: removed sha256:([0-9a-f]{12})", cluster.agents["h1"].log())
    assert code["unused"] in removed and code["pinned"] not in removed
    assert sum(_entry_bytes(cluster, "h1", h) for h in held.values()) <= CACHE_CAP
    go.touch()
    succeeded(cluster, pinned)
    assert list(outputs(cluster, pinned).values()) == [hashlib.sha256(pinned_files["data.bin"]).hexdigest()]


def _entry_bytes(cluster: LocalCluster, node: str, hex_digest: str) -> int:
    code = cluster.agent_state_dir(node) / "code"
    tree = sum(f.stat().st_size for f in (code / hex_digest).rglob("*") if f.is_file())
    return tree + (code / f"{hex_digest}.tar.gz").stat().st_size
