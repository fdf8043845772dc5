"""`tfcluster agent --task-user owner`: a job's tasks run as its owner's local account, groups included, with real
UNIX users made here (and removed by name afterwards), real certificates and a real agent. A job whose owner has
no account on the node fails to start and says so; an account of uid 0 is refused.

Making users and switching to them needs root: as another user these tests are skipped.
"""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import subprocess

import pytest

from harness import LocalCluster, wait_until
from tfcluster.daemon.agent.tasks.users import hand_over, owner_account

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="making UNIX users and running tasks as them needs root")

SUFFIX = secrets.token_hex(3)  # engineers' test runs on one machine must not meet each other's accounts
ALICE, GHOST, ROOTISH, VISION = f"tfpalice{SUFFIX}", f"tfpghost{SUFFIX}", f"tfproot{SUFFIX}", f"tfpvision{SUFFIX}"
PROBE = 'id -u; id -g; id -G; echo "home=$HOME"; touch "$TFCLUSTER_CHECKPOINT_DIR/mine" && echo wrote'


def run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def accounts():
    """alice (her own primary group, and the vision group besides) and an account of uid 0; removed afterwards."""
    made_users, made_groups = [], []
    try:
        run("groupadd", VISION)
        made_groups.append(VISION)
        run("useradd", "--create-home", "--user-group", "--groups", VISION, "--shell", "/bin/sh", ALICE)
        made_users.append(ALICE)
        run("useradd", "--non-unique", "--uid", "0", "--gid", "0", "--no-create-home", ROOTISH)
        made_users.append(ROOTISH)
        yield pwd.getpwnam(ALICE)
    finally:
        for user in made_users:  # --force: the uid-0 account shares its uid with every root process
            subprocess.run(["userdel", "--force", "--remove", user], capture_output=True)
        for group in [*made_groups, ALICE]:
            subprocess.run(["groupdel", group], capture_output=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, accounts):
    cluster = LocalCluster(root=tmp_path_factory.mktemp("owners"))
    cluster.root.chmod(0o755)  # alice's task runs `sh` from here: the way there must be open to her
    try:
        cluster.start_coordinator()
        cluster.start_agents({"n1": {"extra": ["--task-user", "owner"]}})
        yield cluster
    finally:
        cluster.teardown()


def as_person(cluster: LocalCluster, name: str, *args: str, check: bool = True):
    tls = cluster.root / "people" / name
    if not tls.exists():
        cluster.cli("ca", "issue", "--dir", str(cluster.ca_dir), "--role", "user", "--name", name, "--out", str(tls),
                    check=True)
    return cluster.cli(*args, check=check, env={"TFCLUSTER_TLS_DIR": str(tls)})


def submit(cluster: LocalCluster, owner: str) -> str:
    return as_person(cluster, owner, "start", "--name", "probe", "--strategy", "mirrored", "--", "sh", "-c",
                     PROBE).stdout.strip()


def test_the_task_runs_as_its_owners_account_with_its_groups_and_writes_as_her(cluster, accounts):
    job_id = submit(cluster, ALICE)
    job = cluster.wait_job(job_id, timeout=60)
    assert job["state"] == "SUCCEEDED", job
    uid, gid, groups, home, wrote = as_person(cluster, ALICE, "logs", job_id, "worker:0").stdout.splitlines()
    assert (int(uid), int(gid)) == (accounts.pw_uid, accounts.pw_gid)
    expected = {*os.getgrouplist(ALICE, accounts.pw_gid), job["uid"]}  # her groups, and the job's for its files
    assert {int(g) for g in groups.split()} == expected and grp.getgrnam(VISION).gr_gid in expected
    assert home == f"home={accounts.pw_dir}" and wrote == "wrote"
    written = cluster.agent_state_dir("n1") / "jobs" / job_id / "checkpoints" / "mine"
    assert written.stat().st_uid == accounts.pw_uid, "what the task makes is alice's"


def test_an_owner_without_an_account_on_the_node_fails_to_start_with_the_reason(cluster):
    job_id = submit(cluster, GHOST)
    failure = wait_until(lambda: cluster.job(job_id)["last_failure"], 60, what="the job to fail to start")
    assert failure["message"] == (f"no account named {GHOST} on node n1 (the agent runs tasks as their owners' "
                                  f"accounts: --task-user owner)")
    assert cluster.job(job_id)["tasks"][0]["pid"] is None, "nothing ran, as nobody else"
    cluster.cli("stop", job_id, "--now")


def test_an_account_of_uid_0_is_refused(cluster):
    job_id = submit(cluster, ROOTISH)
    failure = wait_until(lambda: cluster.job(job_id)["last_failure"], 60, what="the job to fail to start")
    assert failure["message"] == (f"the account {ROOTISH} on node n1 has uid 0: tasks never run as root (the agent "
                                  f"runs tasks as their owners' accounts: --task-user owner)")
    cluster.cli("stop", job_id, "--now")
    after = submit(cluster, ALICE)
    assert cluster.wait_job(after, timeout=60)["state"] == "SUCCEEDED", "the node works on for accounts it has"


def test_copies_received_for_the_job_are_handed_to_the_owner_and_links_are_not_followed(accounts, tmp_path):
    """Checkpoint files other agents sent before the task started are the job's UID's (peers/files.py); the
    owner's task must be able to read and replace them."""
    job_uid = 64999
    checkpoints, outside = tmp_path / "checkpoints", tmp_path / "outside"
    (checkpoints / "sub").mkdir(parents=True)
    outside.write_text("not the job's")
    for path in (checkpoints / "checkpoint", checkpoints / "sub" / "ckpt-1.index"):
        path.write_text("x")
        os.chown(path, job_uid, job_uid)
    (checkpoints / "link").symlink_to(outside)
    user = owner_account(ALICE, "n1", job_uid)
    hand_over(checkpoints, user)
    for path in (checkpoints / "sub", checkpoints / "checkpoint", checkpoints / "sub" / "ckpt-1.index"):
        assert (path.stat().st_uid, path.stat().st_gid) == (accounts.pw_uid, job_uid), path
    assert os.lstat(checkpoints / "link").st_uid == accounts.pw_uid and outside.stat().st_uid == 0
