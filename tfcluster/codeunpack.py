"""What a job's code archive would unpack to, read from its headers alone, and refused before anything is
written when it is more than the tree codepack.py makes.

Both ends read an archive this way: the coordinator when an upload is complete (store/code_archives.py), the agent
before it unpacks one (daemon/agent/code/unpack.py). An archive may hold regular files, folders and symbolic
links, under relative, normalised paths that stay inside the tree, none below a link or a file, each
named once; a link's target is relative and, taken as written, stays inside the tree. Its files together
(a sparse file counted at its full size) and its members are bounded, and so is how far the gzip stream
is read, so that a small archive cannot make either end decompress, hold or write much more than the
bounds allow. Pure: an archive file in, a listing out; tarfile reads it, nothing is extracted here.
"""

from __future__ import annotations

import gzip
import posixpath
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tfcluster.codechunks import CodeError
from tfcluster.codepack import binary_bytes, human_bytes

DEFAULT_MAX_MEMBERS = 100_000
HEADER_ALLOWANCE = 8 << 10  # a member's header blocks, a long name's pax header and its padding, and more
MAX_READ = 1 << 20          # tarfile reads a pax or long-name header whole: at most this much at once
CAP_FLAG = "--max-code-unpacked-bytes"
_REFUSED_KINDS = {tarfile.LNKTYPE: "a hard link", tarfile.CHRTYPE: "a character device",
                  tarfile.BLKTYPE: "a block device", tarfile.FIFOTYPE: "a FIFO"}


@dataclass(frozen=True)
class Limits:
    max_bytes: int                           # the files together, unpacked (--max-code-unpacked-bytes)
    max_members: int = DEFAULT_MAX_MEMBERS   # files, folders and links
    whose: str = "this node's"               # whose cap a refusal names


@dataclass
class Listing:
    """An archive's members, checked: what to make, in an order that makes each parent before its children."""
    folders: list[str] = field(default_factory=list)  # every folder, those only implied by a path too, sorted
    files: list[tarfile.TarInfo] = field(default_factory=list)  # in the archive's order
    links: list[tarfile.TarInfo] = field(default_factory=list)
    total_bytes: int = 0  # the files' sizes added up
    members: int = 0


def label(hex_digest: str) -> str:
    """How refusals name an archive: `sha256:ab12cd34ef56...`."""
    return f"sha256:{hex_digest[:12]}..."


@contextmanager
def opened(path: Path, name: str, limits: Limits) -> Iterator[tuple[tarfile.TarFile, Listing]]:
    """The archive open for reading its files' data, and its listing. Raises CodeError, naming the archive
    as `name`: an archive past the limits or holding what no tree of code holds, or not a gzip'd tar."""
    with gzip.open(path, "rb") as unzipped:
        stream = _Bounded(unzipped, limits.max_bytes + (limits.max_members + 1) * HEADER_ALLOWANCE)
        tar = _parse(lambda: tarfile.open(fileobj=stream, mode="r:"), name)
        with tar:
            yield tar, _scan(tar, name, limits)


def listing(path: Path, name: str, limits: Limits) -> Listing:
    """The archive's listing alone (see opened())."""
    with opened(path, name, limits) as (_, found):
        return found


def _scan(tar: tarfile.TarFile, name: str, limits: Limits) -> Listing:
    """Reads every header, stopping at the first that passes a limit, so that the data skipped over to reach
    the next header (the gzip stream is read all the same) never exceeds the limit either."""
    found, kinds = Listing(), {}
    while (info := _parse(tar.next, name)) is not None:
        found.members += 1
        if found.members > limits.max_members:
            raise _too_many(name, limits)
        check_member(info, name)
        if info.name in kinds:
            raise CodeError(f"{name}: {info.name!r} appears twice in the archive")
        if info.isreg():
            kinds[info.name] = "file"
            found.files.append(info)
            found.total_bytes += info.size
            if found.total_bytes > limits.max_bytes:
                raise CodeError(f"{name}: unpacks to {human_bytes(found.total_bytes)} or more ({info.name!r} "
                                f"alone is {human_bytes(info.size)}), over {limits.whose} cap of "
                                f"{binary_bytes(limits.max_bytes)} ({CAP_FLAG})")
        elif info.issym():
            kinds[info.name] = "symbolic link"
            found.links.append(info)
        else:
            kinds[info.name] = "folder"
    found.folders = _folders(kinds, name, limits)
    return found


def _too_many(name: str, limits: Limits) -> CodeError:
    return CodeError(f"{name}: holds more than {limits.max_members} members (files, folders and links), "
                     f"{limits.whose} limit")


def check_member(info: tarfile.TarInfo, name: str) -> None:
    """Refuses (CodeError) a member no tree of code holds: another kind than a file, folder or symbolic
    link, a path that is not relative and normalised, a size below zero, a link leaving the tree."""
    if not (info.isreg() or info.isdir() or info.issym()):
        kind = _REFUSED_KINDS.get(info.type, f"a member of type {info.type!r}")
        raise CodeError(f"{name}: {info.name!r} is {kind}; an archive of code holds only files, folders and "
                        f"symbolic links")
    path = info.name
    if (not path or "\0" in path or path.startswith("/") or posixpath.normpath(path) != path or path == "."
            or ".." in path.split("/")):
        raise CodeError(f"{name}: a member is named {path!r}; each must be a relative, normalised path "
                        f"inside the tree (no leading '/', no '.' or '..' parts, no NUL)")
    if info.size < 0:
        raise CodeError(f"{name}: {path!r} says it holds {info.size} bytes")
    if info.issym():
        target = info.linkname
        reached = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        if not target or "\0" in target or target.startswith("/") or reached == ".." or \
                reached.startswith("../"):
            raise CodeError(f"{name}: {path!r} is a symbolic link to {target!r}, outside the tree; a link "
                            f"may point only inside it, by a relative path")


def _folders(kinds: dict[str, str], name: str, limits: Limits) -> list[str]:
    """Every folder the members need, parents first; refuses a member below a link or a file, which would
    place it somewhere other than its path says. The folders a path only implies count as members too: deep
    paths would otherwise make many more folders than the archive has members."""
    folders = {path for path, kind in kinds.items() if kind == "folder"}
    room = limits.max_members - len(kinds) + len(folders)
    for path in kinds:
        parent = posixpath.dirname(path)
        while parent and parent not in folders:
            if parent in kinds:
                raise CodeError(f"{name}: {path!r} lies below {parent!r}, which is a {kinds[parent]}; only "
                                f"folders may hold members")
            folders.add(parent)
            if len(folders) > room:
                raise _too_many(name, limits)
            parent = posixpath.dirname(parent)
    return sorted(folders)


def _parse(read, name: str):
    """read() of tarfile's, with what any of its parsers raise on hostile bytes said as one refusal."""
    try:
        return read()
    except Exception as e:  # tarfile's parsers let IndexError, ValueError, RecursionError and more through
        raise CodeError(f"{name}: not a gzip'd tar archive that can be read: {e}") from None


class _Bounded:
    """The decompressed stream as tarfile reads it, refusing any one read past MAX_READ and any position
    past `limit`, so that a header that says it is huge, or a chain of them, cannot exhaust memory or time."""

    def __init__(self, stream, limit: int):
        self.stream, self.limit = stream, limit

    def read(self, size: int = -1) -> bytes:
        if size < 0 or size > MAX_READ:
            raise tarfile.ReadError(f"a header of {size} bytes, over the {MAX_READ} bytes any header may take")
        self._reach(self.stream.tell() + size)
        return self.stream.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 0:
            self._reach(offset)
        return self.stream.seek(offset, whence)

    def tell(self) -> int:
        return self.stream.tell()

    def _reach(self, position: int) -> None:
        if position > self.limit:
            raise tarfile.ReadError(f"its headers and files run past {self.limit} bytes unpacked, more than "
                                    f"its limits allow")
