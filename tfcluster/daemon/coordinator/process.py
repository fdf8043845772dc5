"""Running a coordinator: as the `tfcluster coordinator` process, or on a thread of its own (the demo)."""

from __future__ import annotations

import asyncio
import gc
import resource
import signal
import threading
import time

from tfcluster.daemon.coordinator.service import CoordinatorServer

FREEZE_EVERY_SECONDS = 10.0
THAW_EVERY_SECONDS = 3600.0


def raise_open_file_limit() -> None:
    """Every agent holds a connection: thousands of them need more descriptors than the usual soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def keep_long_lived_objects_out_of_the_collector() -> None:
    """Python's cyclic collector rescans every object it tracks on each full collection: with thousands of
    agents (their nodes, streams and calls) one takes half a second, stalling the loop. Objects that have
    lived a while are frozen (never scanned again); once an hour they are thawed and collected once, so
    cyclic garbage that was frozen is reclaimed after all."""
    thawed = time.monotonic()
    while True:
        await asyncio.sleep(FREEZE_EVERY_SECONDS)
        if time.monotonic() - thawed > THAW_EVERY_SECONDS:
            gc.unfreeze()
            gc.collect()
            thawed = time.monotonic()
        gc.freeze()


def serve(server: CoordinatorServer) -> None:
    """Serves until SIGTERM or SIGINT, then shuts down (the last changes are written)."""
    async def main() -> None:
        await server.start()
        collector = asyncio.create_task(keep_long_lived_objects_out_of_the_collector())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        collector.cancel()
        await server.stop()

    raise_open_file_limit()
    asyncio.run(main())


class BackgroundCoordinator:
    """A coordinator on a thread of its own with its own event loop, for a process that runs other things too
    (the demo runs three agents beside it)."""

    def __init__(self, server: CoordinatorServer):
        self.server = server
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="coordinator", daemon=True)

    def start(self) -> "BackgroundCoordinator":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(timeout=30)
        return self

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def join_address(self) -> str:
        return self.server.join_address

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
