"""The agent's task launcher, as a process of its own (`python -m tfcluster.daemon.agent.tasks.launcher_process
FD`; the agent's side is launcher.py): starts a shim for each request on the socket it was given, on a shim it
forked before that is free again (forked_shim.py) or on one it forks now.

It imports the shim's code and as little else as it can, threading, logging and random above all: each of
those runs an at-fork hook in every child, and in a forked shim each page such a hook writes to is copied
first (0.3 ms of a tiny task's CPU for threading's alone, measured). tests/unit/test_launcher.py keeps it so.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path

from tfcluster.daemon.agent.tasks import forked_shim

MAX_REQUEST_BYTES = forked_shim.MAX_REQUEST_BYTES
MAX_FDS = 2
MAX_REPLY_BYTES = 1024
# Free shims are kept in two tiers. A burst of tiny tasks (a sweep) comes in waves: the shims one wave freed run the
# next, where each one ended would have to be forked again (about 3 ms of CPU each). With 8 kept, a tenth of the
# attempts of bench/cli.py's throughput needed a fork, with 64 a twentieth, and each job took 8% less CPU
# (alternated runs). Past the first few they are kept only a few seconds, so a burst leaves no crowd of idle shims
# behind (3 MB of its own memory each).
MAX_FREE_SHIMS = 64  # kept free at most
KEPT_FREE_SHIMS = 8  # kept free for FREE_SECONDS; the others for BURST_FREE_SECONDS
FREE_SECONDS = 30.0  # a shim free this long ends: a node between jobs keeps none
BURST_FREE_SECONDS = 5.0


class Shims:
    """The shims this launcher forked that may run another attempt: a channel to each, and which are free."""

    def __init__(self) -> None:
        self.channels: dict[int, tuple[int, socket.socket]] = {}  # channel fd -> (shim pid, channel)
        self.free: list[tuple[int, bool, float]] = []  # (channel fd, no new privileges, free since), oldest first

    def add(self, pid: int, channel: socket.socket) -> None:
        self.channels[channel.fileno()] = (pid, channel)

    def heard(self, fd: int) -> None:
        """A shim said it is free, or ended (the end of its channel)."""
        try:
            message = self.channels[fd][1].recv(64)
        except OSError:
            message = b""
        if not message.startswith(b"free "):
            self.drop(fd)
            return
        self.free.append((fd, message == b"free 1", time.monotonic()))
        if len(self.free) > MAX_FREE_SHIMS:
            self.drop(self.free[0][0])

    def take(self, no_new_privileges: bool) -> tuple[int, socket.socket] | None:
        """The shim freed last that may run a task of this kind (one with no new privileges for good runs only
        tasks that set them too), taken off the free ones. What shims said meanwhile is heard first: one freed
        just before the request came is not passed over for a fork."""
        self.hear(0)
        for n in range(len(self.free) - 1, -1, -1):
            fd, restricted, _ = self.free[n]
            if no_new_privileges or not restricted:
                del self.free[n]
                return self.channels[fd]
        return None

    def hear(self, timeout_ms: int, *others: int) -> set[int]:
        """Waits up to timeout_ms (-1: for ever) for the shims' channels and the `others`: hears the shims that
        spoke, and returns those of the others that are ready."""
        poller = select.poll()
        for fd in (*others, *self.channels):
            poller.register(fd, select.POLLIN)
        try:
            ready = {fd for fd, _ in poller.poll(timeout_ms)}
        except InterruptedError:
            ready = set()
        others = ready - self.channels.keys()
        for fd in sorted(ready - others):
            if fd in self.channels:  # not dropped meanwhile, to keep the free ones few
                self.heard(fd)
        return others

    def expire(self, now: float) -> float | None:
        """Ends the shims free for FREE_SECONDS, and those past KEPT_FREE_SHIMS free for BURST_FREE_SECONDS (the
        oldest first); the seconds until the next one is due (None: none is free)."""
        while self.free and now - self.free[0][2] >= self._free_seconds():
            self.drop(self.free[0][0])
        return self._free_seconds() - (now - self.free[0][2]) if self.free else None

    def _free_seconds(self) -> float:
        """How long the oldest free shim is kept free."""
        return BURST_FREE_SECONDS if len(self.free) > KEPT_FREE_SHIMS else FREE_SECONDS

    def drop(self, fd: int) -> None:
        """Closes the channel: a free shim then ends, a busy one ends after its attempt."""
        self.free = [f for f in self.free if f[0] != fd]
        _, channel = self.channels.pop(fd)
        channel.close()


def serve(sock: socket.socket) -> None:
    """Starts a shim for each request until the agent's end closes."""
    wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the poll through the wakeup fd
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    shims = Shims()
    while True:
        due = shims.expire(time.monotonic())
        ready = shims.hear(-1 if due is None else int(due * 1000) + 1, sock.fileno(), wakeup_read)
        if wakeup_read in ready:
            while _drained(wakeup_read):
                pass
        _reap()
        if sock.fileno() in ready:
            try:
                message, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST_BYTES, MAX_FDS)
            except OSError:
                return
            if not message:
                return  # the agent is gone
            _answer(sock, message, fds, shims)


def _answer(sock: socket.socket, message: bytes, fds: list[int], shims: Shims) -> None:
    """Starts the shim, and lets it run only once the agent has been sent its pid and pidfd: a launcher that dies
    in between leaves no shim the agent does not know of (it would start another one for the same attempt)."""
    go_read = go_write = -1
    try:
        if len(fds) != MAX_FDS:
            raise OSError(f"expected {MAX_FDS} descriptors with the request, got {len(fds)}")
        go_read, go_write = os.pipe2(os.O_CLOEXEC)
        request = forked_shim.Request(message, [*fds, go_read])
        pid = _hand_to_free(shims, request) or _fork(shims, request, go_write)
        pidfd = os.pidfd_open(pid)  # before any reaping: pid is still this child, at worst a zombie
    except OSError as e:
        reply, pidfd = f"cannot fork a shim: {e}".encode(), os.open(os.devnull, os.O_RDONLY)
    else:
        reply = str(pid).encode()
    finally:
        for fd in (*fds, go_read):
            if fd != -1:
                os.close(fd)
    try:
        socket.send_fds(sock, [reply], [pidfd])
        told = True
    except OSError:  # the agent is gone: its next read sees the end
        told = False
    finally:
        os.close(pidfd)
    if go_write != -1:
        try:
            with contextlib.suppress(OSError):  # a shim gone already: the agent sees its output end
                if told:
                    os.write(go_write, b"go")
        finally:
            os.close(go_write)  # unsent, the shim reads no "go" and ends before it runs anything


def _hand_to_free(shims: Shims, request: forked_shim.Request) -> int:
    """The pid of a free shim that took the request; 0 when none did."""
    while True:
        free = shims.take(request.no_new_privileges)
        if free is None:
            return 0
        pid, channel = free
        try:
            socket.send_fds(channel, [request.message], request.fds)
            return pid
        except OSError:  # it ended meanwhile
            shims.drop(channel.fileno())


def _fork(shims: Shims, request: forked_shim.Request, go_write: int) -> int:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pid = os.fork()
        if pid == 0:
            os.close(go_write)  # or the child's own copy would keep it waiting for a "go" that never comes
            forked_shim.run_shims(request, theirs.fileno())
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    shims.add(pid, ours)
    return pid


def _drained(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def warm_up() -> None:
    """Runs one shim here, of `true` in a scratch dir, before any is forked: what a shim's first run sets up once
    (symbols bound on first call, the type and decoder caches, the first spawn) is then set
    up in the pages every shim shares with the launcher, not copied and done again in each of them (0.3 ms of a
    shim's 3.8 ms of CPU, measured). A warm-up that fails costs nothing but that."""
    from tfcluster.daemon.agent.shim.runner import Runner
    from tfcluster.daemon.agent.shim.taskfiles import LaunchFile
    from tfcluster.model import Attempt

    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    saved_stdout = os.dup(1)
    try:
        with _scratch_dir() as scratch, open(os.devnull, "w") as devnull:
            LaunchFile(Attempt("warm-up", "worker", 0, 1), ("true",), {"PATH": os.defpath},
                       workdir=scratch).write(Path(scratch))
            os.dup2(devnull.fileno(), 1)  # the shim's own lines, for an agent that is not there
            Runner(Path(scratch)).run()
    except Exception as e:  # noqa: BLE001  never a reason for the launcher not to serve
        print(f"the task launcher's warm-up failed: {e}", file=sys.stderr, flush=True)
    finally:
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _scratch_dir():
    """A new dir of root's alone under $TMPDIR (or /tmp), removed with what is in it. Not tempfile's: it imports
    random, whose at-fork hook would reseed in every shim (shutil's rmtree would bring threading, through bz2)."""
    scratch = os.path.join(os.environ.get("TMPDIR") or "/tmp", f"tfcluster-launcher-{os.urandom(8).hex()}")
    os.mkdir(scratch, 0o700)
    try:
        yield scratch
    finally:
        for parent, dirs, files in os.walk(scratch, topdown=False):
            for name in files:
                os.unlink(os.path.join(parent, name))
            for name in dirs:
                os.rmdir(os.path.join(parent, name))
        os.rmdir(scratch)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m tfcluster.daemon.agent.tasks.launcher_process SOCKET_FD", file=sys.stderr)
        return 2
    import tfcluster.daemon.agent.shim.runner  # noqa: F401  imported once here, not in every shim
    warm_up()
    # What is imported stays out of the collector's way: a shim's collections then leave the pages it shares
    # with the launcher unwritten, and unwritten pages are not copied.
    gc.collect()
    gc.freeze()
    with socket.socket(fileno=int(sys.argv[1])) as sock:
        serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
