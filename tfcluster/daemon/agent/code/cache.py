"""The node's cache of job code: each archive fetched once, kept beside its unpacked tree, both named by hash.

<state-dir>/code/<hex>.tar.gz is the archive as fetched (other agents may fetch it from here), <hex>/ its tree:
root-owned, dirs 0755 and files 0644 (0755 where the archive says executable), so that the tasks that use it read
it (through their attempt's dir: the cache itself is root's alone, 0700) and none writes it. A tree appears under its name only once whole (unpacked under another name, then
renamed), so after a restart whatever is named <hex>/ beside its archive is an entry, and anything else left
there is a crash's leftovers, removed. Unpacking is bounded (unpack.py): an archive past this node's bounds,
or holding what no tree of code holds, is refused and removed, and no entry is made of it.

Several launches of the same archive at once wait for one fetch. The cache holds at most `max_bytes` (the
archives and trees together), dropping the least recently used entries first, but never one that a live task
uses: each attempt pins its entry until it ends (or, after an agent restart, until the adopted task ends).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tfcluster.codechunks import NAME_RE, CodeError
from tfcluster.codeunpack import label
from tfcluster.daemon.agent.code.unpack import FILE_MODE, Bounds, unpack

log = logging.getLogger("tfcluster.agent")

DEFAULT_CACHE_BYTES = 10 << 30  # `--cache-bytes 10G`
UNPACKING = ".unpacking"
# The cache is root's alone: a task reaches its own job's code through its attempt's dir (workspace.py), never here.
CACHE_DIR_MODE = 0o700

# Fetches the archive named by a hex digest, for a job, from the sources given, into a file.
Fetch = Callable[[str, str, tuple[str, ...], Path], None]


@dataclass
class Entry:
    size: int
    last_used: float
    pins: set[str] = field(default_factory=set)


@dataclass
class _Pending:
    """A fetch under way: the launches of the same archive wait for it."""
    done: threading.Event = field(default_factory=threading.Event)
    error: str = ""


class CodeCache:
    def __init__(self, directory: Path, max_bytes: int, fetch: Fetch, clock: Callable[[], float] = time.time,
                 bounds: Bounds = Bounds()):
        self.directory, self.max_bytes, self.fetch, self.clock = directory, max_bytes, fetch, clock
        self.bounds = bounds  # of one archive, unpacked
        self.lock = threading.Lock()
        self.entries: dict[str, Entry] = {}
        self.pending: dict[str, _Pending] = {}
        self.fetches = 0  # archives fetched by this process: a second launch of a cached hash adds none
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, CACHE_DIR_MODE)
        self._load()

    # ---- paths -------------------------------------------------------------------------------------

    def tree(self, hex_digest: str) -> Path:
        return self.directory / hex_digest

    def archive(self, hex_digest: str) -> Path:
        return self.directory / f"{hex_digest}.tar.gz"

    def holds(self, hex_digest: str) -> bool:
        with self.lock:
            return hex_digest in self.entries

    # ---- use ---------------------------------------------------------------------------------------

    def acquire(self, hex_digest: str, job_id: str, sources: tuple[str, ...], pin: str) -> Path:
        """The unpacked tree of the archive, fetched first if this node lacks it, pinned for `pin` (an attempt)
        until release(pin). Raises CodeError with why it could not be had."""
        while True:
            with self.lock:
                entry = self.entries.get(hex_digest)
                if entry is not None:
                    entry.pins.add(pin)
                    entry.last_used = self.clock()
                    os.utime(self.tree(hex_digest))  # its order in the cache, kept across a restart
                    return self.tree(hex_digest)
                pending = self.pending.get(hex_digest)
                mine = pending is None
                if mine:
                    pending = self.pending[hex_digest] = _Pending()
            if mine:
                break
            pending.done.wait()
            if pending.error:
                raise CodeError(pending.error)
        made: Entry | None = None
        try:
            made = Entry(self._fetch_and_unpack(hex_digest, job_id, sources), self.clock(), {pin})
        except CodeError as e:
            pending.error = str(e)
        except OSError as e:
            pending.error = f"cannot unpack {label(hex_digest)}: {e.strerror or e}"
        except Exception:
            log.exception("code cache: sha256:%s could not be made ready", hex_digest[:12])
            pending.error = f"cannot unpack {label(hex_digest)}: the agent failed (its log says why)"
        finally:
            with self.lock:  # an entry only for a tree really made; anything else fails every waiter
                del self.pending[hex_digest]
                if made is not None:
                    self.entries[hex_digest] = made
                elif not pending.error:
                    pending.error = f"cannot unpack {label(hex_digest)}: the agent stopped"
            pending.done.set()
        if made is None:
            raise CodeError(pending.error)
        self.evict()
        return self.tree(hex_digest)

    def pin(self, hex_digest: str, pin: str) -> bool:
        """Pins an entry already here (an adopted task's, after a restart); False when it is not."""
        with self.lock:
            entry = self.entries.get(hex_digest)
            if entry is not None:
                entry.pins.add(pin)
            return entry is not None

    def release(self, pin: str) -> None:
        """The attempt no longer uses its entry: it may go once the cache needs the room."""
        with self.lock:
            for entry in self.entries.values():
                entry.pins.discard(pin)
        self.evict()

    def evict(self) -> list[str]:
        """Drops the least recently used unpinned entries until the cache fits its cap; returns their hashes."""
        with self.lock:
            total = sum(e.size for e in self.entries.values())
            dropped = []
            for hex_digest, entry in sorted(self.entries.items(), key=lambda item: item[1].last_used):
                if total <= self.max_bytes:
                    break
                if entry.pins:
                    continue
                del self.entries[hex_digest]
                total -= entry.size
                dropped.append(hex_digest)
        for hex_digest in dropped:
            self._remove(hex_digest)
            log.info("code cache: removed sha256:%s (least recently used; the cache holds %d bytes of %d)",
                     hex_digest[:12], total, self.max_bytes)
        return dropped

    def used_bytes(self) -> int:
        with self.lock:
            return sum(e.size for e in self.entries.values())

    # ---- filling -----------------------------------------------------------------------------------

    def _fetch_and_unpack(self, hex_digest: str, job_id: str, sources: tuple[str, ...]) -> int:
        archive = self.archive(hex_digest)
        if not archive.is_file():  # (one whose unpacking failed on an error of the node's, kept: it was verified)
            part = self.directory / f"{hex_digest}.part"
            self.fetch(hex_digest, job_id, sources, part)
            self.fetches += 1
            os.chmod(part, FILE_MODE)
            os.replace(part, archive)
        unpacking = self.directory / f"{hex_digest}{UNPACKING}"
        shutil.rmtree(unpacking, ignore_errors=True)
        try:  # an empty tree is a folder all the same (a job whose workdir has no files)
            size = unpack(archive, unpacking, label(hex_digest), self.bounds) + archive.stat().st_size
        except CodeError:
            archive.unlink(missing_ok=True)  # refused, or its tree could not be written: no bytes left uncounted
            raise
        os.replace(unpacking, self.tree(hex_digest))
        return size

    def _remove(self, hex_digest: str) -> None:
        shutil.rmtree(self.tree(hex_digest), ignore_errors=True)
        self.archive(hex_digest).unlink(missing_ok=True)

    def _load(self) -> None:
        """The entries a previous agent process left whole, least recently used first; its leftovers go."""
        for path in self.directory.iterdir():
            name = path.name
            whole = NAME_RE.fullmatch(name) and path.is_dir() and self.archive(name).is_file()
            archive_of_whole = name.endswith(".tar.gz") and self.tree(name[:-len(".tar.gz")]).is_dir()
            if whole:
                size = _tree_bytes(path) + self.archive(name).stat().st_size
                self.entries[name] = Entry(size, path.stat().st_mtime)
            elif not archive_of_whole:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
        if self.entries:
            log.info("code cache: %d archives (%d bytes) kept from before", len(self.entries), self.used_bytes())


def _tree_bytes(root: Path) -> int:
    return sum(os.lstat(os.path.join(top, name)).st_size for top, _, files in os.walk(root) for name in files)
