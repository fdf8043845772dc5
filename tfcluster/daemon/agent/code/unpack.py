"""Unpacking a job's code archive into a fresh folder of the node's code cache, the same on every Python.

The archive's headers are read first (tfcluster/codeunpack.py): one past this node's bounds (its files
together, its members, the free disk above --min-free-disk), or holding anything but files, folders and
symbolic links under clean relative paths, is refused before a byte is written. The tree is then made by
hand, not by tarfile's extraction: folders first, then files (created anew, never through a link), then
the links, which only once all exist are resolved and must still lead inside the tree, since a chain of
links that each look harmless (`l -> .`, `m -> l/..`) can leave it. Owners and modes are the cache's:
root's when the agent is root, folders 0755, files 0644 or 0755 when the archive marks them executable.
On any refusal or error the folder is removed, and the CodeError says what was wrong with the archive.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from tfcluster import codeunpack
from tfcluster.codechunks import CodeError
from tfcluster.codepack import binary_bytes, human_bytes

DEFAULT_MAX_BYTES = 4 << 30  # `--max-code-unpacked-bytes 4G`
DIR_MODE, FILE_MODE, EXEC_MODE = 0o755, 0o644, 0o755
COPY_BYTES = 256 << 10  # well under codeunpack.MAX_READ: a file's data is read in pieces this size
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Bounds:
    max_bytes: int = DEFAULT_MAX_BYTES                      # --max-code-unpacked-bytes
    max_members: int = codeunpack.DEFAULT_MAX_MEMBERS
    min_free_bytes: int = 0                                 # --min-free-disk: free disk an archive may not take


def unpack(archive: Path, target: Path, name: str, bounds: Bounds = Bounds()) -> int:
    """Unpacks the archive into target, a folder made here (its parent exists, it does not), and returns the
    bytes of its files and links. Raises CodeError, naming the archive as `name`, for what is wrong with the
    archive or its tree cannot be written, OSError where the node cannot say its free disk; target is then gone."""
    limits = codeunpack.Limits(bounds.max_bytes, bounds.max_members, "this node's")
    made = False
    try:
        with codeunpack.opened(archive, name, limits) as (tar, listing):
            _check_room(listing.total_bytes, target.parent, bounds.min_free_bytes, name)
            os.mkdir(target, DIR_MODE)
            made = True
            return _make_tree(tar, listing, target, name)
    except BaseException:
        if made:
            shutil.rmtree(target, ignore_errors=True)
        raise


def _check_room(total_bytes: int, directory: Path, min_free_bytes: int, name: str) -> None:
    free = shutil.disk_usage(directory).free
    if total_bytes > free - min_free_bytes:
        raise CodeError(f"{name}: unpacks to {human_bytes(total_bytes)}, but this node's disk has "
                        f"{human_bytes(free)} free and keeps {binary_bytes(min_free_bytes)} free (--min-free-disk)")


def _make_tree(tar: tarfile.TarFile, listing: codeunpack.Listing, root: Path, name: str) -> int:
    as_root = os.geteuid() == 0
    _settle(root, DIR_MODE, as_root)
    size = 0
    for folder in listing.folders:
        path = os.path.join(root, folder)
        _making(lambda: os.mkdir(path, 0o700), folder, name)  # (not yet readable: its mode is set next)
        _settle(path, DIR_MODE, as_root)
    for info in listing.files:
        size += _write_file(tar, info, os.path.join(root, info.name), as_root, name)
    for info in listing.links:
        path = os.path.join(root, info.name)
        _making(lambda: os.symlink(info.linkname, path), info.name, name)
        if as_root:
            os.lchown(path, 0, 0)
        size += os.lstat(path).st_size  # as the cache counts a tree it finds after a restart
    _check_links(root, listing.links, name)
    return size


def _write_file(tar: tarfile.TarFile, info: tarfile.TarInfo, path: str, as_root: bool, name: str) -> int:
    data = tar.extractfile(info)
    try:
        with open(path, "wb", opener=_new_file) as out:
            while piece := data.read(COPY_BYTES):
                out.write(piece)
            out.flush()
            _settle(out.fileno(), EXEC_MODE if info.mode & 0o111 else FILE_MODE, as_root)
            return out.tell()
    except OSError as e:
        raise CodeError(f"{name}: cannot unpack {info.name!r}: {e.strerror or e}") from None
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise CodeError(f"{name}: cannot read {info.name!r} from the archive: {e}") from None


def _new_file(path: str, flags: int) -> int:
    """Only a file that did not exist, and never through a link."""
    return os.open(path, _NEW_FILE, 0o600)


def _making(make, member: str, name: str):
    """make() of a folder or link of the tree, with an OSError said as what it was making."""
    try:
        return make()
    except OSError as e:
        raise CodeError(f"{name}: cannot unpack {member!r}: {e.strerror or e}") from None


def _settle(where: str | Path | int, mode: int, as_root: bool) -> None:
    """The mode and owner of a folder (a path the agent just made) or a file (its open descriptor)."""
    os.chmod(where, mode)
    if as_root:
        os.chown(where, 0, 0)


def _check_links(root: Path, links: list[tarfile.TarInfo], name: str) -> None:
    """Every link, resolved through all the others, still leads inside the tree."""
    real_root = os.path.realpath(root)
    for info in links:
        reached = os.path.realpath(os.path.join(root, info.name))
        if reached != real_root and not reached.startswith(real_root + os.sep):
            raise CodeError(f"{name}: the symbolic link {info.name!r} -> {info.linkname!r} leads outside the "
                            f"tree through the archive's other links")
