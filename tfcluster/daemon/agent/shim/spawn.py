"""How the shim (shim/runner.py) starts its task: os.posix_spawn, which glibc carries out with vfork and exec.

Not subprocess.Popen: in a shim forked from the agent's launcher, every page of memory it shares with the
launcher is copied on the shim's first write to it, and Popen's setup in Python wrote to about 180 of them:
0.7 ms of a tiny task's CPU in its shim against 0.2 ms for posix_spawn (measured in a forked child). Its
module also brings threading, whose at-fork hook runs in every shim the launcher forks. What Popen did for the
shim is done here the same way:

- the program is looked for along the PATH of the task's own environment (a name with a slash is taken as
  it is), each place tried in turn, and the first error other than "not there" is the one reported, with the
  program's name as the file (as Popen reports an exec that failed);
- the working directory is entered by the shim itself before the spawn, the task user's IDs already in place
  (isolation.starting_as), and left again afterwards (keeping_cwd);
- the task gets a session of its own, /dev/null as stdin, one pipe for stdout and stderr, and SIGPIPE and
  SIGXFSZ back at their defaults (Python ignores both), and no descriptor of the shim's past 2 (Python opens
  its own close-on-exec, PEP 446; any other is closed in the child, as Popen's close_fds did).
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
from collections.abc import Mapping, Sequence
from typing import BinaryIO

RESTORED_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
NOT_THERE = (errno.ENOENT, errno.ENOTDIR)  # the exec goes on to the next place on the PATH


class TaskProcess:
    """The task started: its pid, the read end of its output, and once waited for, its returncode (negative: the
    signal that ended it, as Popen gives it) and what it used, with every descendant it reaped (wait4's: the
    task's alone, where the shim's RUSAGE_CHILDREN would add every task a reused shim ran before)."""

    def __init__(self, pid: int, stdout: BinaryIO):
        self.pid, self.stdout = pid, stdout
        self.returncode: int | None = None
        self.rusage: resource.struct_rusage | None = None

    def wait(self) -> int:
        if self.returncode is None:
            _, status, self.rusage = os.wait4(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


@contextlib.contextmanager
def keeping_cwd():
    """Within: the working directory may change (start enters the task's); it is the shim's own again after.
    Entered before the task user's IDs are taken up, which may not let the shim back in by itself."""
    saved = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield
    finally:
        os.fchdir(saved)
        os.close(saved)


def start(command: Sequence[str], workdir: str, env: Mapping[str, str]) -> TaskProcess:
    """Starts command in workdir ("": the shim's own) with env. Raises OSError (the exec's, or the working
    directory's, with the name that failed) or ValueError (a null byte, a variable's name with "=")."""
    if workdir:
        os.chdir(workdir)
    read_end, write_end = os.pipe()
    try:
        pid = _spawn_along_path(command, env, write_end)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return TaskProcess(pid, os.fdopen(read_end, "rb", buffering=0))


def _spawn_along_path(command: Sequence[str], env: Mapping[str, str], output: int) -> int:
    program = command[0]
    places = [program] if os.path.dirname(program) else [os.path.join(d, program) for d in os.get_exec_path(env)]
    actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
               (os.POSIX_SPAWN_DUP2, output, 1), (os.POSIX_SPAWN_DUP2, output, 2),
               *((os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable())]
    first: OSError | None = None
    for path in places:  # never none: a PATH that is empty is the working dir
        try:
            os.stat(path)  # most places on a PATH do not hold the program: no spawn for those
            return os.posix_spawn(path, list(command), env, file_actions=actions, setsid=True,
                                  setsigdef=RESTORED_SIGNALS)
        except OSError as e:
            if first is None and e.errno not in NOT_THERE:
                first = e
            last = e
    error = first or last
    raise OSError(error.errno, os.strerror(error.errno), program)


def _inheritable() -> list[int]:
    """The descriptors past 2 a child would inherit: none in a shim started as the agent starts them (the
    launcher closes all but 0-2 in each one it forks); any other process's may have some."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and os.get_inheritable(fd):
                found.append(fd)
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return found
