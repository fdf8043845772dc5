"""Passing on an archive while it is still being fetched, so that a job's first launch spreads its code as a tree
(the coordinator's launch.code_sources) instead of every node asking the coordinator at once.

A node's fetch (codefetch.Fetcher) writes the archive to a partial file and says here how far it has got; a
peer asking for that archive meanwhile gets each chunk as soon as its bytes are on disk, and its stream ends
with the last byte. Nothing is trusted on the way: the asking node checks the whole archive's SHA-256, as it
does with any source, and goes to its next source (the coordinator last) if this node's own fetch fails or
stalls.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from tfcluster.api.v1 import types_pb2
from tfcluster.codechunks import CHUNK_BYTES

POLL_SECONDS = 0.02  # how soon a waiting relay sees new bytes; chunks are 1 MiB, so this costs little


class Transfer:
    """An archive this node is fetching into `path`: its size once the first chunk told it, the bytes already
    written there, and whether the fetch failed (the file is then gone or useless)."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self.size: int | None = None
        self.have = path.stat().st_size if path.exists() else 0  # left by a source cut off earlier
        self.failed = False

    def advanced(self, size: int, have: int) -> None:
        """write_chunks' progress: `have` bytes of `size` are written and flushed."""
        with self.lock:
            self.size, self.have = size, have

    def fail(self) -> None:
        with self.lock:
            self.failed = True

    def progress(self) -> tuple[int | None, int, bool]:
        with self.lock:
            return self.size, self.have, self.failed


class Transfers:
    """The archives this node is fetching, by hex digest."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_digest: dict[str, Transfer] = {}

    def start(self, hex_digest: str, path: Path) -> Transfer:
        transfer = Transfer(path)
        with self.lock:
            self.by_digest[hex_digest] = transfer
        return transfer

    def end(self, hex_digest: str, transfer: Transfer) -> None:
        with self.lock:
            if self.by_digest.get(hex_digest) is transfer:
                del self.by_digest[hex_digest]

    def get(self, hex_digest: str) -> Transfer | None:
        with self.lock:
            return self.by_digest.get(hex_digest)


async def relay(context, file, transfer: Transfer, hex_digest: str, offset: int,
                executor=None) -> AsyncIterator[types_pb2.CodeChunk]:
    """The archive's chunks from `offset`, read from `file` (the partial file, opened before the fetch could
    rename it) as the fetch writes them. Aborts UNAVAILABLE when the fetch fails."""
    loop = asyncio.get_running_loop()
    sent = False
    with file:
        while True:
            size, have, failed = transfer.progress()
            if failed:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "this node's own fetch of the archive failed")
            if size is not None and offset >= size:
                if offset > size:
                    await context.abort(grpc.StatusCode.OUT_OF_RANGE,
                                        f"offset {offset} is past the end of sha256:{hex_digest} ({size} bytes)")
                if not sent:  # as read_chunks: an ask from the very end gets one empty chunk saying the size
                    yield types_pb2.CodeChunk(sha256=f"sha256:{hex_digest}", size=size, offset=offset)
                return
            if offset < have:
                data = await loop.run_in_executor(executor, os.pread, file.fileno(),
                                                  min(CHUNK_BYTES, have - offset), offset)
                if not data:  # written and flushed, yet not there: the file was replaced under us
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "the partial archive changed while read")
                yield types_pb2.CodeChunk(sha256=f"sha256:{hex_digest}", size=size, offset=offset, data=data)
                offset += len(data)
                sent = True
                continue
            await asyncio.sleep(POLL_SECONDS)
