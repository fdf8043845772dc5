"""A task's working directory over its job's code: fresh per attempt, writable by the task, while the cached
tree under it (code/cache.py) stays as fetched for every other task that uses it.

Where the agent runs as root and the kernel allows it, the working directory is an overlay mount: the cached
tree as its lower layer, the attempt's own upper and work dirs above it, so nothing is copied and what the
task writes lands in the attempt's dir. The upper layer gets every directory of the tree, owned by the
task's user, so the task may create files anywhere in it (a file it changes is copied up by the kernel).
Otherwise the tree is copied into the attempt's dir and given to the task's user. Hard links are never used:
a task could change the shared inodes through them.

The node's cache is root's alone (0700): no task may list or read another job's code there. A task reaches its
own code through its working directory (the overlay reads its lower layer with the agent's rights), and as
fetched through code/tree, a read-only bind mount of the cached tree under its attempt's dir, which only its job
may enter (TFCLUSTER_CODE_DIR); where no mount can be made, code/tree is a copy.

Layout, under the attempt's dir: code/cwd (the working directory), code/tree (the code as fetched),
code/upper and code/work (the overlay's), code/sha256 (which archive, read again after an agent restart).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
from pathlib import Path

from tfcluster import layout

log = logging.getLogger("tfcluster.agent")

CODE_DIR = layout.ATTEMPT_CODE_DIR
MOUNT_NAMES = ("cwd", "tree")  # the mounts of an attempt's code dir
MNT_DETACH = 2
MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
_OVERLAY_UNSAFE = frozenset(",:\\\n")  # what the overlay's mount options cannot carry in a path


class Workspaces:
    def __init__(self, probe_dir: Path, agent_is_root: bool):
        self.overlay_problem = "the agent does not run as root" if not agent_is_root else _probe(probe_dir)
        self.how = "overlay mounts over the cached code" if not self.overlay_problem else \
            f"copies of the cached code (no overlay mounts: {self.overlay_problem})"

    def make(self, attempt_dir: Path, tree: Path, hex_digest: str, uid: int, gid: int) -> tuple[Path, Path]:
        """(the attempt's working directory over the tree, its own and writable by uid:gid; the tree as fetched,
        read-only, where the attempt's job alone reaches it)."""
        base = attempt_dir / CODE_DIR
        self.release(attempt_dir)  # a directory left by an earlier try at this attempt starts over
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(mode=0o755)
        (base / "sha256").write_text(hex_digest + "\n")
        cwd, view = base / "cwd", base / "tree"
        if not self.overlay_problem and not _OVERLAY_UNSAFE.intersection(f"{tree}{base}"):
            upper, work = base / "upper", base / "work"
            work.mkdir(mode=0o700)
            _mirror_dirs(tree, upper, uid, gid)
            cwd.mkdir(mode=0o755)
            _mount_overlay(tree, upper, work, cwd)
            view.mkdir(mode=0o755)
            _bind_read_only(tree, view)
        else:
            shutil.copytree(tree, cwd, symlinks=True)
            _give(cwd, uid, gid)
            shutil.copytree(tree, view, symlinks=True)  # root's, as the cache's: read-only to the task
        return cwd, view

    @staticmethod
    def release(attempt_dir: Path) -> None:
        """Unmounts the attempt's working directory and view of the tree (where they are mounts); what the task
        wrote stays in upper/."""
        code = attempt_dir / CODE_DIR
        if not code.is_dir():  # the task ran in a workdir of the node's: nothing was mounted for it (most tasks)
            return
        mounted = set(_mount_points())  # read once, not once per name
        for name in MOUNT_NAMES:
            if str(code / name) in mounted:
                _umount(code / name)

    @staticmethod
    def code_of(attempt_dir: Path) -> str:
        """The hex digest of the archive an attempt's working directory is over ("": none)."""
        try:
            return (attempt_dir / CODE_DIR / "sha256").read_text().strip()
        except OSError:
            return ""

    @staticmethod
    def unmount_stale(jobs_dir: Path, live: set[Path]) -> int:
        """Unmounts the working directories under jobs_dir of attempts not in `live` (their task ended while no
        agent watched, or they were never started): found in the mount table, so a restart leaves none behind."""
        stale = set()
        for mount_point in _mount_points():
            path = Path(mount_point)
            if path.name in MOUNT_NAMES and path.parent.name == CODE_DIR and jobs_dir in path.parents \
                    and path.parent.parent not in live:
                _umount(path)
                stale.add(path.parent.parent)
        return len(stale)


def _probe(directory: Path) -> str:
    """Why overlay mounts cannot be made here ("": they can), found by making one."""
    shutil.rmtree(directory, ignore_errors=True)
    parts = [directory / name for name in ("lower", "upper", "work", "merged")]
    try:
        for part in parts:
            part.mkdir(parents=True)
        _mount_overlay(*parts)
        _umount(parts[3])
        return ""
    except OSError as e:
        return e.strerror or str(e)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
    libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
    return libc


def _mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    options = f"lowerdir={lower},upperdir={upper},workdir={work}".encode()
    if _libc().mount(b"overlay", str(target).encode(), b"overlay", 0, options) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"overlay mount: {os.strerror(number)}", str(target))


def _bind_read_only(source: Path, target: Path) -> None:
    """source seen at target, read-only: a bind mount, then made read-only (a bind mount takes no flags of its
    own at first)."""
    libc = _libc()
    for flags in (MS_BIND, MS_REMOUNT | MS_BIND | MS_RDONLY):
        if libc.mount(str(source).encode(), str(target).encode(), None, flags, None) != 0:
            number = ctypes.get_errno()
            if flags != MS_BIND:
                _umount(target)
            raise OSError(number, f"read-only bind mount: {os.strerror(number)}", str(target))


def _umount(target: Path) -> None:
    """Detaches the mount: a process still in it (a straggler of the task) does not keep it from going."""
    if _libc().umount2(str(target).encode(), MNT_DETACH) != 0 and ctypes.get_errno() not in (errno.EINVAL,
                                                                                            errno.ENOENT):
        number = ctypes.get_errno()
        log.warning("cannot unmount %s: %s", target, os.strerror(number))


def is_mount(path: Path) -> bool:
    """True when something is mounted on path; unlike os.path.ismount, also a bind mount of a dir of the same
    filesystem (the mount table says so, device numbers do not)."""
    return str(path) in _mount_points()


def _mount_points() -> list[str]:
    """The mount points in this process's mount table (octal escapes undone)."""
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                found.append(line.split(" ")[4].encode().decode("unicode_escape"))
    except OSError:
        pass
    return found


def _mirror_dirs(tree: Path, upper: Path, uid: int, gid: int) -> None:
    """Every directory of the tree, empty, owned by the task's user: the overlay shows them as the task's."""
    for top, dirs, _ in os.walk(tree):
        target = upper / os.path.relpath(top, tree)
        target.mkdir(mode=0o755, exist_ok=True)
        os.chown(target, uid, gid)


def _give(root: Path, uid: int, gid: int) -> None:
    """A copied tree, the task user's."""
    if os.geteuid() != 0:
        return
    for top, dirs, files in os.walk(root):
        for name in (top, *(os.path.join(top, n) for n in dirs + files)):
            os.lchown(name, uid, gid)
