"""A launch's code made ready for its task: the archive in the node's cache (code/cache.py), the attempt's own
working directory over it (workspace.py), and the cache served to other agents (code/fetch.py).

Each attempt pins the cache entry it works over, by its attempt dir, from its launch until it ends; an agent
restarted under running tasks pins their entries again and unmounts the working directories of attempts
that ended meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from tfcluster import layout
from tfcluster.codechunks import CodeError, hex_of
from tfcluster.commands import Launch
from tfcluster.daemon.agent.code.cache import CodeCache, Fetch
from tfcluster.daemon.agent.code.fetch import CodeServing
from tfcluster.daemon.agent.code.relay import Transfer
from tfcluster.daemon.agent.code.unpack import Bounds
from tfcluster.daemon.agent.code.workspace import Workspaces
from tfcluster.model import Attempt

log = logging.getLogger("tfcluster.agent")


class TaskCode:
    def __init__(self, state_dir: Path, max_bytes: int, fetch: Fetch, agent_is_root: bool,
                 in_flight: Callable[[str], Transfer | None] = lambda hex_digest: None, bounds: Bounds = Bounds()):
        """`in_flight` tells how far a fetch under way has got (the Fetcher's transfers), for peers to relay;
        `bounds`, what one archive may unpack to here."""
        self.workspaces = Workspaces(layout.overlay_probe_dir(state_dir), agent_is_root)
        self.cache = CodeCache(layout.code_cache_dir(state_dir), max_bytes, fetch, bounds=bounds)
        self.serving = CodeServing(self._archive, in_flight)
        self.jobs_dir = layout.jobs_dir(state_dir)

    def prepare(self, attempt: Attempt, attempt_dir: Path, sha256: str, sources: tuple[str, ...], uid: int,
                gid: int) -> tuple[Path, Path]:
        """(the task's working directory, its read-only view of the cached tree), fetching the archive if this
        node lacks it. Raises CodeError with why the task cannot start."""
        hex_digest = hex_of(sha256)
        self.serving.used_by(attempt.job_id, hex_digest)  # from now: the job's other nodes may ask while it comes
        tree = self.cache.acquire(hex_digest, attempt.job_id, sources, pin=str(attempt_dir))
        try:
            return self.workspaces.make(attempt_dir, tree, hex_digest, uid, gid)
        except OSError as e:
            self.release(attempt_dir)
            raise CodeError(f"cannot make the task's working directory over its code: {e}") from None

    def _archive(self, hex_digest: str) -> Path | None:
        """The archive's file, whole and checked: the cache's entry, or one just fetched and not yet unpacked
        (only a checked archive gets that name)."""
        path = self.cache.archive(hex_digest)
        return path if self.cache.holds(hex_digest) or path.is_file() else None

    def working_dir(self, attempt: Attempt, attempt_dir: Path, order: Launch, uid: int, gid: int,
                    env: dict[str, str], stopped: Callable[[], bool]) -> str:
        """prepare() for a launch: sets TFCLUSTER_CODE_DIR in the task's env and returns its working directory.
        An attempt stopped while its code was fetched ended before it pinned its entry: let go of it here."""
        cwd, tree = self.prepare(attempt, attempt_dir, order.code_sha256, order.code_sources, uid, gid)
        if stopped():
            self.release(attempt_dir)
            raise CodeError("stopped before it started")
        env[layout.CODE_DIR] = str(tree)  # the job's own read-only view of the cached tree
        return str(cwd)

    def release(self, attempt_dir: Path) -> None:
        """The attempt ended: its working directory is unmounted, its cache entry may go when room is needed."""
        self.workspaces.release(attempt_dir)
        self.cache.release(str(attempt_dir))

    def recover(self, live: dict[Path, str]) -> None:
        """After a restart: pins the entries of the attempts still running (attempt dir -> job id), unmounts the
        working directories of every other attempt."""
        for attempt_dir, job_id in live.items():
            hex_digest = Workspaces.code_of(attempt_dir)
            if hex_digest and self.cache.pin(hex_digest, str(attempt_dir)):
                self.serving.used_by(job_id, hex_digest)
        unmounted = Workspaces.unmount_stale(self.jobs_dir, set(live))
        if unmounted:
            log.info("code: unmounted the working directories of %d attempts that ended", unmounted)
        self.cache.evict()
