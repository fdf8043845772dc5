"""`tfcluster start`'s first step for a spec whose workdir is not on shared storage: pack the workdir, send the
coordinator what it lacks of the archive, and name the archive in the spec.

When the coordinator already holds the tree this costs one small call (CodeStatus). An upload that is cut
off goes on from what the coordinator says it holds; one that takes more than a moment shows a progress bar.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

import grpc

from tfcluster import codepack
from tfcluster.cli.common import err, fail
from tfcluster.client import Client, ClientError, RETRYABLE
from tfcluster.spec import JobSpec

UPLOAD_TRIES = 5
PROGRESS_AFTER_SECONDS = 0.5  # an upload done sooner shows no bar


def ship_code(client: Client, spec: JobSpec) -> JobSpec:
    """The spec naming its workdir's archive, once the coordinator holds it; exits with a message when the
    tree cannot be packed, is over the coordinator's cap, or cannot be sent."""
    try:
        entries = codepack.collect(spec.workdir)
    except codepack.PackError as e:
        fail(f"code: {e}", 2)
    cap = codepack.DEFAULT_MAX_BYTES
    if codepack.tree_bytes(entries) > cap:  # perhaps over a cap set higher: ask it, rather than pack for nothing
        cap = _code_status(client, "", 0).max_bytes
    try:
        archive = codepack.pack(spec.workdir, cap, entries)
    except codepack.PackError as e:
        fail(str(e) if str(e).startswith("code: ") else f"code: {e}", 2)
    try:
        held = _code_status(client, archive.sha256, archive.size)
        if archive.size > held.max_bytes:
            fail(codepack.over_cap_message(entries, held.max_bytes), 2)
        if held.complete:
            done = "already on the cluster"
        else:
            _upload(client, archive, held.received)
            done = "uploaded"
    finally:
        archive.remove()
    print(f"code: {archive.summary()}, {done}", file=sys.stderr, flush=True)
    return replace(spec, code_sha256=archive.sha256)


def _code_status(client: Client, sha256: str, size: int):
    try:
        return client.code_status(sha256, size)
    except ClientError as e:
        if e.status == grpc.StatusCode.UNIMPLEMENTED:
            fail(f"code: the coordinator at {client.address} takes no code archives (an earlier release); put the "
                 f"workdir on storage every node shares and say shared_workdir = true in the spec")
        fail(str(e), e.exit_code)


def _upload(client: Client, archive: codepack.Archive, received: int) -> None:
    """Sends the archive from `received` on; after a broken connection, or a chunk the coordinator did not
    expect (another upload of the same tree ran alongside), asks where it stands and goes on from there."""
    with _Progress(archive.size, received) as progress:
        for attempt in range(UPLOAD_TRIES):
            try:
                client.upload_code(archive.path, archive.sha256, archive.size, received, progress.update)
                return
            except ClientError as e:
                if e.status not in (*RETRYABLE, grpc.StatusCode.FAILED_PRECONDITION) or attempt == UPLOAD_TRIES - 1:
                    fail(f"code: upload failed: {e}", e.exit_code)
                time.sleep(0.25 * 2 ** attempt)
            held = _code_status(client, archive.sha256, archive.size)
            if held.complete:
                return
            received = held.received
            progress.update(received)


class _Progress:
    """A rich progress bar on stderr (a terminal only), shown once the upload has taken PROGRESS_AFTER_SECONDS."""

    def __init__(self, total: int, start: int):
        self.total, self.start, self.began = total, start, time.monotonic()
        self.bar = self.task = None

    def update(self, received: int) -> None:
        if self.bar is None:
            if time.monotonic() - self.began < PROGRESS_AFTER_SECONDS or not err.is_terminal:
                return
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                       TransferSpeedColumn)
            self.bar = Progress(TextColumn("code"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                TimeRemainingColumn(), console=err.console, transient=True)
            self.task = self.bar.add_task("upload", total=self.total, completed=self.start)
            self.bar.start()
        self.bar.update(self.task, completed=received)

    def __enter__(self) -> "_Progress":
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
