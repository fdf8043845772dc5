"""The cluster from its store at start, and then what changes written before the commands it decided are sent.

The writer task collects every change since the last write (records.py, from the cluster's change log) into one
batch, writes it on a thread of its own, and only then sends the commands the changes produced: agents never
act on a decision a crash could forget. Changes that arrive during a write go into the next batch, so under
load one transaction carries many events. A client that needs durability (a submission) waits for the batch
that holds its change. Once the store refuses a write because another coordinator wrote to it (store/api.py's
Conflict), this one writes and sends nothing more: it is told, and stops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tfcluster.commands import Command
from tfcluster.daemon.coordinator.core.access.trust import Trust
from tfcluster.daemon.coordinator.core.cluster import Cluster
from tfcluster.daemon.coordinator.store import migrate
from tfcluster.daemon.coordinator.store.api import Conflict, Store
from tfcluster.daemon.coordinator.store.documents import from_documents
from tfcluster.daemon.coordinator.store.records import Writer
from tfcluster.states import TaskState

log = logging.getLogger("tfcluster.coordinator")

WRITE_RETRY_SECONDS = 1.0
# Group commit: a write that follows the last one closely waits GATHER_SECONDS for more changes to join its batch.
# Every batch costs the same besides its changes (the scheduling pass, a transaction, the hand-over to the store's
# thread and back): under a stream of tiny jobs the wait made a third fewer batches and cut the CPU of each job by
# 8% (bench/cli.py's throughput, alternated runs). A change on a quiet coordinator waits for nothing.
BUSY_SECONDS = 0.02
GATHER_SECONDS = 0.002
PENDING_LIMIT = 100_000  # commands waiting for a write that succeeds


class Persistence:
    def __init__(self, store: Store, cluster: Cluster, send: Callable[[list[Command]], None]):
        self.store, self.cluster, self.send = store, cluster, send
        self.trust = Trust()
        self.records = Writer()  # the change log as store writes
        self.fenced: Conflict | None = None  # another coordinator wrote to the store: this one acts no more
        self.on_fenced: Callable[[], None] = lambda: None
        self.pending: list[Command] = []
        # What the batch about to be written decides besides (the coordinator's scheduling pass, run once for all
        # the events in the batch): its changes go into that batch and its commands out after it.
        self.before_write: Callable[[], list[Command]] = list
        self.next_write: asyncio.Future | None = None
        self.wake = asyncio.Event()
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self.closing = False

    def load(self, now: float, reconnect_grace: float) -> None:
        """Fills the cluster, and the trust, with what the store holds (brought to this release's shape first)."""
        documents = migrate.upgrade(self.store)
        state = from_documents(documents)
        for job in state.jobs:
            job.seen.last_progress = now  # the hang watchdog counts from now: progress was not seen meanwhile
            for task in job.tasks:  # saved by a release that kept no usage: its GPUs count from now on
                if task.state == TaskState.RUNNING and not task.running_since:
                    task.running_since = now
            self.cluster.add_job(job)
        for node in state.nodes:
            self.cluster.add_node(node)
        self.cluster.nodes.await_return(now, reconnect_grace)
        self.cluster.usage.load(state.usage)
        for sweep in state.sweeps:
            self.cluster.add_sweep(sweep)
        self.cluster.jobs.continue_numbering(state.next_job_number)
        self.cluster.jobs.cluster_tag = migrate.base36(state.cluster_tag)
        self.trust = state.trust
        self.trust.log_to(self.cluster.changes)
        self.records.loaded(documents, self.cluster.changes)
        self.cluster.jobs.assign_missing_uids()  # after `loaded`: the store writes the UIDs given now
        if state.jobs or state.nodes:
            log.info("loaded %d jobs and %d nodes from %s", len(state.jobs), len(state.nodes), self.store.location)

    def apply(self, commands: list[Command] = ()) -> asyncio.Future:
        """Something changed; commands go out once it is stored. The future is done once it is stored (or failed,
        at once, once another coordinator wrote to the store)."""
        if self.next_write is None:
            self.next_write = asyncio.get_running_loop().create_future()
            # Nobody awaits the ticker's changes: a failed write must not have asyncio log "exception never
            # retrieved" for each of them. A caller that awaits the future still gets the exception.
            self.next_write.add_done_callback(_retrieved)
        if self.fenced:
            refused, self.next_write = self.next_write, None
            refused.set_exception(OSError(f"cannot store the change: {self.fenced}"))
            return refused
        self.pending.extend(commands)
        self.wake.set()
        return self.next_write

    async def run(self) -> None:
        last_write = float("-inf")
        while not self.closing and not self.fenced:
            await self.wake.wait()
            if time.monotonic() - last_write < BUSY_SECONDS:
                await asyncio.sleep(GATHER_SECONDS)  # what comes meanwhile goes into this batch
            self.wake.clear()
            last_write = time.monotonic()
            try:
                written = await self.write()
            except Exception:  # a bug here must not stop every later write
                log.exception("writing the state failed")
                written = False
            if not written and not self.closing:
                await asyncio.sleep(WRITE_RETRY_SECONDS)
                self.wake.set()

    async def close(self, writer: asyncio.Task | None) -> None:
        """Stores what changed last, then closes the store. The writer task finishes the write under way first
        (cancelled, it would leave that batch's revisions unknown)."""
        self.closing = True
        self.wake.set()
        if writer is not None:
            await asyncio.gather(writer, return_exceptions=True)
        await self.write()
        self.thread.shutdown(wait=True)
        self.store.close()

    async def write(self) -> bool:
        """Writes what changed, then sends the commands those changes decided. When the write fails (a full
        disk) nothing is sent: the commands wait for a write that succeeds, so no agent acts on a decision
        a restart could forget; a client waiting for the write is told it failed."""
        if not self.closing and not self.fenced:
            self._decide_before_write()
        done, self.next_write = self.next_write, None
        commands, self.pending = self.pending, []
        error = self.fenced or await self._store(len(commands))
        if error is None:
            self.send(commands)
        elif not self.fenced:
            self.pending[:0] = commands[-PENDING_LIMIT:]  # reconcile resends what is dropped here
            del self.pending[PENDING_LIMIT:]
        if done is not None and not done.done():
            done.set_exception(OSError(f"cannot store the change: {error}")) if error else done.set_result(None)
        return error is None

    def _decide_before_write(self) -> None:
        try:
            self.pending.extend(self.before_write())
        except Exception:  # a bug there must not keep what the events changed from being written
            log.exception("deciding what the batch changes besides failed")

    async def _store(self, commands: int) -> Exception | None:
        """Writes the batch of what changed; the error when it could not be written."""
        batch = self.records.collect(self.cluster.changes)
        if not batch:
            return None
        started, error = time.monotonic(), None
        try:
            revisions = await asyncio.get_running_loop().run_in_executor(self.thread, self.store.write,
                                                                         list(batch.writes.values()))
            self.records.written(batch, revisions)
        except Conflict as e:  # only the coordinator that wrote last may act on the cluster
            error = self.fenced = e
            log.critical("the store %s was written by another coordinator: this one stops acting, without "
                         "sending %d commands (%s)", self.store.location, commands, e)
            self.on_fenced()
        except Exception as e:  # a full disk must not take the coordinator down; the next batch retries
            self.records.failed(batch, self.cluster.changes)
            error = e
            log.error("cannot write the state to %s: %s", self.store.location, e)
        self.cluster.observer.stored(time.monotonic() - started, ok=error is None)
        return error


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()
