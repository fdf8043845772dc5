"""--task-user owner on the agent (tasks/users.py): the owner's account is looked up on this node, with its groups
and the job's; no account, or root's, is a refusal that says so. The agent refuses the flag where no owner is
authenticated (--insecure) or where every task runs as root anyway."""

from __future__ import annotations

import os
import pwd

import pytest

from tfcluster.daemon.agent.main import SettingsError, configure
from tfcluster.daemon.agent.tasks.users import OWNER, TaskUserError, TaskUsers, owner_account

JOB_GID = 61234


def test_a_missing_account_or_none_is_refused_with_the_reason_never_replaced():
    with pytest.raises(TaskUserError) as missing:
        owner_account("no-such-person-here", "n1", JOB_GID)
    assert str(missing.value) == ("no account named no-such-person-here on node n1 (the agent runs tasks as their "
                                  "owners' accounts: --task-user owner)")
    with pytest.raises(TaskUserError, match="this job has no owner .* no account on node n1"):
        owner_account("", "n1", JOB_GID)


def test_an_account_of_uid_0_is_refused():
    root = pwd.getpwuid(0).pw_name
    with pytest.raises(TaskUserError, match=f"the account {root} on node n1 has uid 0: tasks never run as root"):
        owner_account(root, "n1", JOB_GID)


def test_an_account_runs_with_its_own_ids_and_groups_and_the_jobs_group_owns_the_files():
    account = next(a for a in pwd.getpwall() if a.pw_uid != 0)
    user = owner_account(account.pw_name, "n1", JOB_GID)
    assert (user.uid, user.gid, user.name, user.home) == (account.pw_uid, account.pw_gid, account.pw_name,
                                                          account.pw_dir)
    assert set(user.groups) == {*os.getgrouplist(account.pw_name, account.pw_gid), JOB_GID}
    assert user.owner(private=True) == (account.pw_uid, JOB_GID) and user.owner(private=False) == (0, JOB_GID)
    users = TaskUsers(agent_is_root=True, mode=OWNER)
    assert users.for_launch(70000, JOB_GID, account.pw_name, "n1") == user
    assert TaskUsers(agent_is_root=True).for_launch(70000, JOB_GID, account.pw_name, "n1").uid == 70000, \
        "without the flag: the job's own UID"


@pytest.mark.parametrize("flags, why", [
    ({"insecure": True}, "--task-user owner needs the cluster's certificates"),
    ({"allow_root_tasks": True}, "--allow-root-tasks as root: give one of them"),
    ({"task_user": "root"}, "--task-user: expected one of job, owner, got 'root'"),
])
def test_the_agent_refuses_owner_accounts_without_authenticated_owners(tmp_path, flags, why):
    flags = {"task_user": OWNER, **flags}
    with pytest.raises(SettingsError, match=why):
        configure("127.0.0.1:1", "n1", "127.0.0.1", "20000-20010", None, "none", tmp_path, None, **flags)
