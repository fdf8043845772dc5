"""A job's code archive on the wire: CodeChunk messages read from a file, and written to one with its SHA-256
checked. The coordinator serves its stored archives this way (AgentService.FetchCode), and an agent serves
the archives in its cache to other agents (AgentPeerService.GetCode).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import grpc

from tfcluster.api.v1 import types_pb2

CHUNK_BYTES = 1 << 20
NAME_RE = re.compile(r"(?:sha256:)?([0-9a-f]{64})")


class CodeError(Exception):
    """An archive that cannot be had, or one whose bytes are not what its name says: why, in one line."""


def hex_of(sha256: str) -> str:
    """The bare hex digest of an archive's name ("sha256:<hex>" or the hex alone). Raises CodeError."""
    match = NAME_RE.fullmatch(sha256)
    if match is None:
        raise CodeError(f"not the name of a code archive: {sha256[:80]!r} (sha256:<64 hex digits>)")
    return match.group(1)


def read_chunks(path: Path, hex_digest: str, offset: int = 0) -> Iterator[types_pb2.CodeChunk]:
    """The archive at path from byte `offset` on, in chunks that each say where they start."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if offset > size:
            raise CodeError(f"offset {offset} is past the end of sha256:{hex_digest} ({size} bytes)")
        f.seek(offset)
        while True:
            data = f.read(CHUNK_BYTES)
            yield types_pb2.CodeChunk(sha256=f"sha256:{hex_digest}", size=size, offset=offset, data=data)
            offset += len(data)
            if offset >= size:
                return


def write_chunks(chunks: Iterable[types_pb2.CodeChunk], path: Path, hex_digest: str,
                 progress: Callable[[int, int], None] | None = None) -> int:
    """Appends the chunks to the partial file at path (a source cut off earlier left its first bytes), and
    checks the whole once the last byte is in. Returns its size; raises CodeError when the bytes are wrong.
    progress(size, bytes written), if given, follows each chunk once its bytes can be read from the file."""
    digest = hashlib.sha256()
    with open(path, "ab+") as f:
        f.seek(0)
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):  # what an earlier source sent, hashed again
            digest.update(block)
        have, size = f.tell(), None
        for chunk in chunks:
            if chunk.offset != have:
                raise CodeError(f"a chunk starts at byte {chunk.offset}, expected {have}")
            if size is not None and chunk.size != size or chunk.size < have + len(chunk.data):
                raise CodeError("chunks disagree on the archive's size")
            size = chunk.size
            f.write(chunk.data)
            digest.update(chunk.data)
            have += len(chunk.data)
            if progress is not None:
                f.flush()
                progress(size, have)
            if have == size:
                break
        if size is None or have != size:
            raise CodeError(f"the stream ended after {have} of {size if size is not None else '?'} bytes")
        f.flush()
        os.fsync(f.fileno())
    if digest.hexdigest() != hex_digest:
        path.unlink(missing_ok=True)  # nothing of it can be trusted: the next source starts over
        raise CodeError(f"its bytes hash to sha256:{digest.hexdigest()[:12]}..., not the archive's name")
    return have


async def stream_archive(context, path_for: Callable[[], Path], offset: int, executor=None):
    """A GetCode / FetchCode answer: the archive's chunks from `offset`, read off the event loop. `path_for`
    raises CodeError to refuse (NOT_FOUND: an archive a caller may not have is answered as one not there)."""
    try:
        path = path_for()
    except CodeError as e:
        await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
    loop = asyncio.get_running_loop()
    chunks = read_chunks(path, path.name.split(".", 1)[0], offset)
    done = object()
    try:
        while True:
            chunk = await loop.run_in_executor(executor, next, chunks, done)
            if chunk is done:
                return
            yield chunk
    except CodeError as e:
        await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(e))
    except OSError as e:
        await context.abort(grpc.StatusCode.NOT_FOUND, f"cannot read the archive: {e.strerror or e}")
    finally:
        chunks.close()
