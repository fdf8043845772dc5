"""What a task hands back is read by its root agent only where the task itself could have read it: a link planted
in a checkpoint dir, a file of another user's, a FIFO, a dir swapped for a link, are refused by the reads that
ship checkpoints to other nodes, learn checkpoint steps and follow an evaluator's summaries; and a real job whose
chief plants a link to its node's private key in the checkpoints it ships gets nothing of the key to the
evaluator's node. Switching users needs root: as another user these tests are skipped."""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from harness import running_cluster, wait_until
from tfcluster import pki
from tfcluster.daemon.agent.hooks.checkpoint_steps import read_steps
from tfcluster.daemon.agent.hooks.shipping import Peer, put_files, sync_dir
from tfcluster.daemon.agent.tasks import handback
from tfcluster.daemon.agent.tasks.record import newest_checkpoint
from tfcluster.security import Credentials

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="files of another user are made as root")

TASK_UID = 61998
NOWHERE = Peer("127.0.0.1:9", "n2")  # never reached: the refusal comes before any connection


@pytest.fixture
def task_dir(tmp_path):
    """A host-local checkpoint dir as the agent makes it (the task user's, 0700), a root-only secret beside it."""
    secret = tmp_path / "node.key"
    secret.write_text("-----BEGIN PRIVATE KEY-----\n")
    secret.chmod(0o600)
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    os.chown(directory, TASK_UID, TASK_UID)
    return directory, secret


def own_file(path, text: str = "data") -> None:
    path.write_text(text)
    os.chown(path, TASK_UID, TASK_UID)


def test_a_task_file_is_read_only_when_it_is_the_tasks_own_regular_file(task_dir):
    directory, secret = task_dir
    own_file(directory / "mine")
    (directory / "link").symlink_to(secret)
    (directory / "roots").write_text("root's")
    os.mkfifo(directory / "fifo")
    os.chown(directory / "fifo", TASK_UID, TASK_UID)
    owner = handback.owner_of(str(directory))
    assert owner == TASK_UID and handback.read_bytes(str(directory / "mine"), owner) == b"data"
    for name, why in (("link", "a symbolic link"), ("roots", "owned by uid 0"), ("fifo", "not a regular file")):
        started = time.monotonic()
        with pytest.raises(handback.NotTheTasks, match=why):
            handback.read_bytes(str(directory / name), owner)
        assert time.monotonic() - started < 1, "a FIFO is never waited on"


def test_shipping_refuses_a_planted_link_before_it_sends_anything(task_dir):
    directory, secret = task_dir
    own_file(directory / "ckpt-1.data-00000-of-00001")
    (directory / "ckpt-1.index").symlink_to(secret)
    with pytest.raises(handback.NotTheTasks, match="a symbolic link"):
        put_files(NOWHERE, "job-1", str(directory), ["ckpt-1.data-00000-of-00001", "ckpt-1.index"], Credentials())
    assert not opened_under(directory.parent), "no descriptor left open on the task's files or the key"


def opened_under(root) -> list[str]:
    """What this process holds open under root (other tests in this process may hold other descriptors)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile: the listing's own descriptor
            continue
        if target.startswith(f"{root}/"):
            found.append(target)
    return found


def test_a_dir_swapped_for_a_link_is_not_followed_by_a_copy(task_dir):
    directory, secret = task_dir
    (directory / "backup").symlink_to(secret.parent)  # the task's dir, now a link to where the key lies
    with pytest.raises(handback.NotTheTasks, match="not a directory of the task's"):
        put_files(NOWHERE, "job-1", str(directory), ["backup/node.key"], Credentials())
    own_file(directory / "ok")
    names = [name for name, _, _ in handback.files_under(str(directory))]
    assert names == ["ok"], "a linked dir is not walked into"
    with pytest.raises(Exception) as failed:  # the one real file goes to a peer that is not there
        sync_dir(NOWHERE, "job-1", str(directory), Credentials())
    assert not isinstance(failed.value, handback.NotTheTasks)


def test_steps_and_the_newest_checkpoint_come_from_the_tasks_files_alone(task_dir):
    directory, secret = task_dir
    (directory / "checkpoint").symlink_to(secret)
    assert newest_checkpoint(str(directory), TASK_UID) == ""
    (directory / "checkpoint").unlink()
    own_file(directory / "checkpoint", 'model_checkpoint_path: "ckpt-1"\n')
    (directory / "ckpt-1.index").symlink_to(secret)
    with pytest.raises(handback.NotTheTasks):
        read_steps(str(directory / "ckpt-1"), ("step",), TASK_UID)


# The chief of a job with no checkpoint_dir: its checkpoints are shipped to the evaluator's node. It plants a
# committed checkpoint whose index is a link to the node's private key, and whose data is its own file.
PLANTER = textwrap.dedent("""
    import os, sys, time
    here = os.environ["TFCLUSTER_CHECKPOINT_DIR"]
    with open(os.path.join(here, "ckpt-1.data-00000-of-00001"), "w") as f:
        f.write("planted")
    os.symlink(sys.argv[1], os.path.join(here, "ckpt-1.index"))
    with open(os.path.join(here, "checkpoint"), "w") as f:
        f.write('model_checkpoint_path: "ckpt-1"\\n')
    time.sleep(4)
""")


def test_a_job_cannot_ship_its_nodes_key_to_another_node(tmp_path_factory, tmp_path):
    with running_cluster(tmp_path_factory.mktemp("handback"), {"a": {}, "b": {}}) as cluster:
        key = cluster.agent_state_dir("a") / "tls" / pki.NODE_KEY
        (tmp_path / "plant.py").write_text(PLANTER)
        spec = tmp_path / "plant.toml"
        spec.write_text(textwrap.dedent(f"""
            name = "plant"
            strategy = "mirrored"
            shared_workdir = true
            command = ["{sys.executable}", "{tmp_path / 'plant.py'}", "{key}"]
            [roles.worker]
            nodes = ["a"]
            [roles.evaluator]
            nodes = ["b"]
            command = ["{sys.executable}", "-c", "import time; time.sleep(6)"]
        """))
        started = cluster.cli("start", str(spec), "--wait", timeout=120)
        job_id = started.stdout.strip()
        assert job_id, started.stderr
        wait_until(lambda: "a symbolic link: not read" in cluster.agents["a"].log(), 30,
                   what="the chief's agent to refuse the planted link")
        secret = key.read_bytes()
        received = cluster.agent_state_dir("b") / "jobs" / job_id
        leaked = [p for p in received.rglob("*") if p.is_file() and secret[:40] in p.read_bytes()]
        assert leaked == [], f"the node key reached node b: {leaked}"
        ok = cluster.cli("start", "--name", "fine", "--strategy", "mirrored", "--wait", "--", sys.executable, "-c",
                         "pass")
        assert cluster.job(ok.stdout.strip())["state"] == "SUCCEEDED", "the cluster goes on"


def test_a_dir_not_made_yet_has_no_files(tmp_path):
    assert list(handback.files_under(str(tmp_path / "eval"))) == []
    (tmp_path / "file").write_text("")
    assert list(handback.files_under(str(tmp_path / "file"))) == []
