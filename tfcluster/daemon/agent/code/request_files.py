"""Reads the files a job's [environment] names (its requirements file, or its project's pyproject.toml and uv.lock)
from the job's workdir with no more rights than the job's own task has.

The agent is root and the job chooses both the workdir (any path, with shared_workdir) and the names in it, so
the agent never opens them itself: it runs this module as a short child process that drops to the task's uid,
gid and groups before it starts (subprocess's user/group/extra_groups), so /etc/shadow, the node's key or
another job's files are as closed to the read as they are to the task. An agent that is not root cannot switch
users and reads in its own process, with the same rules:

- the name stays inside the workdir (relative, no `..`), and no part of it is a symbolic link (each dir is
  opened with O_NOFOLLOW from the one before);
- the file is looked at (O_PATH) before it is opened: only a regular file is opened, so a FIFO cannot make
  the read wait and a device is never opened; it is opened O_NOFOLLOW|O_NONBLOCK and must still be the file
  looked at;
- a file on a kernel filesystem (/proc, /sys...) is refused: its contents are made up when read, and may be
  the reader's own secrets (/proc/self/environ);
- at most MAX_BYTES are read, and the bytes read must be the file's size.

The child runs this module's own source (`python -I -S -c SOURCE WORKDIR +NAME|?NAME...`, `?` for a file that
may be missing), so it needs no read access to where tfcluster is installed; it imports only what Python loads
as it starts anyway, and a read costs a start about 20 ms (bench/environments.py). It answers on stdout, for each
name, its length in decimal, a newline and its bytes, or `-` and a newline for a missing optional file; or `!`
and why it read nothing.
"""

from __future__ import annotations

import errno
import os
import stat
import sys

MAX_BYTES = 1 << 20
# Filesystems whose files the kernel makes up when they are read: none of them holds a file a job wrote.
KERNEL_FILESYSTEMS = frozenset({
    "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs",
    "bpf", "efivarfs", "pstore", "fusectl", "mqueue", "binfmt_misc", "autofs", "nsfs", "rpc_pipefs", "hugetlbfs",
})
_KINDS = ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISLNK, "a symbolic link (links are not followed)"))
READ_TIMEOUT = 30.0  # a hung network filesystem fails the start instead of holding it
# O_PATH: a dir the task may pass through but not list (0711) serves, as it does the task, and nothing is opened
# for reading but the file itself.
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


class RequestFileProblem(Exception):
    """A file the environment names that cannot be read; the message names it and says why."""


def read_files(workdir: str, files: list[tuple[str, bool]]) -> list[bytes | None]:
    """The contents of each (name, optional) in the workdir; None for an optional file that does not exist."""
    return [read_inside(workdir, name, optional) for name, optional in files]


def read_as(workdir: str, files: list[tuple[str, bool]], uid: int, gid: int, groups: tuple[int, ...] = (),
            timeout: float = READ_TIMEOUT) -> list[bytes | None]:
    """read_files in a child process that runs as uid:gid with exactly these supplementary groups (none: root's
    are dropped too). The agent's own IDs never change: its other threads go on as root meanwhile."""
    import subprocess  # here, not above: the reader itself starts quicker without it

    names = ", ".join(name for name, _ in files)
    with open(__file__, encoding="utf-8") as f:
        source = f.read()
    command = [sys.executable, "-I", "-S", "-B", "-c", source, workdir,
               *(("?" if optional else "+") + name for name, optional in files)]
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, env={}, cwd="/", user=uid,
                              group=gid, extra_groups=list(groups), timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise RequestFileProblem(f"{names}: reading it as uid {uid} took more than {timeout:g} s") from None
    except (OSError, ValueError) as e:
        raise RequestFileProblem(f"{names}: cannot start a reader as uid {uid}: {e}") from None
    if done.stdout.startswith(b"!"):
        raise RequestFileProblem(done.stdout[1:].decode(errors="replace"))
    contents = _parse_answer(done.stdout, len(files))
    if contents is None:
        why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise RequestFileProblem(f"{names}: the reader running as uid {uid} failed: {why[0]}")
    return contents


def _parse_answer(answer: bytes, count: int) -> list[bytes | None] | None:
    """The files in the reader's answer; None when it is not a whole answer (the reader failed)."""
    contents: list[bytes | None] = []
    at = 0
    while len(contents) < count:
        end = answer.find(b"\n", at)
        if end < 0:
            return None
        header, at = answer[at:end], end + 1
        if header == b"-":
            contents.append(None)
            continue
        if not header.isdigit() or at + int(header) > len(answer):
            return None
        contents.append(answer[at:at + int(header)])
        at += int(header)
    return contents if at == len(answer) else None


def read_inside(workdir: str, relative: str, optional: bool = False) -> bytes | None:
    """One file, by the rules above. The workdir itself is entered as the task enters it (a link to it is
    followed); below it nothing is."""
    parts = relative.split("/")
    if relative.startswith("/") or ".." in parts:
        raise RequestFileProblem(f"{relative}: leaves the workdir {workdir}")
    parts = [part for part in parts if part not in ("", ".")]
    if not parts:
        raise RequestFileProblem(f"{relative!r}: names no file in the workdir {workdir}")
    try:
        directory = os.open(workdir or ".", _DIR_FLAGS)
    except OSError as e:
        raise RequestFileProblem(f"{relative}: cannot enter the workdir {workdir}: {_why(e)}") from None
    try:
        for depth, part in enumerate(parts[:-1], 1):
            try:
                below = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=directory)
            except OSError as e:
                if optional and e.errno == errno.ENOENT:
                    return None
                raise RequestFileProblem(f"{relative}: {'/'.join(parts[:depth])}: {_why(e, directory, part)}") \
                    from None
            os.close(directory)
            directory = below
        return _read_regular(directory, parts[-1], relative, optional)
    finally:
        os.close(directory)


def _read_regular(directory: int, name: str, relative: str, optional: bool) -> bytes | None:
    try:
        looked = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    except OSError as e:
        if optional and e.errno == errno.ENOENT:
            return None
        raise RequestFileProblem(f"{relative}: {_why(e)}") from None
    try:
        found = os.fstat(looked)
    finally:
        os.close(looked)
    if not stat.S_ISREG(found.st_mode):
        raise RequestFileProblem(f"{relative}: is {_kind(found.st_mode)}, not a regular file")
    filesystem = filesystem_type(found.st_dev)
    if filesystem in KERNEL_FILESYSTEMS:
        raise RequestFileProblem(f"{relative}: is on {filesystem}, a kernel filesystem, not a file of the job's")
    if found.st_size > MAX_BYTES:
        raise RequestFileProblem(f"{relative}: larger than {MAX_BYTES >> 20} MiB")
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=directory)
    except OSError as e:
        raise RequestFileProblem(f"{relative}: {_why(e)}") from None
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (found.st_dev, found.st_ino):
            raise RequestFileProblem(f"{relative}: was replaced while it was read")
        content = _read_at_most(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(content) > MAX_BYTES:
        raise RequestFileProblem(f"{relative}: larger than {MAX_BYTES >> 20} MiB")
    if len(content) != opened.st_size:
        raise RequestFileProblem(f"{relative}: reading it gave {len(content)} bytes where its size says "
                                 f"{opened.st_size}: not a file at rest (a kernel file, or one being written)")
    return content


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def filesystem_type(device: int) -> str:
    """The type of the filesystem mounted from device, from this process's mount table ("": not found there,
    as for a btrfs subvolume, whose files carry a device of their own)."""
    wanted = f"{os.major(device)}:{os.minor(device)}"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) > 2 and fields[2] == wanted and "-" in fields[3:]:
                    return fields[fields.index("-", 3) + 1]
    except OSError:
        pass
    return ""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "of an unknown kind")


def _why(error: OSError, directory: int = -1, name: str = "") -> str:
    """The reason an open failed, in words; a link where a directory was expected says so (Linux answers
    ELOOP or ENOTDIR for it)."""
    if error.errno in (errno.ELOOP, errno.ENOTDIR) and directory >= 0:
        try:
            return f"is {_kind(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)}, not a directory"
        except OSError:
            pass
    if error.errno == errno.ELOOP:
        return "is a symbolic link (files are read without following links)"
    return error.strerror or str(error)


def main(argv: list[str]) -> int:
    """The reader: argv is [program, workdir, +name or ?name...]; the answer goes to stdout (see above)."""
    try:
        contents = read_files(argv[1], [(name[1:], name.startswith("?")) for name in argv[2:]])
    except RequestFileProblem as e:
        sys.stdout.buffer.write(b"!" + str(e).encode(errors="replace"))
        return 0
    for content in contents:
        sys.stdout.buffer.write(b"-\n" if content is None else b"%d\n%s" % (len(content), content))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
