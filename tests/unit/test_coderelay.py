"""A node passes on a job's code while it still fetches it: a peer's stream follows the partial file chunk by
chunk and ends with its last byte; a failed fetch ends the peers' streams too (they go to their next source);
only a job whose launch named the archive here is served, only to the nodes the coordinator sent here for it,
and a peer that asks before that launch (or that word) came waits a moment for it; a node not sent here hears
what it would of code not here. A source that stalls is left for the next one."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time

import grpc
import pytest

from tfcluster.api.v1 import agent_pb2
from tfcluster.codechunks import CHUNK_BYTES, read_chunks, write_chunks
from tfcluster.daemon.agent.code.fetch import CodeServing, _Watchdog
from tfcluster.daemon.agent.code.relay import Transfers


class Aborted(Exception):
    def __init__(self, code, details):
        super().__init__(details)
        self.code = code


class Context:
    async def abort(self, code, details):
        raise Aborted(code, details)


@pytest.fixture
def origin(tmp_path):
    data = os.urandom(5 * CHUNK_BYTES + 123)
    digest = hashlib.sha256(data).hexdigest()
    path = tmp_path / f"{digest}.tar.gz"
    path.write_bytes(data)
    return digest, path


def fetching(tmp_path, digest: str, stop_after: int | None = None) -> tuple[CodeServing, threading.Thread]:
    """A node serving the job's code while a thread (not started) fetches it from a slow source."""
    transfers = Transfers()
    part = tmp_path / f"{digest}.part"
    transfer = transfers.start(digest, part)
    serving = CodeServing(lambda hex_digest: None, transfers.get, wait_seconds=2.0)
    serving.used_by("job", digest)

    def fetch():
        try:
            write_chunks(slow_fetch(read_chunks(tmp_path / f"{digest}.tar.gz", digest), stop_after), part, digest,
                         transfer.advanced)
        except ConnectionError:
            transfer.fail()

    return serving, threading.Thread(target=fetch)


async def collect(serving: CodeServing, digest: str, job: str, offset: int = 0, asker: str | None = None) -> list:
    request = agent_pb2.FetchCodeRequest(sha256=f"sha256:{digest}", job_id=job, offset=offset)
    return [chunk async for chunk in serving.stream(Context(), request, asker=asker)]


def refusal(serving: CodeServing, digest: str, job: str, asker: str) -> tuple:
    with pytest.raises(Aborted) as refused:
        asyncio.run(collect(serving, digest, job, asker=asker))
    return refused.value.code, str(refused.value)


def slow_fetch(chunks, stop_after: int | None = None):
    """A source that sends a chunk every 50 ms (and, with stop_after, breaks off there)."""
    for i, chunk in enumerate(chunks):
        if stop_after is not None and i == stop_after:
            raise ConnectionError("cut off")
        time.sleep(0.05)
        yield chunk


def test_a_peer_gets_the_bytes_while_they_arrive_and_they_check_out(tmp_path, origin):
    digest, path = origin
    serving, writer = fetching(tmp_path, digest)
    writer.start()
    chunks = asyncio.run(collect(serving, digest, "job"))
    writer.join()
    assert write_chunks(iter(chunks), tmp_path / "copy", digest) == path.stat().st_size
    assert (tmp_path / "copy").read_bytes() == path.read_bytes()


def test_the_relay_starts_before_the_fetch_ends_and_from_any_offset(tmp_path, origin):
    digest, path = origin
    serving, writer = fetching(tmp_path, digest)

    async def first_chunk_then_rest():
        request = agent_pb2.FetchCodeRequest(sha256=f"sha256:{digest}", job_id="job", offset=CHUNK_BYTES + 7)
        stream = serving.stream(Context(), request)
        first = await stream.__anext__()
        still_fetching = writer.is_alive()
        rest = [chunk async for chunk in stream]
        return first, still_fetching, rest

    writer.start()
    first, still_fetching, rest = asyncio.run(first_chunk_then_rest())
    writer.join()
    assert still_fetching, "the first chunk came while this node still fetched the archive"
    assert first.offset == CHUNK_BYTES + 7 and first.size == path.stat().st_size
    assert b"".join(c.data for c in (first, *rest)) == path.read_bytes()[CHUNK_BYTES + 7:]


def test_a_failed_fetch_ends_the_relay_so_the_peer_goes_to_its_next_source(tmp_path, origin):
    digest, _ = origin
    serving, writer = fetching(tmp_path, digest, stop_after=2)
    writer.start()
    with pytest.raises(Aborted) as aborted:
        asyncio.run(collect(serving, digest, "job"))
    assert aborted.value.code == grpc.StatusCode.UNAVAILABLE


def test_only_a_job_whose_launch_named_the_archive_is_served_and_a_late_launch_is_waited_for(tmp_path, origin):
    digest, path = origin
    serving = CodeServing(lambda hex_digest: path if hex_digest == digest else None, wait_seconds=0.3)
    serving.used_by("job", digest)
    for job, sha in (("other-job", digest), ("job", "ab" * 32)):
        with pytest.raises(Aborted) as refused:
            asyncio.run(collect(serving, sha, job))
        assert refused.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(Aborted) as bad:
        asyncio.run(collect(serving, "not-a-hash", "job"))
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
    serving.wait = 5.0
    threading.Timer(0.2, serving.used_by, ("late-job", digest)).start()  # its launch comes after the ask
    chunks = asyncio.run(collect(serving, digest, "late-job"))
    assert b"".join(c.data for c in chunks) == path.read_bytes()


def test_only_a_node_the_coordinator_sent_here_is_served_and_any_other_hears_the_code_is_not_here(tmp_path, origin):
    digest, path = origin
    serving = CodeServing(lambda hex_digest: path if hex_digest == digest else None, wait_seconds=0.3)
    not_here = refusal(serving, digest, "job", "c")  # before any launch of the job came: nothing here for it
    assert not_here[0] == grpc.StatusCode.NOT_FOUND
    serving.used_by("job", digest)
    assert refusal(serving, digest, "job", "c") == not_here, "a node not sent here learns nothing more"
    serving.serve_to("other-job", "c")
    assert refusal(serving, digest, "job", "c") == not_here, "sent here for another job's code"
    serving.serve_to("job", "b")
    assert refusal(serving, digest, "job", "c") == not_here, "another node was sent here, not c"
    assert b"".join(c.data for c in asyncio.run(collect(serving, digest, "job", asker="b"))) == path.read_bytes()
    assert asyncio.run(collect(serving, digest, "job")), "--insecure: no certificate, any caller"
    serving.wait = 5.0
    threading.Timer(0.2, serving.serve_to, ("job", "c")).start()  # the coordinator's word comes after the ask
    assert b"".join(c.data for c in asyncio.run(collect(serving, digest, "job", asker="c"))) == path.read_bytes()


class StalledCall:
    """A streaming call that sends one chunk and then nothing, until cancelled."""

    def __init__(self):
        self.cancelled = threading.Event()

    def __iter__(self):
        yield "first"
        self.cancelled.wait(30)
        raise RuntimeError("cancelled")

    def cancel(self):
        self.cancelled.set()


def test_a_source_that_stalls_is_cancelled_after_its_idle_time():
    call = StalledCall()
    began = time.monotonic()
    got = []
    with pytest.raises(RuntimeError, match="cancelled"), _Watchdog(call, 0.3) as chunks:
        for chunk in chunks:
            got.append(chunk)
    assert got == ["first"] and 0.3 <= time.monotonic() - began < 5
