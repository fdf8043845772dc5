"""A shim's life as a child of the agent's launcher (launcher_process.py): the attempt it was forked for, then,
while each attempt ends cleanly, the next ones the launcher hands it.

Forking costs a tiny task most of its CPU: the fork, the pages the child writes to copied one by one from the
launcher, the exit that unmaps them all again (about 3 ms of the 4 ms a shim of `true` costs, measured). A shim
that ran its attempt to a clean end is the process a fresh fork would be, but for what its attempt changed, and
each of those is undone or rules the shim out:

- the task's private /tmp: the shim enters the mount namespace it came from again (Runner.leave_private_tmp);
- its working dir: the shim enters its own again;
- "no new privileges", which cannot be undone: the launcher gives such a shim only tasks that set it too;
- the task's cgroup, which the shim steps into to start the task: what the shim allocated meanwhile stays charged
  there and would keep the cgroup, removed at the task's end, alive in the kernel; such a shim ends with its task;
- threads (the watch of a task that ran past a tenth of a second, a stop's escalation): a shim that ever started
  one serves no other attempt (its threads' state is not this attempt's alone);
- its signal handlers and descriptors: set again for each attempt.

The agent, not the shim, says when an attempt is over for good: the shim writes its status, prints DONE_LINE and
waits until the agent has closed its end of the attempt's output pipe, which the agent does once it has recorded
the attempt's end; a stop the agent sends for that attempt can then no longer reach the shim while it runs
another (supervisor.py sends signals under the lock that ends the record). Only then does the shim tell the
launcher it is free. A shim whose agent or launcher is gone serves no other attempt.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import traceback
from pathlib import Path

from tfcluster.daemon.agent.shim import threads

DONE_LINE = b'{"done": true}'  # the attempt's end is recorded: the agent may collect it (and then release the shim)
SHIM_NAME = "tfcluster-shim"
CHANNEL_FD = 3  # the shim's end of its channel to the launcher: the first descriptor past stdin, stdout, stderr
ATTEMPT_FDS = 3  # with each attempt: its shim's stdout, its shim's stderr, the read end of the launcher's "go"
MAX_REQUEST_BYTES = 64 << 10  # an attempt dir's path, and what the agent adds to it
MAX_ATTEMPTS = 500  # then it ends, and a fresh one is forked: whatever an attempt leaves behind stays bounded
RELEASE_SECONDS = 60.0  # an agent that has not collected the attempt by then is not waited for: the shim ends


class Request:
    """An attempt to run: its dir, the descriptors that go with it, and whether its task runs with no new
    privileges (a task under a user of its own does)."""

    def __init__(self, message: bytes, fds: list[int]):
        self.message = message  # as it came: what the launcher hands a free shim
        attempt_dir, _, flags = message.partition(b"\0")
        self.attempt_dir = os.fsdecode(attempt_dir)
        self.no_new_privileges = flags == b"1"
        self.fds = fds

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class NoGo(Exception):
    """The launcher never said "go" (it could not tell the agent of this shim, which would start another one for
    the attempt): the shim must not run it."""


def encode(attempt_dir: Path, no_new_privileges: bool) -> bytes:
    """The agent's request to the launcher, as Request reads it."""
    return os.fsencode(attempt_dir) + b"\0" + (b"1" if no_new_privileges else b"0")


def run_shims(request: Request, channel: int) -> None:
    """In the forked child: becomes the shim of the request's attempt, as a fresh `python -m ...runner DIR` would
    be, then runs the attempts the launcher hands it while each ended cleanly. Never returns."""
    code = 1
    try:
        _leave_launcher(request, channel)
        home = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        no_new_privileges = False
        with socket.socket(fileno=CHANNEL_FD) as launcher:
            for served in range(1, MAX_ATTEMPTS + 1):
                no_new_privileges = no_new_privileges or request.no_new_privileges
                if not _run_attempt(request, home, last=served == MAX_ATTEMPTS):
                    break
                request = _next_request(launcher, no_new_privileges)
                if request is None:
                    break
        code = 0
    except NoGo:
        code = 1  # it ran nothing: the agent never heard of it
    except BaseException:  # whatever happens, this child never returns into the launcher's loop
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _leave_launcher(request: Request, channel: int) -> None:
    """What the fork took along of the launcher goes: its wakeup fd and handlers, its session, its descriptors
    (all but 0-2 and the channel, which becomes CHANNEL_FD), its name in ps and top."""
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGCHLD, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)
    os.setsid()
    _redirect(os.devnull, 0)
    stdout, stderr, go = request.fds
    if CHANNEL_FD in (stdout, stderr, go):  # moved out of the channel's way first
        request.fds = [os.dup(fd) for fd in request.fds]
    if channel != CHANNEL_FD:
        os.dup2(channel, CHANNEL_FD, inheritable=False)
    # The launcher's socket, pipes and the other shims' channels are not this one's.
    keep = sorted({0, 1, 2, CHANNEL_FD, *request.fds})
    for low, high in zip(keep, [*keep[1:], os.sysconf("SC_OPEN_MAX")]):
        os.closerange(low + 1, high)
    with open("/proc/self/comm", "w") as comm:  # what ps and top show: its command line is the launcher's
        comm.write(SHIM_NAME)


def _run_attempt(request: Request, home: int, last: bool) -> bool:
    """Runs the attempt once the launcher said "go"; True when it ended cleanly and the agent has collected it,
    so the shim may run another one."""
    from tfcluster.daemon.agent.shim.runner import Runner

    stdout, stderr, go = request.fds
    try:
        if os.read(go, 2) != b"go":
            raise NoGo()
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
    finally:
        request.close()
    threading_before = "threading" in sys.modules  # imported at startup by the interpreter's site hooks, if at all
    runner = Runner(Path(request.attempt_dir))
    runner.run()
    clean = runner.leave_private_tmp() and not runner.cgroup and not _ran_threads(threading_before)
    os.fchdir(home)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if last or not clean:
        return False
    try:
        sys.stdout.buffer.write(DONE_LINE + b"\n")
        sys.stdout.flush()
    except OSError:  # its agent is gone
        return False
    released = _released(RELEASE_SECONDS)
    for fd in (1, 2):
        _redirect(os.devnull, fd)  # the attempt's pipe and log are the attempt's alone
    return released


def _ran_threads(threading_before: bool) -> bool:
    """Whether the attempt started a thread: through the shim's own (shim/threads.py), or any other way as far as
    can be told: threading imported meanwhile, or a thread besides this one still alive (a fork leaves the child
    only the thread that forked)."""
    threading = sys.modules.get("threading")
    if threads.ever_started() or (threading is not None and not threading_before):
        return True
    return threading is not None and threading.active_count() > 1


def _released(timeout: float) -> bool:
    """Whether the agent closed its end of the attempt's output (fd 1) within the timeout."""
    poller = select.poll()
    poller.register(1, 0)  # only the errors: POLLERR once the reading end is closed
    return bool(poller.poll(timeout * 1000))


def _next_request(launcher: socket.socket, no_new_privileges: bool) -> Request | None:
    """Tells the launcher this shim is free (and whether it has no new privileges for good), and waits for the
    next attempt; None when the launcher ends it, or is gone."""
    try:
        launcher.send(b"free " + (b"1" if no_new_privileges else b"0"))
        message, fds, _, _ = socket.recv_fds(launcher, MAX_REQUEST_BYTES, ATTEMPT_FDS)
    except OSError:
        return None
    request = Request(message, fds)
    if not message or len(fds) != ATTEMPT_FDS:
        request.close()
        return None
    return request


def _redirect(path: str, target: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.dup2(fd, target)
    finally:
        os.close(fd)
