"""The ControlService calls that bring a job's code to the coordinator: CodeStatus and UploadCode.

A client asks how much of its archive is here and sends only the rest, in order, in chunks; the archive
is kept once its size and sha256 check out (store/code_archives.py). A job that names an archive is accepted only
once the archive is here, so that every node it runs on can fetch it.

Code is its uploaders' (access.may_use_code): a caller who may not use an archive is answered, by CodeStatus
and by SubmitJob, exactly as if it were not here, so that asking tells nothing of another's code. Such a
caller who holds the same tree sends it whole, like a first upload, and is then one of its owners.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from tfcluster import security
from tfcluster.api.v1 import control_pb2
from tfcluster.daemon.coordinator.core.access import rules as access
from tfcluster.daemon.coordinator.store.code_archives import CodeRefused, CodeStore
from tfcluster.pki import Identity
from tfcluster.spec import JobSpec

log = logging.getLogger("tfcluster.coordinator")

SWEEP_SECONDS = 60.0


class CodeServicer:
    """Mixed into the ControlService's servicer; `self.c` is the Coordinator, whose `code` is the store."""

    async def _store(self, context) -> CodeStore:
        if self.c.code is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this coordinator keeps no code archives")
        return self.c.code

    async def CodeStatus(self, request, context):
        store = await self._store(context)
        if not request.sha256:  # a client with a large tree asks the cap before it packs
            return control_pb2.CodeStatusResponse(max_bytes=store.max_bytes)
        who = security.caller()
        try:
            held = store.touch(request.sha256) if self._may_use(request.sha256, who) else None
            if held is not None:
                return control_pb2.CodeStatusResponse(complete=True, received=held, max_bytes=store.max_bytes)
            received = store.received(request.sha256, request.size, _uploader(who))
        except CodeRefused as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return control_pb2.CodeStatusResponse(complete=False, received=received, max_bytes=store.max_bytes)

    async def UploadCode(self, request_iterator, context):
        store = await self._store(context)
        who = security.caller()
        uploader = _uploader(who)
        sha256, size, received = "", 0, 0
        try:
            async for chunk in request_iterator:
                if not sha256:
                    sha256, size = chunk.sha256, chunk.size
                    if self._may_use(sha256, who):  # theirs already (another upload of theirs finished first)
                        return control_pb2.UploadCodeResponse(complete=True, received=size)
                elif (chunk.sha256, chunk.size) != (sha256, size):
                    raise CodeRefused("one upload is of one archive: every chunk names the first's sha256 and size",
                                      received)
                received = store.write(sha256, size, chunk.offset, chunk.data, uploader)
            if not sha256:
                raise CodeRefused("an upload with no chunk")
            await asyncio.to_thread(store.finish, sha256, size, uploader, self._users_of_jobs(sha256))
        except CodeRefused as e:
            code = grpc.StatusCode.FAILED_PRECONDITION if e.received else grpc.StatusCode.INVALID_ARGUMENT
            await context.abort(code, str(e))
        except OSError as e:
            log.error("code %s: cannot store it: %s", sha256, e)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the coordinator cannot store the code: {e.strerror}")
        return control_pb2.UploadCodeResponse(complete=True, received=size)

    async def _check_code(self, spec: JobSpec, context) -> None:
        """A job may name only an archive the coordinator holds and its submitter may use; one they may not
        use is refused in the same words as one not here."""
        if spec.code_sha256 and not self._may_use(spec.code_sha256, security.caller()):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"code {spec.code_sha256} is not on the coordinator: upload it first "
                                 f"(`tfcluster start` does)")

    def _may_use(self, sha256: str, who: Identity | None) -> bool:
        """Whether the archive is here and who may use it (a bad name is not here)."""
        store = self.c.code
        if store is None or not store.has(sha256):
            return False
        return access.may_use_code(who, store.owners(sha256), lambda: self._users_of_jobs(sha256))

    def _users_of_jobs(self, sha256: str) -> set[str]:
        """The owners of the kept jobs that name the archive."""
        return {job.owner for job in self.c.cluster.jobs.values() if job.spec.code_sha256 == sha256 and job.owner}


def _uploader(who: Identity | None) -> str:
    """Whose upload it is: the name in the caller's certificate ("": no certificate, with --insecure)."""
    return who.name if who is not None else ""


async def sweep_summaries(coordinator) -> None:
    """Every SWEEP_SECONDS, removes the summaries of the jobs retention let go (store/summaries.py)."""
    while True:
        await asyncio.sleep(SWEEP_SECONDS)
        try:
            await asyncio.to_thread(coordinator.summaries.sweep, set(coordinator.cluster.jobs))
        except OSError as e:
            log.warning("summaries not swept: %s", e)


async def sweep_code(coordinator) -> None:
    """Every SWEEP_SECONDS, removes the archives no kept job or running sweep names (the jobs' own retention
    decides)."""
    while True:
        await asyncio.sleep(SWEEP_SECONDS)
        in_use = {job.spec.code_sha256 for job in coordinator.cluster.jobs.values() if job.spec.code_sha256}
        in_use |= {s.spec.code_sha256 for s in coordinator.cluster.sweeps.by_id.values()  # trials still to submit
                   if s.spec.code_sha256 and not s.state.ended}
        try:
            await asyncio.to_thread(coordinator.code.sweep, in_use)
        except OSError as e:
            log.warning("code archives not swept: %s", e)
