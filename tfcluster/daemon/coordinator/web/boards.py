"""TensorBoard through the dashboard: `/tensorboard/<JOB>[+<JOB>...]/` serves a real TensorBoard over those jobs'
summaries (`tfcluster tensorboard JOB...` prints a one-time link to it), runs named `JOB/<type>:<index>`.

Each set of jobs gets a board: a TensorBoard process of its own (board_process.py) started on the first request
and stopped once no request came for IDLE_SECONDS, at most MAX_BOARDS at once (the least recently used goes
first). TensorBoard never runs in the coordinator's process: its imports, its threads reloading event files and
its memory stay out of the process that schedules. The process listens on a UNIX socket in a private
temporary folder, and this listener passes each request on to it once the caller may read every job of the
board (a user their own, admins and viewers all, core/access/rules.py); a job that is not there and one that is
not the caller's get the same answer. The board reads the coordinator's summary store (store/summaries.py)
through symbolic links, `<logdir>/<JOB>/<type>:<index>` to the task's folder there, added as tasks send their
first summaries; the summaries outlive the job and its nodes, so a board of ended jobs still shows them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil
from aiohttp import web

from tfcluster import summaries
from tfcluster.daemon.coordinator.core.access import rules as access
from tfcluster.daemon.coordinator.rpc.coordinator import Coordinator
from tfcluster.daemon.web import CALLER, WebListener

log = logging.getLogger("tfcluster.coordinator")

MAX_BOARDS = 8
IDLE_SECONDS = 300.0  # an open TensorBoard page asks for data every 30 s, so only a closed one goes idle
START_SECONDS = 60.0
TICK_SECONDS = 1.0  # how often new tasks' folders are linked, and idle boards looked for
STOP_SECONDS = 5.0
FOLDER_PREFIX = "tfcluster-board-"  # then the PID of the coordinator that made it
# Hop-by-hop headers, and what must not reach the board (the session cookie) or come back unchanged.
NOT_PASSED_ON = {"connection", "keep-alive", "transfer-encoding", "upgrade", "host", "cookie", "te", "trailer",
                 "proxy-authorization", "proxy-authenticate"}


@dataclass
class Board:
    jobs: list[str]
    folder: Path                 # private: the socket, the logdir of links, the process's output
    process: asyncio.subprocess.Process | None = None
    session: aiohttp.ClientSession | None = None
    started: asyncio.Task | None = None
    last_used: float = field(default_factory=time.monotonic)

    @property
    def socket(self) -> str:
        return str(self.folder / "board.sock")

    @property
    def logdir(self) -> Path:
        return self.folder / "logdir"


def remove_stale_folders(tmp: str | None = None) -> list[Path]:
    """Removes the board folders (a socket and links) that coordinators killed with SIGKILL left behind: those of
    this user named by a PID that no longer runs. Returns them."""
    removed = []
    for folder in Path(tmp or tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*-*"):
        pid = folder.name[len(FOLDER_PREFIX):].split("-", 1)[0]
        try:
            mine = folder.is_dir() and not folder.is_symlink() and folder.stat().st_uid == os.geteuid()
        except OSError:
            continue
        if mine and pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    if removed:
        log.info("removed %d TensorBoard folders that stopped coordinators left", len(removed))
    return removed


class Boards:
    def __init__(self, coordinator: Coordinator, listener: WebListener):
        self.c = coordinator
        self.boards: dict[str, Board] = {}
        self.ticker: asyncio.Task | None = None
        listener.app.router.add_route("*", summaries.BOARD_PREFIX + "{jobs}", self._redirect)
        listener.app.router.add_route("*", summaries.BOARD_PREFIX + "{jobs}/{tail:.*}", self._proxy)
        listener.app.on_startup.append(self._start_ticking)
        listener.app.on_cleanup.append(self._stop_all)

    # ---- requests -----------------------------------------------------------------------------------

    def _jobs(self, request: web.Request) -> list[str]:
        """The board's jobs, once the caller may read each; 404 otherwise, the same for absent and not yours."""
        job_ids = request.match_info["jobs"].split("+")
        if len(job_ids) > summaries.BOARD_MAX_JOBS:
            raise web.HTTPBadRequest(text=f"a TensorBoard shows at most {summaries.BOARD_MAX_JOBS} jobs\n")
        for job_id in job_ids:
            job = self.c.cluster.jobs.get(job_id)
            if job is None or not access.may_read(request.get(CALLER), job):
                raise web.HTTPNotFound(text=access.unreadable(job_id) + "\n")
        return job_ids

    async def _redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(summaries.board_path(self._jobs(request)))

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        job_ids = self._jobs(request)
        path = summaries.board_path(job_ids)
        if not request.path.startswith(path):  # the same jobs named in another order: the one board's address
            raise web.HTTPFound(path + request.match_info["tail"] + (f"?{request.query_string}"
                                                                      if request.query_string else ""))
        if self.c.summaries is None:
            raise web.HTTPServiceUnavailable(text="this coordinator keeps no summaries\n")
        board = await self._ready(path.rstrip("/"), job_ids)
        board.last_used = time.monotonic()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in NOT_PASSED_ON}
        try:
            async with board.session.request(request.method, f"http://board{request.rel_url}", headers=headers,
                                             data=await request.read() if request.can_read_body else None,
                                             allow_redirects=False) as reply:
                return await _pass_back(request, reply)
        except aiohttp.ClientError as e:
            raise web.HTTPBadGateway(text=f"the TensorBoard of {', '.join(job_ids)} did not answer: {e}\n") from None

    # ---- boards -------------------------------------------------------------------------------------

    async def _ready(self, prefix: str, job_ids: list[str]) -> Board:
        board = self.boards.get(prefix)
        if board is None or (board.process is not None and board.process.returncode is not None):
            if board is not None:
                await self._stop(prefix)
            while len(self.boards) >= MAX_BOARDS:
                await self._stop(min(self.boards, key=lambda p: self.boards[p].last_used))
            # 0700, and a short path for the socket; named by this coordinator's PID so that a later one removes
            # what a killed one left (remove_stale_folders)
            folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
            board = self.boards[prefix] = Board(job_ids, folder)
            board.started = asyncio.create_task(self._start(board, prefix))
        try:
            await asyncio.shield(board.started)
        except (OSError, RuntimeError) as e:
            await self._stop(prefix)
            raise web.HTTPServiceUnavailable(text=f"TensorBoard could not start: {e}\n") from None
        return board

    async def _start(self, board: Board, prefix: str) -> None:
        board.logdir.mkdir()
        self._link(board)
        output = open(board.folder / "output.log", "wb")
        with output:
            board.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tfcluster.daemon.coordinator.web.board_process", str(board.logdir),
                board.socket, prefix, stdin=asyncio.subprocess.DEVNULL, stdout=output, stderr=output)
        board.session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=board.socket),
                                              auto_decompress=False, timeout=aiohttp.ClientTimeout(total=120))
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if board.process.returncode is not None:
                tail = (board.folder / "output.log").read_bytes()[-2000:].decode(errors="replace")
                raise RuntimeError(f"it exited with status {board.process.returncode}: {tail.strip()}")
            with contextlib.suppress(aiohttp.ClientError):
                async with board.session.get(f"http://board{prefix}/data/environment") as reply:
                    if reply.status == 200:
                        log.info("TensorBoard over %s started (pid %d)", ", ".join(board.jobs), board.process.pid)
                        return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"it did not answer within {START_SECONDS:.0f} s")

    def _link(self, board: Board) -> None:
        """Links every task folder of the board's jobs that the store holds and the logdir lacks yet."""
        for job_id in board.jobs:
            for task_type, task_index, folder in self.c.summaries.task_folders(job_id):
                link = board.logdir / job_id / summaries.task_key(task_type, task_index)
                if not link.is_symlink():
                    link.parent.mkdir(exist_ok=True)
                    link.symlink_to(folder)

    async def _stop(self, prefix: str) -> None:
        board = self.boards.pop(prefix)
        if board.started is not None and not board.started.done():
            board.started.cancel()
        process = board.process
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), STOP_SECONDS)
            except asyncio.TimeoutError:
                process.kill()
                await process.wait()
        if board.session is not None:
            await board.session.close()
        shutil.rmtree(board.folder, ignore_errors=True)
        log.info("TensorBoard over %s stopped", ", ".join(board.jobs))

    async def _start_ticking(self, app: web.Application) -> None:
        remove_stale_folders()
        self.ticker = asyncio.create_task(self._tick(), name="tensorboards")

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            now = time.monotonic()
            for prefix, board in list(self.boards.items()):
                if now - board.last_used > IDLE_SECONDS:
                    await self._stop(prefix)
                elif board.started is not None and board.started.done():
                    try:
                        self._link(board)
                    except OSError as e:
                        log.warning("TensorBoard over %s: new tasks not linked: %s", ", ".join(board.jobs), e)

    async def _stop_all(self, app: web.Application) -> None:
        if self.ticker is not None:
            self.ticker.cancel()
        for prefix in list(self.boards):
            await self._stop(prefix)


async def _pass_back(request: web.Request, reply: aiohttp.ClientResponse) -> web.StreamResponse:
    """The board's answer, streamed back. It keeps TensorBoard's own Content-Security-Policy (its page needs
    more than the dashboard's), with framing by this site only, where TensorBoard would allow any."""
    headers = {k: v for k, v in reply.headers.items() if k.lower() not in NOT_PASSED_ON}
    policy = headers.get("Content-Security-Policy")
    if policy is not None:
        kept = [p for p in policy.split(";") if not p.strip().startswith("frame-ancestors")]
        headers["Content-Security-Policy"] = ";".join([*kept, "frame-ancestors 'self'"])
        headers["X-Frame-Options"] = "SAMEORIGIN"
    response = web.StreamResponse(status=reply.status, headers=headers)
    await response.prepare(request)
    async for chunk in reply.content.iter_chunked(64 * 1024):
        await response.write(chunk)
    await response.write_eof()
    return response
