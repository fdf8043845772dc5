"""A task's working directory over its job's code: fresh per attempt, writable by the task, while the cached
tree under it (codecache.py) stays as fetched for every other task that uses it.

Where the agent runs as root and the kernel allows it, the working directory is an overlay mount: the cached
tree as its lower layer, the attempt's own upper and work dirs above it, so nothing is copied and what the
task writes lands in the attempt's dir. The upper layer gets every directory of the tree, owned by the
task's user, so the task may create files anywhere in it (a file it changes is copied up by the kernel).
Otherwise the tree is copied into the attempt's dir and given to the task's user. Hard links are never used:
a task could change the shared inodes through them.

Layout, under the attempt's dir: code/cwd (the working directory), code/upper and code/work (the overlay's),
code/sha256 (which archive, read again after an agent restart).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger("tfcluster.agent")

CODE_DIR = "code"
MNT_DETACH = 2
_OVERLAY_UNSAFE = frozenset(",:\\\n")  # what the overlay's mount options cannot carry in a path


class Workspaces:
    def __init__(self, probe_dir: Path, agent_is_root: bool):
        self.overlay_problem = "the agent does not run as root" if not agent_is_root else _probe(probe_dir)
        self.how = "overlay mounts over the cached code" if not self.overlay_problem else \
            f"copies of the cached code (no overlay mounts: {self.overlay_problem})"

    def make(self, attempt_dir: Path, tree: Path, hex_digest: str, uid: int, gid: int) -> Path:
        """The attempt's working directory over the tree, its own and writable by uid:gid."""
        base = attempt_dir / CODE_DIR
        self.release(attempt_dir)  # a directory left by an earlier try at this attempt starts over
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(mode=0o755)
        (base / "sha256").write_text(hex_digest + "\n")
        cwd = base / "cwd"
        if not self.overlay_problem and not _OVERLAY_UNSAFE.intersection(f"{tree}{base}"):
            upper, work = base / "upper", base / "work"
            work.mkdir(mode=0o700)
            _mirror_dirs(tree, upper, uid, gid)
            cwd.mkdir(mode=0o755)
            _mount_overlay(tree, upper, work, cwd)
        else:
            shutil.copytree(tree, cwd, symlinks=True)
            _give(cwd, uid, gid)
        return cwd

    @staticmethod
    def release(attempt_dir: Path) -> None:
        """Unmounts the attempt's working directory (if it is a mount); what the task wrote stays in upper/."""
        cwd = attempt_dir / CODE_DIR / "cwd"
        if os.path.ismount(cwd):
            _umount(cwd)

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
        count = 0
        for mount_point in _overlay_mounts():
            path = Path(mount_point)
            if path.name == "cwd" and path.parent.name == CODE_DIR and jobs_dir in path.parents \
                    and path.parent.parent not in live:
                _umount(path)
                count += 1
        return count


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


def _umount(target: Path) -> None:
    """Detaches the mount: a process still in it (a straggler of the task) does not keep it from going."""
    if _libc().umount2(str(target).encode(), MNT_DETACH) != 0 and ctypes.get_errno() not in (errno.EINVAL,
                                                                                            errno.ENOENT):
        number = ctypes.get_errno()
        log.warning("cannot unmount %s: %s", target, os.strerror(number))


def _overlay_mounts() -> list[str]:
    """The mount points of overlay mounts in this process's mount table (octal escapes undone)."""
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "overlay":
                    found.append(left.split(" ")[4].encode().decode("unicode_escape"))
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
