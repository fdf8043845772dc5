"""A write the store refuses fails the futures of the changes it held, and a future nobody awaits (the ticker's)
is not reported by asyncio as an exception never retrieved: after a step-down every tick is refused, and the log
would fill with tracebacks that say nothing."""

from __future__ import annotations

import asyncio
import gc

import pytest
from coresim import info

from tfcluster.daemon.coordinator.core.cluster import Cluster
from tfcluster.daemon.coordinator.store.api import MemoryStore, StoreUnavailable
from tfcluster.daemon.coordinator.store.persistence import Persistence


class RefusingStore(MemoryStore):
    """The store of a coordinator whose leader lease ran out on its own clock: every write is refused."""

    def write(self, writes):
        raise StoreUnavailable("etcd did not renew this coordinator's leader lease in time")


def test_refused_writes_fail_their_futures_and_leave_nothing_unretrieved():
    unretrieved: list[dict] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: unretrieved.append(context))
        cluster = Cluster()
        persistence = Persistence(RefusingStore(), cluster, lambda commands: None)
        try:
            cluster.register(info("a"), [], "session-1", 0.0)  # a change for the store to write
            awaited = persistence.apply()
            assert await persistence.write() is False
            with pytest.raises(OSError, match="did not renew"):
                await awaited
            cluster.register(info("b"), [], "session-2", 0.0)
            persistence.apply()  # the ticker's: awaited by nobody
            assert await persistence.write() is False
            del awaited
            gc.collect()
            await asyncio.sleep(0)
        finally:
            persistence.thread.shutdown()

    asyncio.run(scenario())
    assert [context.get("message") for context in unretrieved] == []
