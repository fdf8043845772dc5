"""The coordinator keeps its long-lived objects out of Python's cyclic collector (process.py): what outlives a full
collection is frozen, so the next full collection does not rescan thousands of agents' objects while the loop
waits, and cyclic garbage is still reclaimed: at once when it was never frozen, within the hourly thaw when it
was."""

import asyncio
import gc
import weakref

import pytest

from tfcluster.daemon.coordinator import process
from tfcluster.daemon.coordinator.process import freeze_survivors, keep_long_lived_objects_out_of_the_collector


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector can reclaim it


@pytest.fixture
def thawed():
    gc.unfreeze()
    yield
    gc.unfreeze()  # what this test froze goes back to the collector of the test process


def test_what_outlives_a_full_collection_is_frozen_and_garbage_is_not(thawed):
    gc.callbacks.append(freeze_survivors)
    try:
        kept = [Node() for _ in range(1000)]
        garbage = Node()
        gone = weakref.ref(garbage)
        del garbage
        gc.collect()
        assert gone() is None, "a cycle that was garbage before the full collection was frozen instead"
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)
        young = [Node() for _ in range(100)]
        gc.collect(0)  # a young collection freezes nothing: its survivors may still be short-lived
        assert gc.get_freeze_count() == frozen
        later = Node()
        later_gone = weakref.ref(later)
        del later
        gc.collect()
        assert later_gone() is None, "garbage made after a freeze must still be collected"
        assert gc.get_freeze_count() >= frozen + len(young)
    finally:
        gc.callbacks.remove(freeze_survivors)


def test_frozen_objects_that_became_garbage_are_reclaimed_at_the_thaw(thawed, monkeypatch):
    monkeypatch.setattr(process, "THAW_EVERY_SECONDS", 0.05)

    async def run() -> weakref.ref:
        keeper = asyncio.create_task(keep_long_lived_objects_out_of_the_collector())
        await asyncio.sleep(0)  # the task has installed its callback
        node = Node()
        gone = weakref.ref(node)
        gc.collect()  # node survives: frozen
        assert gc.get_freeze_count() > 0
        del node  # now garbage, but frozen: no collection sees it
        gc.collect()
        assert gone() is not None
        await asyncio.sleep(0.2)  # the thaw came: unfrozen, collected
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
        return gone

    assert asyncio.run(run())() is None
    assert freeze_survivors not in gc.callbacks, "a cancelled keeper must take its callback away"


def test_the_young_generation_is_collected_less_often_while_the_keeper_runs(thawed):
    before = gc.get_threshold()

    async def run() -> tuple[tuple[int, ...], int]:
        keeper = asyncio.create_task(keep_long_lived_objects_out_of_the_collector())
        await asyncio.sleep(0)
        collections = gc.get_stats()[0]["collections"]
        kept = [Node() for _ in range(5000)]  # 5,000 new containers: seven young collections at the default
        young_collections = gc.get_stats()[0]["collections"] - collections
        during = gc.get_threshold()
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
        del kept
        return during, young_collections

    during, young_collections = asyncio.run(run())
    assert during == (process.YOUNG_OBJECTS_PER_COLLECTION, *before[1:])
    assert young_collections == 0, "the young generation was collected while fewer objects than its threshold"
    assert gc.get_threshold() == before, "a cancelled keeper must give the collector its thresholds back"
