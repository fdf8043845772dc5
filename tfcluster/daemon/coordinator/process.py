"""Running a coordinator: as the `tfcluster coordinator` process, or on a thread of its own (the demo)."""

from __future__ import annotations

import asyncio
import gc
import resource
import signal
import threading

from tfcluster.daemon.coordinator.core import status
from tfcluster.daemon.coordinator.grpc_server import CoordinatorServer
from tfcluster.daemon.notify import Notifier

THAW_EVERY_SECONDS = 3600.0
# Python collects its youngest generation after every 700 net new container objects. Nearly all a call makes
# (its messages, tasks and futures) dies by its reference count before the turn of the loop ends; what stays
# (nodes, streams, jobs) would be scanned again and again for nothing. Once per 50,000 keeps the young
# generation a few megabytes at most and took the collector off the profile of a 5,000-agent failover.
YOUNG_OBJECTS_PER_COLLECTION = 50_000
STATUS_EVERY_SECONDS = 5.0  # how fresh the line in `systemctl status` is, watchdog or not


def raise_open_file_limit() -> None:
    """Every agent holds a connection: thousands of them need more descriptors than the usual soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def freeze_survivors(phase: str, info: dict) -> None:
    """A gc callback: what outlived a full collection is frozen at once. Python's cyclic collector rescans
    every object it tracks on each full collection: with thousands of agents (their nodes, streams and calls)
    one took 64-277 ms every second or two of a registration storm, stalling the loop that serves every call.
    Frozen objects are never scanned again, so a full collection scans only what is new since the last one.
    Frozen right after a full collection, no garbage is frozen with them."""
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


async def keep_long_lived_objects_out_of_the_collector() -> None:
    """Collects the young generation less often (YOUNG_OBJECTS_PER_COLLECTION) and freezes the survivors of
    every full collection (freeze_survivors); once an hour thaws them and collects once, so that frozen objects
    that have since become cyclic garbage are reclaimed after all."""
    thresholds = gc.get_threshold()
    gc.set_threshold(YOUNG_OBJECTS_PER_COLLECTION, *thresholds[1:])
    gc.callbacks.append(freeze_survivors)
    try:
        while True:
            await asyncio.sleep(THAW_EVERY_SECONDS)
            gc.unfreeze()
            gc.collect()  # a full collection: freeze_survivors freezes what is still alive
    finally:
        gc.callbacks.remove(freeze_survivors)
        gc.set_threshold(*thresholds)


async def report_to_systemd(server: CoordinatorServer, notifier: Notifier) -> None:
    """Feeds systemd's watchdog (when the unit has WatchdogSec=) and refreshes the status line, from a
    coroutine on the event loop that owns the cluster: when anything blocks that loop, no agent is served,
    the beats stop with it, and systemd restarts the coordinator."""
    every = min(notifier.beat_interval or STATUS_EVERY_SECONDS, STATUS_EVERY_SECONDS)
    while True:
        await asyncio.sleep(every)
        line = status.one_line(server.coordinator.cluster)
        if notifier.watchdog_seconds:
            notifier.watchdog(line)
        else:
            notifier.status(line)


def tell_systemd_ready(server: CoordinatorServer, notifier: Notifier) -> asyncio.Task | None:
    """READY=1 (the server serves), then the reporting task; none when not run by systemd. On the loop."""
    if not notifier.enabled:
        return None
    notifier.ready(status.one_line(server.coordinator.cluster))
    return asyncio.create_task(report_to_systemd(server, notifier))


def serve(server: CoordinatorServer, notifier: Notifier | None = None) -> None:
    """Serves until SIGTERM or SIGINT, then shuts down (the last changes are written); SIGHUP reloads the policy
    file. Tells systemd when it
    is ready, how it is doing and when it stops (see notify.py). Raises the store's Conflict when another
    coordinator wrote to the store: this one stopped acting at once, and must not run on."""
    notifier = notifier or Notifier.from_environment()

    async def main() -> None:
        await server.start()
        background = [asyncio.create_task(keep_long_lived_objects_out_of_the_collector()),
                      tell_systemd_ready(server, notifier)]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, server.reload_policy)  # on the loop: the model is never shared
        server.coordinator.persistence.on_fenced = stop.set
        await stop.wait()
        notifier.stopping("stopping: writing the last changes")
        for task in background:
            if task is not None:
                task.cancel()
        await server.stop()

    raise_open_file_limit()
    asyncio.run(main())
    if server.coordinator.persistence.fenced is not None:
        raise server.coordinator.persistence.fenced


class BackgroundCoordinator:
    """A coordinator on a thread of its own with its own event loop, for a process that runs other things too
    (the demo runs three agents beside it)."""

    def __init__(self, server: CoordinatorServer, notifier: Notifier | None = None):
        self.server = server
        self.notifier = notifier or Notifier()  # none: systemd is not told
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="coordinator", daemon=True)
        self.reporting: asyncio.Task | None = None

    def start(self) -> "BackgroundCoordinator":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(timeout=30)
        self.reporting = asyncio.run_coroutine_threadsafe(self._tell_systemd_ready(), self.loop).result(timeout=30)
        return self

    async def _tell_systemd_ready(self) -> asyncio.Task | None:
        return tell_systemd_ready(self.server, self.notifier)

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def join_address(self) -> str:
        return self.server.join_address

    def stop(self) -> None:
        self.notifier.stopping("stopping")
        if self.reporting is not None:
            self.loop.call_soon_threadsafe(self.reporting.cancel)
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
