"""What waits to go out of the coordinator: commands for a node's stream, and log chunks for a client."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

import grpc

from tfcluster.commands import LogData

OUTBOX_LIMIT = 10_000  # commands kept for a node whose stream is away (reconcile resends what is dropped)
TOLD_PER_TURN = 100  # nodes given a command meant for all of them in one turn of the event loop (tell_all)
TOLD_EVERY_SECONDS = 0.01  # ... one slice this often: 5,000 nodes are told in half a second
LOG_CHUNKS_BUFFERED = 256  # 64 KiB each: a log client this far behind the agent is told so


class StreamEnded(Exception):
    """The coordinator ends a node's stream: the code and the reason go to the agent as the stream's status."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


class Outbox:
    """Commands waiting for a node's stream. It outlives streams; a new stream takes it over."""

    def __init__(self) -> None:
        self.items: collections.deque = collections.deque(maxlen=OUTBOX_LIMIT)
        self.ready = asyncio.Event()
        self.generation = 0
        self.ended: StreamEnded | None = None  # why the node's stream must end now (it was removed), once it must

    def put(self, message) -> None:
        self.items.append(message)
        self.ready.set()

    def take_over(self) -> int:
        self.generation += 1
        self.ready.set()  # wakes the old stream's sender, which sees it was replaced
        return self.generation

    def end(self, reason: StreamEnded) -> None:
        self.ended = reason
        self.ready.set()

    def wake(self) -> None:
        self.ready.set()

    async def get(self, generation: int, stopping: Callable[[], bool] = lambda: False):
        """The next message for the stream of this generation; None once it is stopping. Raises StreamEnded when
        the stream must end: the node was removed, or a newer stream of it took over (the agent hears so, rather
        than keeping a call that nobody answers)."""
        while True:
            if self.ended:
                raise self.ended
            if self.generation != generation:
                raise StreamEnded(grpc.StatusCode.ABORTED, "a newer connection of this node took over its stream")
            if stopping():
                return None
            if self.items:
                return self.items.popleft()
            self.ready.clear()
            await self.ready.wait()


async def tell_all(send: Callable[[list], None], nodes: list[str], command: Callable[[str], object],
                   connected: Callable[[str], bool]) -> None:
    """Sends each node that is still connected its command, TOLD_PER_TURN nodes every TOLD_EVERY_SECONDS. Each
    command wakes its stream's sender: 5,000 woken at once made one turn of the loop last about half a second, which
    every other call waited out (bench/storm.py, the pace told after a cold start); 250 a turn, with no pause
    between slices, still kept the loop busy for 0.69 s on end, mostly in the senders."""
    for start in range(0, len(nodes), TOLD_PER_TURN):
        send([command(node) for node in nodes[start:start + TOLD_PER_TURN] if connected(node)])
        await asyncio.sleep(TOLD_EVERY_SECONDS)


class LogWaiter:
    def __init__(self, node: str):
        self.node = node
        self.chunks: asyncio.Queue[LogData] = asyncio.Queue(maxsize=LOG_CHUNKS_BUFFERED + 1)

    def put(self, data: LogData) -> bool:
        """Queues a chunk for the client; False (and an error for it instead) when it has fallen too far behind."""
        if self.chunks.qsize() >= LOG_CHUNKS_BUFFERED:
            self.fail(data.request_id, "the log arrives faster than the client reads it; try --tail")
            return False
        self.chunks.put_nowait(data)
        return True

    def fail(self, request_id: int, error: str) -> None:
        while self.chunks.full():
            self.chunks.get_nowait()
        self.chunks.put_nowait(LogData(request_id, eof=True, error=error))
