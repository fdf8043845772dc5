"""The files an environment names are read from regular files inside the workdir only: never through a link,
never from a FIFO (which would hold the read), a device or a kernel filesystem, and never more than 1 MiB. Here
in the test's own process, as an agent that is not root reads them; tests/integration/test_environment_attacks.py
reads them as jobs' users."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tfcluster.daemon.agent.code.request_files import (MAX_BYTES, RequestFileProblem, _parse_answer, filesystem_type,
                                                 read_files, read_inside)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "secret.txt").write_text("root only\n")
    work = tmp_path / "work"
    (work / "reqs").mkdir(parents=True)
    (work / "requirements.txt").write_text("tinypkg\n")
    (work / "reqs" / "train.txt").write_text("numpy\n")
    return work


def test_regular_files_inside_the_workdir_are_read(work: Path):
    assert read_files(str(work), [("requirements.txt", False), ("./reqs//train.txt", False),
                                  ("uv.lock", True), ("nowhere/uv.lock", True)]) == [b"tinypkg\n", b"numpy\n",
                                                                                     None, None]


@pytest.mark.parametrize("make, name, why", [
    (lambda w: (w / "link.txt").symlink_to(w.parent / "secret.txt"), "link.txt",
     "link.txt: is a symbolic link (links are not followed), not a regular file"),
    (lambda w: (w / "up").symlink_to(w.parent), "up/secret.txt",
     "up/secret.txt: up: is a symbolic link (links are not followed), not a directory"),
    (lambda w: (w / "reqs" / "in").symlink_to("/etc"), "reqs/in/shadow",
     "reqs/in/shadow: reqs/in: is a symbolic link (links are not followed), not a directory"),
    (lambda w: os.mkfifo(w / "fifo"), "fifo", "fifo: is a FIFO, not a regular file"),
    (lambda w: None, "reqs", "reqs: is a directory, not a regular file"),
    (lambda w: None, "requirements.txt/x", "requirements.txt/x: requirements.txt: is a file, not a directory"),
    (lambda w: None, "missing.txt", "missing.txt: No such file or directory"),
    (lambda w: None, "../secret.txt", "../secret.txt: leaves the workdir"),
    (lambda w: None, "/etc/passwd", "/etc/passwd: leaves the workdir"),
    (lambda w: None, ".", "'.': names no file in the workdir"),
    (lambda w: (w / "big.txt").write_bytes(b"x" * (MAX_BYTES + 1)), "big.txt", "big.txt: larger than 1 MiB"),
])
@pytest.mark.timeout(10)  # a FIFO opened for reading without a writer would wait here for ever
def test_anything_but_a_regular_file_inside_the_workdir_is_refused(work: Path, make, name, why):
    make(work)
    with pytest.raises(RequestFileProblem) as refused:
        read_inside(str(work), name)
    assert str(refused.value).startswith(why)


def test_a_socket_is_refused(tmp_path: Path):
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(tmp_path / "sock"))
        with pytest.raises(RequestFileProblem, match="sock: is a socket, not a regular file"):
            read_inside(str(tmp_path), "sock")


def test_a_device_is_never_opened():
    with pytest.raises(RequestFileProblem, match="zero: is a character device, not a regular file"):
        read_inside("/dev", "zero")


@pytest.mark.parametrize("workdir, name, why", [
    ("/proc/self", "environ", "environ: is on proc, a kernel filesystem, not a file of the job's"),
    ("/proc", "self/environ", "self/environ: self: is a symbolic link"),
    ("/sys/kernel", "mm/transparent_hugepage/enabled", "is on sysfs, a kernel filesystem"),
])
def test_kernel_files_are_refused(workdir, name, why):
    if not os.path.exists(os.path.join(workdir, name)):
        pytest.skip(f"{workdir}/{name} is not on this machine")
    with pytest.raises(RequestFileProblem, match=why):
        read_inside(workdir, name)


def test_the_filesystem_of_a_file_is_found_in_the_mount_table():
    assert filesystem_type(os.stat("/proc/self/status").st_dev) == "proc"
    assert filesystem_type(os.makedev(4095, 1048575)) == ""


def test_the_readers_answer_is_taken_only_whole():
    assert _parse_answer(b"3\nabc-\n0\n", 3) == [b"abc", None, b""]
    for broken, count in ((b"", 1), (b"3\nab", 1), (b"3\nabcd", 1), (b"x\nabc", 1), (b"-\n", 2),
                          (b"3\nabc-\n0\nextra", 3)):
        assert _parse_answer(broken, count) is None
