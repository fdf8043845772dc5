"""The coordinator's writer on its event loop, with a store that can fail: commands go out only after their
change is stored; a failed write holds them back, tells a waiting client, and the next write stores it all."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from coresim import info, make_spec

from tfcluster.daemon.coordinator.core.cluster import Cluster
from tfcluster.daemon.coordinator.rpc import coordinator as S
from tfcluster.daemon.coordinator.store import persistence
from tfcluster.daemon.coordinator.store.api import MemoryStore


class FlakyStore(MemoryStore):
    """A store whose disk can be full."""

    def __init__(self):
        super().__init__()
        self.full = False
        self.batches = []

    def write(self, writes):
        if self.full:
            raise OSError(28, "No space left on device")
        self.batches.append(writes)
        return super().write(writes)


async def settle():
    for _ in range(20):
        await asyncio.sleep(0.01)


def test_commands_wait_for_their_change_to_be_stored(monkeypatch):
    monkeypatch.setattr(persistence, "WRITE_RETRY_SECONDS", 0.05)

    async def run():
        store = FlakyStore()
        c = S.Coordinator(store, Cluster(), clock=lambda: 100.0)
        c.load(reconnect_grace=0)
        c.start()
        await c.apply(c.cluster.register(info("n1"), [], "s1", 100.0))
        store.full = True
        job, commands = c.cluster.submit(make_spec(strategy="mirrored", worker=1), 100.0)
        with pytest.raises(OSError, match="cannot store the change"):
            await c.apply(commands)
        assert not c.outboxes["n1"].items, "nothing sent while nothing is stored"
        store.full = False
        await settle()
        assert len(c.outboxes["n1"].items) == 1, "sent once the next write succeeded"
        assert any(("job", job.id) in [(w.kind, w.key) for w in b] for b in store.batches)
        await c.close()

    asyncio.run(run())


def test_a_coordinator_that_another_overtook_stops_acting():
    async def run():
        name = uuid.uuid4().hex
        first = S.Coordinator(MemoryStore(name), Cluster(), clock=lambda: 100.0)
        first.load(reconnect_grace=0)
        first.start()
        await first.apply(first.cluster.register(info("n1"), [], "s1", 100.0))
        second = S.Coordinator(MemoryStore(name), Cluster(), clock=lambda: 100.0)
        second.load(reconnect_grace=0)
        second.start()
        await second.apply(second.cluster.register(info("n1", 2), [], "s2", 100.0))  # the node's document changes
        told = []
        first.persistence.on_fenced = lambda: told.append(True)
        first.cluster.register(info("n1", 3), [], "s3", 100.0)
        job, commands = first.cluster.submit(make_spec(strategy="mirrored", worker=1), 100.0)
        with pytest.raises(OSError, match="is at revision"):
            await first.apply(commands)
        assert first.persistence.fenced is not None and told and not first.outboxes["n1"].items, "nothing sent"
        with pytest.raises(OSError):
            await first.apply()
        await first.close()
        assert second.cluster.nodes["n1"].info == info("n1", 2)
        await second.close()
        back = S.Coordinator(MemoryStore(name), Cluster())
        back.load(reconnect_grace=0)
        assert back.cluster.nodes["n1"].info == info("n1", 2) and job.id not in back.cluster.jobs, \
            "the overtaken coordinator wrote nothing"

    asyncio.run(run())
