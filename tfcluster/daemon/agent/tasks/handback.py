"""Reading what a task hands back to its agent: its checkpoints (to ship them to other nodes, to learn their
steps), its `checkpoint` state file, the summaries an evaluator writes.

The agent is root, and these files lie in dirs the job's tasks write, or that the spec named: a task could put
there a link to the node's key, a FIFO that never answers, or a hard link to another job's file, and have the
agent read it with root's rights and send it on. So a file is read here only when it is what the task itself
made: opened without following a link (O_NOFOLLOW), without waiting on a FIFO or device (O_NONBLOCK, then it
must be a regular file), and owned by the task's own user. A tree is walked through directory descriptors, no
link followed at any level, so no directory can be swapped for a link between the walk and the read.
Anything else is refused (NotTheTasks, an OSError: callers that skip an unreadable file skip it too).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator

from tfcluster.checkpoints import STATE_FILE

OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class NotTheTasks(OSError):
    """A file the agent will not read for a task: a link, not a regular file, or not the task's own."""


def owner_of(directory: str) -> int | None:
    """The user a task dir the agent made belongs to (a job's host-local checkpoint dir is its task user's); None
    when the agent is not root (its tasks are its own user: nothing to keep apart)."""
    if os.geteuid() != 0:
        return None
    return os.stat(directory).st_uid


def open_file(path: str, owner: int | None, dir_fd: int | None = None) -> int:
    """A descriptor of path, a regular file of owner's (None: anyone's), opened without following a link.
    Raises NotTheTasks, or the OSError of the open (a missing file: FileNotFoundError)."""
    try:
        fd = os.open(path, OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotTheTasks(errno.ELOOP, "a symbolic link: not read", path) from None
        raise
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise NotTheTasks(errno.EPERM, "not a regular file: not read", path)
        if owner is not None and found.st_uid != owner:
            raise NotTheTasks(errno.EPERM, f"owned by uid {found.st_uid}, not the task's (uid {owner}): not read",
                              path)
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str, owner: int | None, limit: int = -1) -> bytes:
    """The file's bytes (at most limit, when given), read as open_file allows."""
    with os.fdopen(open_file(path, owner), "rb") as f:
        return f.read(limit)


def files_under(directory: str) -> Iterator[tuple[str, int, str]]:
    """(path relative to directory, the descriptor of its dir, its name) of every file below directory, dirs
    walked without following links; the descriptor is good until the next item. Nothing when directory is
    not there (yet, or any more)."""
    walk = os.fwalk(directory, follow_symlinks=False)
    while True:
        try:
            folder, _, names, dir_fd = next(walk)
        except (StopIteration, FileNotFoundError, NotADirectoryError):
            return
        relative = os.path.relpath(folder, directory)
        for name in names:
            yield (name if relative == "." else os.path.join(relative, name)), dir_fd, name


def open_below(directory: str, relative: str, owner: int | None) -> int:
    """open_file for a path below directory, each dir on the way opened without following a link: a task cannot
    turn one of them into a link between the agent's listing and its read."""
    *folders, name = relative.split("/")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # as named: a spec's dir may be a link
    try:
        for folder in folders:
            try:
                inner = os.open(folder, DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise NotTheTasks(e.errno, "not a directory of the task's: not read",
                                      os.path.join(directory, relative)) from None
                raise
            os.close(fd)
            fd = inner
        return open_file(name, owner, dir_fd=fd)
    finally:
        os.close(fd)


def read_state(directory: str, owner: int | None, limit: int = 1 << 20) -> str | None:
    """The text of the `checkpoint` state file in directory, read as open_file allows; None when there is none
    the agent may read (the caller then knows of no checkpoint there)."""
    try:
        with os.fdopen(open_below(directory, STATE_FILE, owner), "rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return None
