"""The files side of the peer port: one transfer's files, written under an incoming dir of the job and moved
into <state-dir>/jobs/<job>/checkpoints at commit, the state files last.

Every step goes through open directory descriptors, component by component with O_NOFOLLOW, never through
a path string: the checkpoint dir belongs to the job's task user, who could otherwise swap a directory for
a symbolic link between a check and a write. Files are created with O_EXCL, checked against their SHA-256,
and given to the job's task user (fchown) when the agent runs as root and the coordinator named one.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
import sys
import threading
import uuid
from pathlib import Path

import grpc

from tfcluster.checkpoints import STATE_FILE
from tfcluster.layout import INCOMING_PREFIX

JOB_ID_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,80}-\d+(-[a-z0-9]{1,8})?")
MAX_PATH_CHARS = 1024
MAX_NAME_BYTES = 255
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


def owner(uid: int, gid: int) -> tuple[int, int] | None:
    """Who received files go to: the job's task user, when one was named and this process may give files away
    (root); None: they stay the agent's. A gid of 0 (none given) leaves the group as it is."""
    if not uid or os.geteuid() != 0:
        return None
    return uid, gid or -1


def safe_parts(path: str) -> tuple[str, ...]:
    """A peer's relative file path as its components, or INVALID_ARGUMENT naming what is wrong with it."""
    def refuse(why: str):
        return Refused(grpc.StatusCode.INVALID_ARGUMENT,
                       f"path {path[:200]!r}: {why}; expected a file path relative to the job's checkpoint dir")
    if not path:
        raise refuse("empty")
    if "\0" in path:
        raise refuse("contains a NUL byte")
    if len(path) > MAX_PATH_CHARS:
        raise refuse(f"longer than {MAX_PATH_CHARS} characters")
    if path.startswith("/"):
        raise refuse("absolute")
    parts = tuple(p for p in path.split("/") if p not in ("", "."))
    if not parts:
        raise refuse("names the checkpoint dir itself, not a file in it")
    if ".." in parts:
        raise refuse("leads out of the job's checkpoint dir ('..')")
    if any(len(p.encode()) > MAX_NAME_BYTES for p in parts):
        raise refuse(f"a component is longer than {MAX_NAME_BYTES} bytes")
    return parts


def _open_dir(parent: int, name: str, create: bool, give_to: tuple[int, int] | None) -> int:
    """A descriptor of directory name in parent, never through a symbolic link; created (and given away) when
    missing and create is set."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symbolic link" if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode) \
                else "not a directory"
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{name}: {kind} on the way; refused") from None
        raise
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
    except FileExistsError:
        pass  # another transfer of the job made it meanwhile
    fd = _open_dir(parent, name, False, None)
    if give_to is not None:
        os.fchown(fd, *give_to)
    return fd


def _open_dirs(root: int, parts: tuple[str, ...], give_to: tuple[int, int] | None) -> int:
    """A descriptor of root/parts..., each component opened (or made) in turn; the caller closes it."""
    fd = os.dup(root)
    try:
        for part in parts:
            child = _open_dir(fd, part, True, give_to)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _size(fd: int) -> int:
    """The bytes of every file under a directory descriptor (links not followed)."""
    total = 0
    for _, _, files, dir_fd in os.fwalk(".", dir_fd=fd):
        for name in files:
            try:
                total += os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size
            except OSError:
                pass
    return total


class Incoming:
    """One transfer of a job's files, from its first chunk to its commit (or its end without one).

    Its methods run on worker threads, one at a time for a stream; the lock keeps a cleanup from running
    beside a write that a cancelled stream left under way."""

    def __init__(self, state_dir: Path, job_id: str, give_to: tuple[int, int] | None):
        self.state_dir, self.job_id, self.give_to = state_dir, job_id, give_to
        self.lock = threading.Lock()
        self.received: list[tuple[str, ...]] = []
        self.size, self.allowed, self.out, self.digest, self.current = 0, 0, None, None, ()
        self.fds: list[int] = []
        self.name, self.made = f"{INCOMING_PREFIX}{uuid.uuid4().hex}", False

    def open(self, quota: int) -> None:
        root = self._keep(os.open(self.state_dir, DIR_FLAGS))
        self.job = self._keep(_open_dirs(root, ("jobs", self.job_id), None))
        self.checkpoints = self._keep(_open_dirs(self.job, ("checkpoints",), self.give_to))
        self.allowed = quota - _size(self.checkpoints)
        os.mkdir(self.name, 0o700, dir_fd=self.job)  # the agent's alone until commit
        self.made = True
        self.incoming = self._keep(os.open(self.name, DIR_FLAGS, dir_fd=self.job))

    def _keep(self, fd: int) -> int:
        self.fds.append(fd)
        return fd

    def write(self, path: str, data: bytes, end_of_file: bool, sha256: str, quota: int) -> None:
        with self.lock:
            self.size += len(data)
            if self.size > self.allowed:
                raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{self.job_id}: more than this node's quota of {quota} bytes per job")
            if self.out is None:
                self.current = safe_parts(path)
                self.out, self.digest = self._create(self.current), hashlib.sha256()
            self.out.write(data)
            self.digest.update(data)
            if end_of_file:
                self.out.close()
                self.out = None
                if self.digest.hexdigest() != sha256:
                    raise Refused(grpc.StatusCode.DATA_LOSS, f"{'/'.join(self.current)}: checksum mismatch")
                self.received.append(self.current)

    def _create(self, parts: tuple[str, ...]):
        parent = _open_dirs(self.incoming, parts[:-1], None)
        try:
            fd = os.open(parts[-1], FILE_FLAGS, 0o600, dir_fd=parent)
        except FileExistsError:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                          f"path {'/'.join(parts)!r}: sent twice, or a dir of another file") from None
        finally:
            os.close(parent)
        if self.give_to is not None:
            os.fchown(fd, *self.give_to)
        return os.fdopen(fd, "wb")

    def commit(self) -> None:
        """Moves the files into place, state files last, each with an atomic rename."""
        with self.lock:
            if self.out is not None:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                              f"{'/'.join(self.current)}: commit before the file's last chunk")
            for parts in sorted(self.received, key=lambda p: p[-1] == STATE_FILE):
                source = _open_dirs(self.incoming, parts[:-1], None)
                try:
                    target = _open_dirs(self.checkpoints, parts[:-1], self.give_to)
                    try:
                        self._replace(parts, source, target)
                    finally:
                        os.close(target)
                finally:
                    os.close(source)

    def _replace(self, parts: tuple[str, ...], source: int, target: int) -> None:
        try:
            mode = os.stat(parts[-1], dir_fd=target, follow_symlinks=False).st_mode
        except FileNotFoundError:
            mode = 0
        if stat.S_ISLNK(mode) or stat.S_ISDIR(mode):
            kind = "a symbolic link" if stat.S_ISLNK(mode) else "a directory"
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{'/'.join(parts)}: {kind} is in the way; refused")
        os.replace(parts[-1], parts[-1], src_dir_fd=source, dst_dir_fd=target)

    def close(self) -> None:
        """Removes what was not committed; frees the descriptors."""
        with self.lock:
            if self.out is not None:
                self.out.close()
                self.out = None
            if self.made:
                remove_tree_at(self.job, self.name)
            while self.fds:
                os.close(self.fds.pop())


def remove_tree_at(dir_fd: int, name: str) -> None:
    """Removes the tree `name` in the directory dir_fd, walked through descriptors, no link followed."""
    if sys.version_info >= (3, 11):
        shutil.rmtree(name, dir_fd=dir_fd, ignore_errors=True)
    else:  # Python 3.10's rmtree takes no dir_fd: the same directory, reached through its descriptor
        shutil.rmtree(f"/proc/self/fd/{dir_fd}/{name}", ignore_errors=True)


def open_incoming(state_dir: Path, job_id: str, quota: int, give_to: tuple[int, int] | None) -> Incoming:
    """A transfer's start; an OSError on the way becomes a refusal that says what failed."""
    incoming = Incoming(state_dir, job_id, give_to)
    try:
        incoming.open(quota)
    except BaseException as e:
        incoming.close()
        if isinstance(e, OSError):
            raise as_refusal(e, job_id) from None
        raise
    return incoming


def as_refusal(e: OSError, what: str) -> Refused:
    code = grpc.StatusCode.RESOURCE_EXHAUSTED if e.errno in NO_SPACE else grpc.StatusCode.FAILED_PRECONDITION
    return Refused(code, f"{what}: cannot write on this node: {e.strerror or e}")
