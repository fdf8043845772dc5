"""A command for every node (the heartbeat pace) goes out a slice of nodes at a time (rpc/outbox.py: tell_all): the
event loop turns between slices, so a status call waits for one slice's senders, not for thousands of them; every
node still connected gets its command once, and a node gone meanwhile gets none."""

import asyncio

from tfcluster.daemon.coordinator.rpc import outbox
from tfcluster.daemon.coordinator.rpc.outbox import tell_all


def test_every_connected_node_is_told_once_and_other_calls_run_between_slices(monkeypatch):
    monkeypatch.setattr(outbox, "TOLD_PER_TURN", 100)
    nodes = [f"n{i}" for i in range(1000)]
    connected = set(nodes)
    sent: list[str] = []
    seen_by_other_calls: list[int] = []

    async def other_call() -> None:  # another call served meanwhile: it gets a turn while the slices go out
        while len(sent) < 900:
            seen_by_other_calls.append(len(sent))
            await asyncio.sleep(0)

    async def run() -> None:
        other = asyncio.create_task(other_call())
        await asyncio.sleep(0)
        connected.discard("n500")  # its stream ended after the pace was decided
        await tell_all(lambda commands: sent.extend(commands), nodes, lambda node: node, connected.__contains__)
        await other

    asyncio.run(run())
    assert sorted(sent) == sorted(set(nodes) - {"n500"})
    assert len(set(seen_by_other_calls)) >= 9, f"another call ran only while {sorted(set(seen_by_other_calls))} " \
                                               "commands were sent: the slices went out in one turn"
    assert max(b - a for a, b in zip(sorted(set(seen_by_other_calls)), sorted(set(seen_by_other_calls))[1:])) <= 100
