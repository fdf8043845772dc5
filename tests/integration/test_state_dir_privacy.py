"""Nothing of one job is readable by another job's task. alice's job ships its code, writes its checkpoints, home,
temporary files and working dir, and keeps running; bob's job's task then walks the agent's whole state dir, as
an attacker would, listing every directory it can and reading every file it can. It must find nothing of
alice's: no file holding her secret, no listing of her job's dirs or of the node's code cache. Done under
per-job UIDs, and under --task-user owner with two real UNIX accounts.

Switching users needs root: as another user these tests are skipped.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap

import pytest

from harness import LocalCluster, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tasks switch to their job's UID only under a root agent")

SECRET = f"alice-secret-{secrets.token_hex(8)}"
SUFFIX = secrets.token_hex(3)
ALICE, BOB = f"tfsalice{SUFFIX}", f"tfsbob{SUFFIX}"

# alice's program: her secret in every place a task writes, then it waits to be walked.
ALICES_PROGRAM = textwrap.dedent(f"""
    import os, time
    secret = "{SECRET}"
    for path in (os.environ["TFCLUSTER_CHECKPOINT_DIR"], os.environ["HOME"], os.environ["TMPDIR"], "."):
        with open(os.path.join(path, "secret.txt"), "w") as f:
            f.write(secret)
    print(secret, flush=True)
    time.sleep(120)
""")

# bob's task: walks the state dir (found from its own checkpoint dir, <state>/jobs/<job>/checkpoints) from its top
# and from every name the layout is known to use (alice's job id is in `tfcluster status`), and reports what it
# could list and which files it could read that hold the secret.
WALKER = textwrap.dedent("""
    import json, os, sys
    secret, alices, own_job = sys.argv[1], sys.argv[2], os.environ["TFCLUSTER_JOB_ID"]
    state = os.path.dirname(os.path.dirname(os.path.dirname(os.environ["TFCLUSTER_CHECKPOINT_DIR"])))
    listed, found = [], []
    def visit(path):
        try:
            names = os.listdir(path)
        except OSError:
            return
        listed.append(path)
        for name in names:
            child = os.path.join(path, name)
            if os.path.isdir(child) and not os.path.islink(child):
                visit(child)
            else:
                try:
                    with open(child, "rb") as f:
                        if secret.encode() in f.read(1 << 20):
                            found.append(child)
                except OSError:
                    pass
    hers = os.path.join(state, "jobs", alices)
    for known in ("", "code", "envs", "jobs", "tls", hers, *(os.path.join(hers, n) for n in
                  ("tasks", "tasks/worker-0", "tasks/worker-0/attempt-1", "tasks/worker-0/attempt-1/code",
                   "tasks/worker-0/attempt-1/code/cwd", "tasks/worker-0/attempt-1/code/upper", "checkpoints",
                   "home", "tmp"))):
        path = os.path.join(state, known)
        if path not in listed:
            visit(path)
    for name in ("secret.txt", "output.log", "launch.json", "status.json", "events.jsonl"):
        for where in ("checkpoints", "home", "tmp", "tasks/worker-0/attempt-1",
                      "tasks/worker-0/attempt-1/code/cwd", "tasks/worker-0/attempt-1/code/upper"):
            try:
                with open(os.path.join(hers, where, name), "rb") as f:
                    if secret.encode() in f.read(1 << 20):
                        found.append(os.path.join(hers, where, name))
            except OSError:
                pass
    print(json.dumps({"state": state, "own": own_job, "listed": listed, "found": found}))
""")


def start_alice(cluster: LocalCluster, tmp_path, env: dict[str, str]) -> str:
    code = tmp_path / "alice-code"
    code.mkdir()
    (code / "train.py").write_text(f"# {SECRET}\n{ALICES_PROGRAM}")
    (code / "job.toml").write_text('name = "alice"\nstrategy = "mirrored"\ncommand = ["python3", "train.py"]\n')
    job_id = cluster.cli("start", str(code / "job.toml"), check=True, env=env).stdout.strip()
    wait_until(lambda: SECRET in cluster.cli("logs", job_id, "worker:0").stdout, 60, what="alice's task to write")
    return job_id


def bobs_walk(cluster: LocalCluster, alices: str, env: dict[str, str]) -> dict:
    job_id = cluster.cli("start", "--name", "walk", "--strategy", "mirrored", "--wait", "--", sys.executable, "-c",
                         WALKER, SECRET, alices, check=True, env=env).stdout.strip()
    return json.loads(cluster.cli("logs", job_id, "worker:0", check=True, env=env).stdout.splitlines()[-1])


def assert_nothing_of(alices: str, walk: dict) -> None:
    assert walk["found"] == [], f"bob's task read alice's secret in {walk['found']}"
    hers = os.path.join(walk["state"], "jobs", alices)
    seen = [p for p in walk["listed"] if p == hers or p.startswith(hers + "/")]
    assert seen == [], f"bob's task listed alice's job dirs: {seen}"
    cache = os.path.join(walk["state"], "code")
    assert not [p for p in walk["listed"] if p.startswith(cache)], "bob's task listed the node's code cache"
    others = [p for p in walk["listed"] if walk["own"] not in p]
    assert others == [], f"bob's task listed dirs not its own: {others}"


def test_a_task_of_another_job_reads_nothing_of_alices(tmp_path_factory, tmp_path):
    cluster = LocalCluster(root=tmp_path_factory.mktemp("privacy"))
    try:
        cluster.start_coordinator()
        cluster.start_agents({"a": {}})
        alices = start_alice(cluster, tmp_path, {})
        assert_nothing_of(alices, bobs_walk(cluster, alices, {}))
    finally:
        cluster.teardown()


def person(cluster: LocalCluster, name: str) -> dict[str, str]:
    tls = cluster.root / "people" / name
    cluster.cli("ca", "issue", "--dir", str(cluster.ca_dir), "--role", "user", "--name", name, "--out", str(tls),
                check=True)
    return {"TFCLUSTER_TLS_DIR": str(tls)}


@pytest.fixture
def accounts():
    made = []
    try:
        for name in (ALICE, BOB):
            subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name], check=True,
                           capture_output=True)
            made.append(name)
        yield
    finally:
        for name in made:
            subprocess.run(["userdel", "--force", "--remove", name], capture_output=True)
            subprocess.run(["groupdel", name], capture_output=True)


def test_under_owner_accounts_bobs_task_reads_nothing_of_alices(tmp_path_factory, tmp_path, accounts):
    cluster = LocalCluster(root=tmp_path_factory.mktemp("privacy-owners"))
    cluster.root.chmod(0o755)  # the owners' tasks run this Python from here
    try:
        cluster.start_coordinator()
        cluster.start_agents({"a": {"extra": ["--task-user", "owner"]}})
        alices = start_alice(cluster, tmp_path, person(cluster, ALICE))
        assert_nothing_of(alices, bobs_walk(cluster, alices, person(cluster, BOB)))
    finally:
        cluster.teardown()
