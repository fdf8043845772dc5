"""Starts task shims by forking a process that has the shim's code imported already.

A shim started as a fresh interpreter spends about 100 ms of CPU importing before it runs the task; forked
from this launcher it starts in about a millisecond. The launcher is a small single-threaded process the agent
starts (the agent has threads, so it never forks itself). It is the agent's helper, nothing more:

- Each request (on a socket pair with the agent) carries an attempt dir and the two descriptors the shim's
  stdout and stderr go to. The launcher forks; the child leaves the launcher behind (a session of its own, the
  agent's descriptors as 0-2, nothing else open, default signal handling) and runs the shim exactly as
  `python -m tfcluster.daemon.agent.shim.runner DIR` would. The launcher answers with the shim's pid and a pidfd
  of it, opened before the launcher can reap it, so the agent waits on the very process it asked for.
- The launcher reaps its children as they exit. It ends when the agent's end of the socket closes (the agent
  exited or died); the shims live on, as a shim whose agent died always has, and a new agent adopts them.
- An agent whose launcher died starts another one, and spawns shims itself when none will start (Launcher).
"""

from __future__ import annotations

import gc
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import IO

log = logging.getLogger("tfcluster.agent")

MAX_REQUEST_BYTES = 64 << 10  # an attempt dir's path
MAX_FDS = 2
MAX_REPLY_BYTES = 1024
SHIM_NAME = "tfcluster-shim"
# A launcher this slow to answer is stuck: the agent kills it (a shim it forked and did not answer for never
# runs) and starts another one.
ANSWER_TIMEOUT_SECONDS = 10.0


# ---- the agent's side ------------------------------------------------------------------------------

class ForkedShim:
    """A shim the launcher forked: what the supervisor needs of it, as of a subprocess.Popen (pid, stdout,
    wait), though it is not the agent's child: its exit is seen through its pidfd."""

    def __init__(self, pid: int, pidfd: int, stdout: IO[bytes]):
        self.pid = pid
        self.stdout = stdout
        self._pidfd = pidfd

    def wait(self) -> None:
        try:
            select.select([self._pidfd], [], [])
        finally:
            os.close(self._pidfd)


class Launcher:
    """The agent's handle on its launcher process: started on first use, started again when it died."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.process: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.unavailable = ""  # why no launcher can ever serve on this system ("": one can)

    def spawn(self, attempt_dir: Path, stderr_fd: int) -> ForkedShim:
        """Forks a shim for attempt_dir, its stderr to stderr_fd. Raises OSError when no launcher serves (the
        caller then starts the shim itself)."""
        with self.lock:
            if self.unavailable:
                raise OSError(self.unavailable)
            try:
                return self._spawn(attempt_dir, stderr_fd)
            except OSError as e:  # it died (or was never started): once more with a new one
                if self.process is not None:
                    log.warning("the task launcher is gone (%s); starting another", e)
                self._stop()
            return self._spawn(attempt_dir, stderr_fd)

    def _spawn(self, attempt_dir: Path, stderr_fd: int) -> ForkedShim:
        if self.sock is None:
            self._start()
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            socket.send_fds(self.sock, [os.fsencode(attempt_dir)], [write_end, stderr_fd])
            reply, fds, _, _ = socket.recv_fds(self.sock, MAX_REPLY_BYTES, 1)
        except OSError:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        if not fds:
            os.close(read_end)
            raise ConnectionError(f"the task launcher answered {reply!r:.80}" if reply else "the task launcher ended")
        if not reply.isdigit():  # it could not fork: fds[0] is no pidfd
            os.close(read_end)
            os.close(fds[0])
            raise OSError(reply.decode(errors="replace"))
        return ForkedShim(int(reply), fds[0], os.fdopen(read_end, "rb"))

    def _start(self) -> None:
        try:  # Linux 5.3 and later: the agent waits on each shim it did not start through a pidfd
            os.close(os.pidfd_open(os.getpid()))
        except (AttributeError, OSError) as e:
            self.unavailable = f"no pidfd_open on this system ({e})"
            raise OSError(self.unavailable) from None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            # Its own session: a ^C for a foreground agent is not for it (it ends when the agent does).
            self.process = subprocess.Popen([sys.executable, "-m", "tfcluster.daemon.agent.tasks.launcher",
                                             str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        ours.settimeout(ANSWER_TIMEOUT_SECONDS)
        self.sock = ours

    def _stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def warm(self) -> None:
        """Starts the launcher ahead of the first task, so that task does not wait for it."""
        with self.lock:
            if self.sock is None:
                try:
                    self._start()
                except OSError as e:
                    log.warning("cannot start the task launcher (%s): shims start as processes of their own", e)

    def close(self) -> None:
        """Ends the launcher (the shims it forked run on)."""
        with self.lock:
            self._stop()


# ---- the launcher process --------------------------------------------------------------------------

def serve(sock: socket.socket) -> None:
    """Forks a shim for each request until the agent's end closes."""
    wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes select through the wakeup fd
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            ready, _, _ = select.select([sock, wakeup_read], [], [])
        except InterruptedError:
            ready = []
        if wakeup_read in ready:
            while _drained(wakeup_read):
                pass
        _reap()
        if sock in ready:
            try:
                message, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST_BYTES, MAX_FDS)
            except OSError:
                return
            if not message:
                return  # the agent is gone
            _answer(sock, message, fds)


def _answer(sock: socket.socket, attempt_dir: bytes, fds: list[int]) -> None:
    """Forks the shim, and lets it run only once the agent has been sent its pid and pidfd: a launcher that dies
    in between leaves no shim the agent does not know of (it would start another one for the same attempt)."""
    go_read = go_write = -1
    try:
        if len(fds) != MAX_FDS:
            raise OSError(f"expected {MAX_FDS} descriptors with the request, got {len(fds)}")
        go_read, go_write = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            os.close(go_write)  # or the child's own copy would keep it waiting for a "go" that never comes
            _run_shim(os.fsdecode(attempt_dir), *fds, go=go_read)
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
            if told:
                os.write(go_write, b"go")
        finally:
            os.close(go_write)  # unsent, the child reads no "go" and ends before it runs anything


def _run_shim(attempt_dir: str, stdout_fd: int, stderr_fd: int, go: int) -> None:
    """In the forked child: becomes the shim of attempt_dir, as a fresh `python -m ...taskrunner DIR` would be."""
    code = 1
    try:
        if os.read(go, 2) != b"go":
            os._exit(code)
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((devnull, 0), (stdout_fd, 1), (stderr_fd, 2)):
            os.dup2(fd, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the launcher's socket and pipes are not the shim's
        with open("/proc/self/comm", "w") as comm:  # what ps and top show: its command line is the launcher's
            comm.write(SHIM_NAME)
        from tfcluster.daemon.agent.shim.runner import Runner
        code = Runner(Path(attempt_dir)).run()
    except BaseException:  # whatever happens, this child never returns into the launcher's loop
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


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
    (symbols bound on first call, the type and decoder caches, the subprocess module's first start) is then set
    up in the pages every shim shares with the launcher, not copied and done again in each of them (0.3 ms of a
    shim's 3.8 ms of CPU, measured). A warm-up that fails costs nothing but that."""
    import tempfile

    from tfcluster.daemon.agent.shim.runner import Runner
    from tfcluster.daemon.agent.shim.taskfiles import LaunchFile
    from tfcluster.model import Attempt

    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    saved_stdout = os.dup(1)
    try:
        with tempfile.TemporaryDirectory(prefix="tfcluster-launcher-") as scratch, \
                open(os.devnull, "w") as devnull:
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


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m tfcluster.daemon.agent.tasks.launcher SOCKET_FD", file=sys.stderr)
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
