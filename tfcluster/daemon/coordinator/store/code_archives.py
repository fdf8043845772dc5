"""The coordinator's code archives: content-addressed files under its state dir, kept while a job uses them.

An upload is written to `<hex>-<size>-<uploader>.part` as its chunks arrive, in order; a client that was cut off asks
how much is held and sends the rest. The whole is fsync'd, its size and sha256 checked, and only then
renamed to `<hex>.tar.gz`: a name that exists is a complete, verified archive, and nothing else is served.
Verified means its headers too (tfcluster/codeunpack.py): an archive whose files add up to more than
`--max-code-unpacked-bytes`, or that holds anything but files, folders and symbolic links inside its tree,
is refused with the reason, so that its submitter hears of it from `tfcluster start`, not from every node.
A job's spec names its archive (JobSpec.code_sha256); an archive is removed once no kept job names it and
its grace after upload (or after a client last found it here) is over, so that an upload is not removed
in the moment before the job that needs it is submitted.

Code is its uploaders': `<hex>.owners` beside the archive lists the names (from their certificates) of
everyone who sent its bytes, and only they may name it in a job (rpc/code_service.py decides, core/access/rules.py says
the rule). An upload goes to a part of its uploader's own, so that nobody learns of, adds to or spoils
another's upload under way; a second uploader of the same tree sends it whole, which proves they hold it, and
is added to the owners. An archive with no owners file was stored before owners were recorded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterable
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
OWNERS = ".owners"       # beside `<hex>.tar.gz`: who uploaded it
MAX_OWNERS_BYTES = 1 << 20  # an owners file is a few names; one larger is damaged, not read
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
        # An archive and its owners change together: an upload finishing (off the event loop) and the sweep
        # (on a thread of its own) must not interleave, or an archive could be left without its owners.
        self.lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    # ---- where things are --------------------------------------------------------------------------

    def path(self, sha256: str) -> Path:
        """The complete archive's file (it exists only once verified). Raises CodeRefused for a bad name."""
        return self.directory / f"{_hex(sha256)}.tar.gz"

    def _part(self, sha256: str, size: int, uploader: str) -> Path:
        """The upload under way of one uploader (a name from a certificate may hold any character: hashed)."""
        tag = hashlib.sha256(uploader.encode()).hexdigest()[:16]
        return self.directory / f"{_hex(sha256)}-{size}-{tag}.part"

    def _owners_file(self, sha256: str) -> Path:
        return self.directory / f"{_hex(sha256)}{OWNERS}"

    def has(self, sha256: str) -> bool:
        return SHA256_RE.fullmatch(sha256) is not None and self.path(sha256).is_file()

    def owners(self, sha256: str) -> frozenset[str] | None:
        """The names of those who uploaded the archive; None: it was stored before owners were recorded. A
        damaged owners file counts as no owner (only admins may use the archive until it is uploaded again)."""
        path = self._owners_file(sha256)
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_OWNERS_BYTES + 1)
        except FileNotFoundError:
            return None
        try:
            names = json.loads(raw)["owners"] if len(raw) <= MAX_OWNERS_BYTES else None
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                return frozenset(names)
        except (ValueError, KeyError, TypeError):
            pass
        log.warning("code %s: %s cannot be read; only admins may use the archive until it is uploaded again",
                    sha256, path)
        return frozenset()

    # ---- uploads -----------------------------------------------------------------------------------

    def touch(self, sha256: str) -> int | None:
        """A client found the archive here: its grace starts again (it submits its job next). Its size; None
        when it is not here (a sweep removed it meanwhile)."""
        try:
            path = self.path(sha256)
            os.utime(path)
            return path.stat().st_size
        except FileNotFoundError:
            return None

    def received(self, sha256: str, size: int, uploader: str) -> int:
        """The bytes held of the uploader's own upload under way (0: none)."""
        try:
            return self._part(sha256, size, uploader).stat().st_size
        except FileNotFoundError:
            return 0

    def write(self, sha256: str, size: int, offset: int, data: bytes, uploader: str) -> int:
        """Appends a chunk at offset, which must be where the uploader's upload stands; returns the bytes now
        held."""
        if size > self.max_bytes:
            raise CodeRefused(f"an archive of {size} bytes is over this coordinator's cap of {self.max_bytes} "
                              f"bytes (--max-code-bytes)")
        part = self._part(sha256, size, uploader)
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

    def finish(self, sha256: str, size: int, uploader: str, earlier_users: Iterable[str] = ()) -> None:
        """Checks the upload is whole, is what its name says and holds a tree of code within the caps, and makes
        it the archive, with the uploader among its owners. An archive stored before owners were recorded gets
        `earlier_users` as owners too (those who may use it until now). Blocking (reads it all): run it off the
        event loop. Raises CodeRefused (the part is removed when its content is wrong)."""
        part = self._part(sha256, size, uploader)
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
        with self.lock:
            again = self.has(sha256)
            known = self.owners(sha256) if again else frozenset()
            owners = (frozenset(earlier_users) if known is None else known) | {uploader}
            # The owners first: an archive is never there without them. The same bytes may replace the
            # archive already here (they hash alike), which starts its grace again.
            self._write_owners(sha256, owners)
            os.replace(part, self.path(sha256))
            _fsync_dir(self.directory)
        if again:
            log.info("code %s uploaded again, by %s (owners: %s)", sha256, uploader or "a caller without a "
                     "certificate", ", ".join(sorted(owners)))
        else:
            log.info("code %s stored (%d bytes), uploaded by %s", sha256, size,
                     uploader or "a caller without a certificate")

    def _write_owners(self, sha256: str, owners: frozenset[str]) -> None:
        path = self._owners_file(sha256)
        scratch = path.with_name(path.name + ".tmp")
        with open(scratch, "w") as f:
            json.dump({"owners": sorted(owners)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(scratch, path)
        _fsync_dir(self.directory)

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
        """Removes the archives (with their owners) and stale parts that no kept job names and whose grace is
        over, and owners files left without an archive; returns the names removed."""
        removed = []
        cutoff = self.clock() - self.grace_seconds
        for path in self.directory.iterdir():
            name = path.name
            if name.endswith(".tar.gz"):
                used = f"sha256:{name[:-len('.tar.gz')]}" in in_use
            elif name.endswith((".part", f"{OWNERS}.tmp")):
                used = False
            elif name.endswith(OWNERS):  # goes with its archive; alone, it is what a crash left
                used = (self.directory / f"{name[:-len(OWNERS)]}.tar.gz").exists()
            else:
                continue
            with self.lock:  # an upload finishing now gives the archive a new grace and owners: not removed
                try:
                    if used or path.stat().st_mtime > cutoff:
                        continue
                    path.unlink()
                except FileNotFoundError:
                    continue
                if name.endswith(".tar.gz"):
                    (self.directory / f"{name[:-len('.tar.gz')]}{OWNERS}").unlink(missing_ok=True)
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
