"""Starting a job (Cluster.start, `tfcluster start`): the first step for a spec whose workdir is not on shared storage: pack the workdir, send the
coordinator what it lacks of the archive, and name the archive in the spec.

When the coordinator already holds the tree this costs a walk of its listing and one small call
(CodeStatus): the archive made of a tree whose listing (sizes, modification times) has not changed since is
remembered in the user's cache, and not made again. An upload that is cut off goes on from what the
coordinator says it holds; one that takes more than a moment shows a progress bar.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import grpc

from tfcluster import codepack
from tfcluster.client import RETRYABLE, Client
from tfcluster.errors import ClusterError, InvalidRequest
from tfcluster.spec import JobSpec

UPLOAD_TRIES = 5
CACHE_ENTRIES = 64  # trees remembered
PROGRESS_AFTER_SECONDS = 0.5  # an upload done sooner shows no bar


def ship_code(client: Client, spec: JobSpec) -> JobSpec:
    """The spec naming its workdir's archive, once the coordinator holds it; InvalidRequest when the tree cannot
    be packed or is over the coordinator's cap, ClusterError when it cannot be sent. What it does is said in a
    line or two on stderr (`code: ...`)."""
    outputs = _outputs_inside(spec)
    try:
        entries = codepack.collect(spec.workdir, outputs)
    except codepack.PackError as e:
        raise InvalidRequest(f"code: {e}") from None
    _say_left_out(spec.workdir, outputs)
    fingerprint = codepack.fingerprint(spec.workdir, entries, outputs)
    known = _remembered(fingerprint)
    if known and _code_status(client, known["sha256"], known["size"]).complete:
        _said(codepack.summary(known["files"], known["tree_bytes"], known["sha256"]), "already on the cluster")
        return replace(spec, code_sha256=known["sha256"])
    archive = _pack(client, spec.workdir, entries)  # the entries already leave the outputs out
    try:
        held = _code_status(client, archive.sha256, archive.size)
        if archive.size > held.max_bytes:
            raise InvalidRequest(codepack.over_cap_message(entries, held.max_bytes))
        if held.complete:
            done = "already on the cluster"
        else:
            _upload(client, archive, held.received)
            done = "uploaded"
    finally:
        archive.remove()
    _remember(fingerprint, {"sha256": archive.sha256, "size": archive.size, "files": archive.files,
                            "tree_bytes": archive.tree_bytes})
    _said(archive.summary(), done)
    return replace(spec, code_sha256=archive.sha256)


def _outputs_inside(spec: JobSpec) -> dict[str, list[str]]:
    """The folders the job writes (checkpoints, the model, summaries) that lie inside its workdir, by their path
    from it, each with what the spec calls it: what one run wrote there is no code for the next. A folder inside
    another of them goes with it."""
    workdir = Path(spec.workdir).resolve()
    named = [(spec.checkpoint_dir, "the job's checkpoint_dir"), (spec.model_dir, "the job's model_dir")]
    named += [(role.summary_dir, f"the {role_type}'s summary_dir") for role_type, role in spec.roles.items()]
    inside: dict[str, list[str]] = {}
    for path, name in named:
        real = workdir.joinpath(path).resolve() if path else workdir
        if workdir in real.parents:
            inside.setdefault(real.relative_to(workdir).as_posix(), []).append(name)
    return {path: names for path, names in sorted(inside.items())
            if not any(path.startswith(other + "/") for other in inside)}


def _say_left_out(workdir: str, outputs: dict[str, list[str]]) -> None:
    """`code: left out runs/mwms-fit (the job's checkpoint_dir)`, for the folders that are there to leave out."""
    present = [f"{path} ({', '.join(names)})" for path, names in outputs.items()
               if os.path.lexists(Path(workdir, path))]
    if present:
        print(f"code: left out {', '.join(present)}", file=sys.stderr, flush=True)


def _pack(client: Client, workdir: str, entries: list[codepack.Entry]) -> codepack.Archive:
    """The archive, packed under the default cap; a tree over it asks the coordinator's own cap (set higher,
    perhaps) rather than pack for nothing. The cap is checked against the coordinator's answer after."""
    cap, asked = codepack.DEFAULT_MAX_BYTES, False
    while True:
        if codepack.tree_bytes(entries) > cap and not asked:
            cap, asked = _code_status(client, "", 0).max_bytes, True
        try:
            return codepack.pack(workdir, cap, entries)
        except codepack.OverCap as e:
            if asked:
                raise InvalidRequest(str(e)) from None
            cap, asked = _code_status(client, "", 0).max_bytes, True
        except codepack.PackError as e:
            raise InvalidRequest(f"code: {e}") from None


def _said(summary: str, done: str) -> None:
    print(f"code: {summary}, {done}", file=sys.stderr, flush=True)


def _cache_file() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tfcluster" / "code.json"


def _remembered(fingerprint: str = "") -> dict:
    """Every tree remembered (fingerprint -> its archive), or the one archive of fingerprint ({}: none)."""
    try:
        known = json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return {}  # no cache, or a damaged one: the tree is packed, as the first time
    if not isinstance(known, dict):
        return {}
    if not fingerprint:
        return known
    archive = known.get(fingerprint)
    fields = {"sha256": str, "size": int, "files": int, "tree_bytes": int}
    whole = isinstance(archive, dict) and all(isinstance(archive.get(k), t) for k, t in fields.items())
    return archive if whole and codepack.SHA256_RE.fullmatch(archive["sha256"]) else {}


def _remember(fingerprint: str, archive: dict) -> None:
    """Keeps the newest CACHE_ENTRIES trees; a cache that cannot be written costs a pack next time, no more."""
    known = _remembered()
    known.pop(fingerprint, None)
    known[fingerprint] = archive
    kept = dict(list(known.items())[-CACHE_ENTRIES:])
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(kept))
        os.replace(scratch, path)
    except OSError:
        pass


def _code_status(client: Client, sha256: str, size: int):
    try:
        return client.code_status(sha256, size)
    except ClusterError as e:
        if e.status == grpc.StatusCode.UNIMPLEMENTED:
            raise ClusterError(f"code: the coordinator at {client.address} takes no code archives (an earlier "
                               f"release); put the workdir on storage every node shares and say shared_workdir = "
                               f"true in the spec") from None
        raise


def _upload(client: Client, archive: codepack.Archive, received: int) -> None:
    """Sends the archive from `received` on; after a broken connection, or a chunk the coordinator did not
    expect (another upload of the same tree ran alongside), asks where it stands and goes on from there."""
    with _Progress(archive.size, received) as progress:
        for attempt in range(UPLOAD_TRIES):
            try:
                client.upload_code(archive.path, archive.sha256, archive.size, received, progress.update)
                return
            except ClusterError as e:
                if e.status not in (*RETRYABLE, grpc.StatusCode.FAILED_PRECONDITION) or attempt == UPLOAD_TRIES - 1:
                    raise type(e)(f"code: upload failed: {e}") from None
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
            if time.monotonic() - self.began < PROGRESS_AFTER_SECONDS or not sys.stderr.isatty():
                return
            from rich.console import Console
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                       TransferSpeedColumn)
            self.bar = Progress(TextColumn("code"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self.task = self.bar.add_task("upload", total=self.total, completed=self.start)
            self.bar.start()
        self.bar.update(self.task, completed=received)

    def __enter__(self) -> "_Progress":
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
