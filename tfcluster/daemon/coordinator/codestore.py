"""The coordinator's code archives: content-addressed files under its state dir, kept while a job uses them.

An upload is written to `<hex>-<size>.part` as its chunks arrive, in order; a client that was cut off asks
how much is held and sends the rest. The whole is fsync'd, its size and sha256 checked, and only then
renamed to `<hex>.tar.gz`: a name that exists is a complete, verified archive, and nothing else is served.
Verified means its headers too (tfcluster/codeunpack.py): an archive whose files add up to more than
`--max-code-unpacked-bytes`, or that holds anything but files, folders and symbolic links inside its tree,
is refused with the reason, so that its submitter hears of it from `tfcluster start`, not from every node.
A job's spec names its archive (JobSpec.code_sha256); an archive is removed once no kept job names it and
its grace after upload (or after a client last found it here) is over, so that an upload is not removed
in the moment before the job that needs it is submitted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from pathlib import Path

from tfcluster import codeunpack
from tfcluster.codechunks import CodeError

log = logging.getLogger("tfcluster.coordinator")

DEFAULT_MAX_BYTES = 256 << 20
DEFAULT_STORE_BYTES = 20 << 30  # all archives and uploads together (`--code-store-bytes`)
UNPACKED_PER_PACKED = 16  # `--max-code-unpacked-bytes` by default, times `--max-code-bytes`
GRACE_SECONDS = 3600.0   # an archive no job names yet is kept this long after it was last asked about
MAX_UPLOADS = 32         # parts of archives being uploaded at once (a stale one goes after its grace)
SHA256_RE = re.compile(r"sha256:([0-9a-f]{64})")
_HASH_CHUNK = 1 << 20


class CodeRefused(Exception):
    """An upload the store does not take: the message says why, and `received` where to go on from."""

    def __init__(self, message: str, received: int = 0):
        super().__init__(message)
        self.received = received


class CodeStore:
    def __init__(self, directory: Path, max_bytes: int = DEFAULT_MAX_BYTES, clock=time.time,
                 grace_seconds: float = GRACE_SECONDS, store_bytes: int = DEFAULT_STORE_BYTES,
                 max_unpacked_bytes: int | None = None):
        self.directory, self.max_bytes, self.clock, self.grace_seconds = directory, max_bytes, clock, grace_seconds
        self.store_bytes = store_bytes  # a cap on the whole store, so that uploads cannot fill the disk
        self.max_unpacked_bytes = max_unpacked_bytes or UNPACKED_PER_PACKED * max_bytes
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    # ---- where things are --------------------------------------------------------------------------

    def path(self, sha256: str) -> Path:
        """The complete archive's file (it exists only once verified). Raises CodeRefused for a bad name."""
        return self.directory / f"{_hex(sha256)}.tar.gz"

    def _part(self, sha256: str, size: int) -> Path:
        return self.directory / f"{_hex(sha256)}-{size}.part"

    def has(self, sha256: str) -> bool:
        return SHA256_RE.fullmatch(sha256) is not None and self.path(sha256).is_file()

    # ---- uploads -----------------------------------------------------------------------------------

    def status(self, sha256: str, size: int) -> tuple[bool, int]:
        """(complete, bytes received of an upload in progress). Asking about a complete archive starts its
        grace again: the client that asked submits its job next."""
        path = self.path(sha256)
        if path.is_file():
            os.utime(path)
            return True, path.stat().st_size
        try:
            return False, self._part(sha256, size).stat().st_size
        except FileNotFoundError:
            return False, 0

    def write(self, sha256: str, size: int, offset: int, data: bytes) -> int:
        """Appends a chunk at offset, which must be where the upload stands; returns the bytes now held."""
        if size > self.max_bytes:
            raise CodeRefused(f"an archive of {size} bytes is over this coordinator's cap of {self.max_bytes} "
                              f"bytes (--max-code-bytes)")
        part = self._part(sha256, size)
        held = part.stat().st_size if part.exists() else 0
        if not part.exists():
            self._room_for_one_more(size)
        if offset != held:
            raise CodeRefused(f"a chunk at byte {offset}, but {held} bytes of this archive are held: send from "
                              f"there", held)
        if held + len(data) > size:
            raise CodeRefused(f"the chunks run past the archive's size of {size} bytes", held)
        with open(part, "ab") as f:
            f.write(data)
        return held + len(data)

    def finish(self, sha256: str, size: int) -> None:
        """Checks the upload is whole, is what its name says and holds a tree of code within the caps, and makes
        it the archive. Blocking (reads it all): run it off the event loop. Raises CodeRefused (the part is
        removed when its content is wrong)."""
        part = self._part(sha256, size)
        held = part.stat().st_size if part.exists() else 0
        if held != size:
            raise CodeRefused(f"the upload stopped at {held} of {size} bytes: send the rest", held)
        digest = hashlib.sha256()
        with open(part, "rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                digest.update(chunk)
            os.fsync(f.fileno())
        if f"sha256:{digest.hexdigest()}" != sha256:
            part.unlink(missing_ok=True)
            raise CodeRefused(f"the bytes received hash to sha256:{digest.hexdigest()}, not {sha256}: "
                              f"send the archive again")
        self._check_listing(part, sha256)
        os.replace(part, self.path(sha256))
        _fsync_dir(self.directory)
        log.info("code %s stored (%d bytes)", sha256, size)

    def _check_listing(self, part: Path, sha256: str) -> None:
        """Reads the archive's headers (its data only to skip it, and no further than the caps): one past this
        coordinator's cap, or holding what no tree of code holds, is refused here, and its part removed."""
        limits = codeunpack.Limits(self.max_unpacked_bytes, whose="this coordinator's")
        try:
            codeunpack.listing(part, codeunpack.label(_hex(sha256)), limits)
        except CodeError as e:
            part.unlink(missing_ok=True)
            log.warning("code %s refused: %s", sha256, e)
            raise CodeRefused(str(e)) from None

    def _room_for_one_more(self, size: int) -> None:
        files = [p for p in self.directory.iterdir() if p.name.endswith((".part", ".tar.gz"))]
        if sum(1 for p in files if p.name.endswith(".part")) >= MAX_UPLOADS:
            raise CodeRefused(f"{MAX_UPLOADS} uploads of code are already under way here; try again later")
        held = sum(_size(p) for p in files)
        if held + size > self.store_bytes:
            raise CodeRefused(f"the coordinator's code store holds {held} of its {self.store_bytes} bytes "
                              f"(--code-store-bytes), too few for {size} more; an archive goes "
                              f"{self.grace_seconds / 60:.0f} min after it was last asked about, once no kept "
                              f"job names it")

    # ---- retention ---------------------------------------------------------------------------------

    def sweep(self, in_use: set[str]) -> list[str]:
        """Removes the archives (and stale parts) that no kept job names and whose grace is over; returns
        the names removed."""
        removed = []
        cutoff = self.clock() - self.grace_seconds
        for path in self.directory.iterdir():
            name = path.name
            if name.endswith(".tar.gz"):
                used = f"sha256:{name[:-len('.tar.gz')]}" in in_use
            elif name.endswith(".part"):
                used = False
            else:
                continue
            try:
                if used or path.stat().st_mtime > cutoff:
                    continue
                path.unlink()
            except FileNotFoundError:
                continue
            removed.append(name)
        if removed:
            log.info("code archives removed, no kept job uses them: %s", ", ".join(sorted(removed)))
        return removed


def _hex(sha256: str) -> str:
    match = SHA256_RE.fullmatch(sha256)
    if match is None:
        raise CodeRefused(f"sha256: expected \"sha256:\" and 64 lowercase hex digits, got {sha256[:80]!r}")
    return match.group(1)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # removed by a sweep meanwhile
        return 0


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
