"""What the per-task shim (taskrunner.py, root) does before it starts the task under the job's user.

CPython's child setup (_posixsubprocess) changes the working directory before it drops privileges
(setgroups, setregid, setreuid come after chdir), so the shim checks the working directory, and makes the
dirs the spec names, as the task user first (`acting_as`), with root's rights put aside meanwhile.
The task itself is started with the shim's real and effective IDs those of the task user (`starting_as`),
not by asking CPython to switch them in the child: asked to, CPython forks (copying the shim's memory map,
which the exec then throws away), where otherwise it uses vfork, which copies nothing; that was a fifth of
a short task's CPU time in its shim. "No new privileges" is set in the shim itself: the child inherits it across exec, so no setuid program can
give the task back what it gave up, and no preexec_fn is needed. The private /tmp is a mount namespace of
the shim's own, with the job's tmp dir bind-mounted on /tmp, as systemd's PrivateTmp does.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os

PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWNS = 0x00020000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def no_new_privileges() -> None:
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def private_tmp(directory: str) -> str:
    """Puts this process (and its children) in a mount namespace of its own, where /tmp is `directory`.
    Must run before the process has threads. Returns why it could not ("": done)."""
    try:
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        # Mounts made here must not propagate back to the host's namespace.
        _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
        _check(_libc.mount(os.fsencode(directory), b"/tmp", None, MS_BIND | MS_REC, None),
               f"bind-mounting {directory} on /tmp")
    except OSError as e:
        return e.strerror or str(e)
    return ""


@contextlib.contextmanager
def acting_as(uid: int | None, gid: int | None, groups: list[int] | None = None):
    """Within: file access is checked, and files are made, as uid:gid with the task's supplementary groups
    (none for a job's own UID; an owner's account's), by the effective IDs: the real and saved ones stay root,
    so root's rights come back at the end."""
    if uid is None:
        yield
        return
    before = os.getgroups()
    os.setgroups(groups or [])
    os.setegid(gid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(before)


@contextlib.contextmanager
def starting_as(uid: int | None, gid: int | None, groups: list[int] | None = None):
    """Within: a child started (and exec'd) runs as uid:gid with the given supplementary groups (none for a job's
    own UID; an owner's account's), for good. This process's real and effective IDs are the task user's; root's
    stays in the saved IDs alone, which brings it back at the end, and which the exec replaces with the
    effective IDs, so the task keeps no way back.
    Meanwhile this process has no privileges: start the child and nothing else within."""
    if uid is None:
        yield
        return
    before, saved_gid, saved_uid = os.getgroups(), os.getresgid(), os.getresuid()
    os.setgroups(groups or [])
    os.setresgid(gid, gid, saved_gid[1])
    try:
        os.setresuid(uid, uid, saved_uid[1])
        try:
            yield
        finally:
            os.setresuid(*saved_uid)
    finally:
        os.setresgid(*saved_gid)
        os.setgroups(before)


def check_workdir(workdir: str) -> None:
    """Raises OSError (with the workdir's name) when the task user cannot enter it (see acting_as)."""
    if not workdir:
        return
    if not os.path.isdir(workdir):
        raise FileNotFoundError(errno.ENOENT, "No such directory", workdir)
    if not os.access(workdir, os.X_OK, effective_ids=True):
        raise PermissionError(errno.EACCES, "Permission denied (for the task's user)", workdir)


def make_task_dirs(paths: list[str]) -> list[str]:
    """Makes the dirs the spec names (see acting_as); returns why each that could not be made failed, for the
    task's log: the task may still make it, or fail on it with its own message."""
    problems = []
    for path in paths:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            problems.append(f"cannot create {path}: {e.strerror or e}")
    return problems
