"""The agent's task launcher, as a process of its own (`python -m tfcluster.daemon.agent.tasks.launcher_process
FD`; the agent's side is launcher.py): forks a shim for each request on the socket it was given.

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
import traceback
from pathlib import Path

MAX_REQUEST_BYTES = 64 << 10  # an attempt dir's path
MAX_FDS = 2
MAX_REPLY_BYTES = 1024
SHIM_NAME = "tfcluster-shim"


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
