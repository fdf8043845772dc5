"""What the per-task shim (shim/runner.py, root) does before it starts the task under the job's user.

The shim checks the working directory, and makes the dirs the spec names, as the task user first
(`acting_as`), with root's rights put aside meanwhile: a refusal then names the dir that stops the user. The
task itself is started (shim/spawn.py: posix_spawn, a vfork and an exec) with the shim's real and effective IDs
those of the task user (`starting_as`), which also enters the working directory as that user; nothing is asked
of the child between the fork and the exec, so nothing of the shim's memory is copied for it. "No new
privileges" is set in the shim itself: the child inherits it across exec, so no setuid program can give the
task back what it gave up. The private /tmp is a mount namespace of the shim's own, with the job's tmp dir
bind-mounted on /tmp, as systemd's PrivateTmp does.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat

from tfcluster import reach

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


def mount_namespace() -> int:
    """A descriptor of this process's mount namespace, to come back to after private_tmp (a shim that runs another
    task next: enter_mount_namespace)."""
    return os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)


def enter_mount_namespace(namespace: int) -> None:
    """Back in the namespace of mount_namespace (the private /tmp goes with its last process). The working
    directory is then that namespace's root. Must run before the process has threads."""
    _check(_libc.setns(namespace, CLONE_NEWNS), "setns(CLONE_NEWNS)")


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


class StartRefused(Exception):
    """The task cannot start, and no restart would change that (a dir it needs is out of its user's reach): the
    message names the path, the directory that stops the user and what to do."""


# The exec's own answers that a restart cannot change: the program is missing, out of reach or not a program.
PERMANENT_EXEC_ERRORS = (errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR, errno.ELOOP, errno.EPERM)


def task_user(uid: int | None) -> str:
    """How messages name the task's user: by uid, the one name it has on every node."""
    return f"this job's user (uid {os.geteuid() if uid is None else uid})"


def blocked_message(blocked: str, who: str) -> str:
    return (f"{who} cannot pass through {reach.describe(blocked)}: let other users through it "
            f"(chmod o+x {blocked}), or put what the task needs where every user can reach it")


def check_workdir(workdir: str, who: str) -> None:
    """Raises StartRefused when the task user cannot enter the workdir (see acting_as)."""
    if not workdir:
        return
    blocked = reach.first_blocked(workdir)
    if blocked:
        raise StartRefused(f"cannot enter the workdir {workdir}: {blocked_message(blocked, who)}")
    if not os.path.isdir(workdir):
        raise StartRefused(f"the workdir {workdir} is not a directory on this node")
    if not os.access(workdir, os.X_OK, effective_ids=True):
        raise StartRefused(f"cannot enter the workdir {workdir}: {who} may not (mode "
                           f"{stat.S_IMODE(os.stat(workdir).st_mode):04o})")


def make_task_dirs(paths: list[str], who: str) -> None:
    """Makes the dirs the spec names, as the task user (see acting_as); raises StartRefused for the first one the
    task user cannot make or write: the job would only fail later, deep in TensorFlow, and on every restart."""
    advice = ("tasks run under per-job UIDs: use a dir that uid can write, or run tasks as their owners "
              "(--task-user owner)")
    for path in paths:
        blocked = reach.first_blocked(path)
        if blocked:
            raise StartRefused(f"{path}: {blocked_message(blocked, who)}")
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise StartRefused(f"{path}: cannot be created by {who} ({e.strerror or e}); {advice}") from None
        if not os.access(path, os.W_OK | os.X_OK, effective_ids=True):
            raise StartRefused(f"{path}: not writable by {who}; {advice}")


def explain_exec_failure(program: str, search_path: str, cwd: str, who: str) -> str:
    """Why the exec of `program` failed for the task user, as a person can act on it ("" when nothing more than
    the kernel's own answer can be said). Run as the task user (see acting_as): what root alone could see of
    the paths a job names is none of the job's business."""
    if "/" in program:
        candidates = [program if os.path.isabs(program) else os.path.join(cwd or "/", program)]
    else:
        candidates = [os.path.join(d or cwd or ".", program) for d in search_path.split(os.pathsep)]
    blocked = []
    for candidate in candidates:
        stop = reach.first_blocked(candidate)
        if stop:
            blocked.append(stop)
        elif os.path.exists(candidate):
            return _explain_program(candidate, who)
    if blocked:
        where = "" if "/" in program else f"on the task's PATH ({search_path}): "
        return f"{where}{blocked_message(blocked[0], who)}"
    return f"not found on the task's PATH ({search_path})" if "/" not in program else ""


def _explain_program(path: str, who: str) -> str:
    """The program is there: not executable by the user, or a script whose #! interpreter is out of reach."""
    if not os.access(path, os.X_OK, effective_ids=True):
        return f"{path} is not executable by {who}"
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return ""
    if not first.startswith(b"#!") or not first[2:].split():
        return ""
    interpreter = os.fsdecode(first[2:].split()[0])
    stop = reach.first_blocked(interpreter)
    if stop:
        return f"its #! interpreter {interpreter}: {blocked_message(stop, who)}"
    if not os.path.exists(interpreter):
        return f"its #! interpreter {interpreter} does not exist on this node"
    return ""
