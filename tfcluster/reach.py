"""Whether a user can reach a path, and if not, which directory stops them.

Tasks run under their jobs' own UIDs, not as the agent (root) that prepared them: a program, a workdir or a
checkpoint dir root reaches may be out of a task's reach, most often because a directory on the way lets no
other user through (a Python installed under /root, mode 0700). The kernel's answer, "Permission denied",
names the file it was asked for, not the directory that refused; this module finds that directory, the way
the kernel walks: component by component, following symbolic links (a virtualenv's `python` is a link into
the Python it was made from, which is where the refusal usually is).

Standard library only: the per-task shim, the demo and the test harness use it.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections import deque
from collections.abc import Callable

MAX_LINKS = 40  # as the kernel's own limit on links followed in one lookup (ELOOP)


def others_may_search(directory: str) -> bool:
    """True when a user who is neither the directory's owner nor in its group may pass through it."""
    return bool(os.stat(directory).st_mode & stat.S_IXOTH)


def i_may_search(directory: str) -> bool:
    """True when this process, by its effective IDs (a shim acting as the task's user), may pass through it."""
    return os.access(directory, os.X_OK, effective_ids=True)


def first_blocked(path: str, may_search: Callable[[str], bool] = i_may_search, cwd: str = "/") -> str | None:
    """The first directory on the way to `path` (relative to `cwd`) that `may_search` refuses; None when every
    directory on the way may be passed (the path itself may still be missing, or refuse what is asked of it)."""
    current = cwd if not os.path.isabs(path) else "/"
    parts = deque(p for p in path.split("/") if p)
    links = 0
    while parts:
        name = parts.popleft()
        if name == ".":
            continue
        if not may_search(current):
            return current
        if name == "..":
            current = os.path.dirname(current) or "/"
            continue
        step = os.path.join(current, name)
        try:
            found = os.lstat(step)
        except OSError:
            return None  # missing (or not a dir to pass through): not a question of reach
        if stat.S_ISLNK(found.st_mode):
            links += 1
            if links > MAX_LINKS:
                return None
            target = os.readlink(step)
            parts.extendleft(reversed([p for p in target.split("/") if p]))
            if target.startswith("/"):
                current = "/"
        else:
            current = step
    return None


def closed_dirs(path: str) -> list[str]:
    """Every directory on the way to `path` (links followed) that other users may not pass, outermost first:
    what `chmod o+x` would have to open for a user of no group of theirs to reach it."""
    closed: list[str] = []

    def note(directory: str) -> bool:
        if not others_may_search(directory) and directory not in closed:
            closed.append(directory)
        return True  # go on: list them all, not only the first

    first_blocked(path, note)
    return closed


def describe(directory: str) -> str:
    """`/root (mode 0700, owner root:root)`: what a person needs to see of a directory that blocks the way."""
    try:
        found = os.stat(directory)
    except OSError:
        return directory
    return f"{directory} (mode {stat.S_IMODE(found.st_mode):04o}, owner {_user(found.st_uid)}:{_group(found.st_gid)})"


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
