"""The agent's side of its task launcher (launcher_process.py), which starts task shims by forking a process that
has the shim's code imported already.

A shim started as a fresh interpreter spends about 100 ms of CPU importing before it runs the task; forked
from the launcher it starts in about a millisecond. The launcher is a small single-threaded process the agent
starts (the agent has threads, so it never forks itself). It is the agent's helper, nothing more:

- Each request (on a socket pair with the agent) carries an attempt dir, whether its task runs with no new
  privileges, and the two descriptors the shim's stdout and stderr go to. The launcher hands it to a shim it
  forked before that is free again, or forks; the child leaves the launcher behind (a session of its own, the
  agent's descriptors as 0-2, nothing else open but its channel to the launcher, default signal handling) and
  runs the shim exactly as `python -m tfcluster.daemon.agent.shim.runner DIR` would (forked_shim.py). The
  launcher answers with the shim's pid and a pidfd of it, opened before the launcher can reap it.
- The attempt has ended when the shim prints forked_shim.DONE_LINE, or its stdout ends (it exited). Once the
  agent has recorded the end, it closes that stdout (ForkedShim.release), and the shim may run another attempt.
- The launcher reaps its children as they exit. It ends when the agent's end of the socket closes (the agent
  exited or died); the shims live on, as a shim whose agent died always has, and a new agent adopts them.
- An agent whose launcher died starts another one, and spawns shims itself when none will start (Launcher).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from tfcluster.daemon.agent.tasks.forked_shim import DONE_LINE, encode
from tfcluster.daemon.agent.tasks.launcher_process import MAX_REPLY_BYTES

log = logging.getLogger("tfcluster.agent")

# A launcher this slow to answer is stuck: the agent kills it (a shim it forked and did not answer for never
# runs) and starts another one.
ANSWER_TIMEOUT_SECONDS = 10.0


# ---- the agent's side ------------------------------------------------------------------------------

class ForkedShim:
    """A shim the launcher forked (or one it forked before, free again): what the supervisor needs of it, as of a
    subprocess.Popen (pid, stdout, wait), though it is not the agent's child. The attempt has ended when the shim
    says so on its stdout (it may run another one once released) or its stdout ends (it exited)."""

    def __init__(self, pid: int, pidfd: int, stdout: IO[bytes]):
        self.pid = pid
        self.stdout = stdout
        os.close(pidfd)  # the end of its stdout says it is gone: nothing else holds that pipe's writing end

    def wait(self) -> None:
        for line in self.stdout:
            if line.rstrip() == DONE_LINE:
                return

    def release(self) -> None:
        """The attempt's end is recorded (no stop for it can reach this pid any more: supervisor.py): the shim
        may run another attempt. It waits for this end of its output to close."""
        self.stdout.close()


def said_more(stdout: IO[bytes], timeout: float) -> bool:
    """Whether a shim whose RUNNING line was read writes more within the timeout (only its attempt's end comes
    next): read into the buffer along with that line already, or in the pipe."""
    os.set_blocking(stdout.fileno(), False)  # a peek at an empty buffer reads the pipe: it must not wait
    try:
        if stdout.peek(1):
            return True
    finally:
        os.set_blocking(stdout.fileno(), True)
    return bool(select.select([stdout], [], [], timeout)[0])


class Launcher:
    """The agent's handle on its launcher process: started on first use, started again when it died."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.process: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.unavailable = ""  # why no launcher can ever serve on this system ("": one can)

    def spawn(self, attempt_dir: Path, stderr_fd: int, no_new_privileges: bool = False) -> ForkedShim:
        """A shim for attempt_dir, its stderr to stderr_fd; no_new_privileges: its task runs with none (under a
        user of its own), and a shim that set that for good may run it. Raises OSError when no launcher serves
        (the caller then starts the shim itself)."""
        request = encode(attempt_dir, no_new_privileges)
        with self.lock:
            if self.unavailable:
                raise OSError(self.unavailable)
            try:
                return self._spawn(request, stderr_fd)
            except OSError as e:  # it died (or was never started): once more with a new one
                if self.process is not None:
                    log.warning("the task launcher is gone (%s); starting another", e)
                self._stop()
            return self._spawn(request, stderr_fd)

    def _spawn(self, request: bytes, stderr_fd: int) -> ForkedShim:
        if self.sock is None:
            self._start()
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            socket.send_fds(self.sock, [request], [write_end, stderr_fd])
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
            self.process = subprocess.Popen([sys.executable, "-m", "tfcluster.daemon.agent.tasks.launcher_process",
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
