"""The shim starts a task as the task's user by taking that user's IDs itself for the start (isolation.starting_as),
so CPython can use vfork: the task must end up with the user's IDs and no way back to root, and the shim with
all of root's again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tfcluster.daemon.agent.shim import isolation

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching users takes root")

NOBODY = 65534
SHOW_IDS = "import os; print(os.getresuid(), os.getresgid(), os.getgroups())"


def test_a_child_started_within_runs_as_the_user_for_good_and_root_comes_back():
    uids, gids, groups = os.getresuid(), os.getresgid(), os.getgroups()
    with isolation.starting_as(NOBODY, NOBODY):
        child = subprocess.Popen([sys.executable, "-c", SHOW_IDS], stdout=subprocess.PIPE, text=True)
    out, _ = child.communicate(timeout=30)
    # The saved IDs too: a task that kept root's saved ID could become root again.
    assert out.strip() == f"{(NOBODY,) * 3} {(NOBODY,) * 3} []"
    assert (os.getresuid(), os.getresgid(), os.getgroups()) == (uids, gids, groups)


def test_root_comes_back_when_the_child_cannot_start(tmp_path):
    uids, gids, groups = os.getresuid(), os.getresgid(), os.getgroups()
    with pytest.raises(FileNotFoundError):
        with isolation.starting_as(NOBODY, NOBODY):
            subprocess.Popen([str(tmp_path / "missing")])
    assert (os.getresuid(), os.getresgid(), os.getgroups()) == (uids, gids, groups)


def test_no_user_changes_nothing():
    ids = os.getresuid(), os.getresgid(), os.getgroups()
    with isolation.starting_as(None, None):
        assert (os.getresuid(), os.getresgid(), os.getgroups()) == ids
