"""Unpacking a job's code on a node, as an attacker would try it: archives crafted member by member to leave
the tree, to unpack to far more than they weigh, or to make what no tree of code holds. Each is refused
with its reason and leaves nothing behind; what codepack packs comes back whole."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import stat
import tarfile
from pathlib import Path

import pytest

from tfcluster import codepack
from tfcluster.codechunks import CodeError
from tfcluster.codeunpack import MAX_READ
from tfcluster.daemon.agent.code.unpack import Bounds, unpack

NAME = "sha256:ab12cd34ef56..."


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", linkname: str = "",
           mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.size = kind, linkname, mode, len(data)
    return info, data


def craft(path: Path, *members: tuple[tarfile.TarInfo, bytes], raw: bytes = b"") -> Path:
    """A gzip'd tar of the members as given, in that order (raw: header blocks written by hand, first)."""
    body = io.BytesIO()
    body.write(raw)
    with tarfile.open(fileobj=body, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    path.write_bytes(gzip.compress(body.getvalue()))
    return path


def gnu_sparse(name: str, full_size: int, data: bytes) -> bytes:
    """An old-style GNU sparse member: `data` at its start, the rest of `full_size` a hole (a few blocks in
    the archive, whatever full_size says)."""
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode = tarfile.GNUTYPE_SPARSE, len(data), 0o644
    block = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    block[386:410] = tarfile.itn(0, 12, tarfile.GNU_FORMAT) + tarfile.itn(len(data), 12, tarfile.GNU_FORMAT)
    block[483:495] = tarfile.itn(full_size, 12, tarfile.GNU_FORMAT)
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block[:tarfile.BLOCKSIZE])
    return bytes(block) + data + bytes(-len(data) % tarfile.BLOCKSIZE)


@pytest.fixture
def cache(tmp_path) -> Path:
    """Where trees are unpacked (the node's code cache): every refusal must leave it empty."""
    (tmp_path / "cache").mkdir()
    return tmp_path / "cache"


def refused(archive: Path, cache: Path, reason: str, bounds: Bounds = Bounds()) -> str:
    with pytest.raises(CodeError) as refusal:
        unpack(archive, cache / "tree", NAME, bounds)
    message = str(refusal.value)
    assert message.startswith(f"{NAME}: ") and reason in message, message
    assert list(cache.iterdir()) == [], "nothing of a refused archive is left"
    return message


# ---- what comes back --------------------------------------------------------------------------------

def test_a_tree_packed_by_codepack_comes_back_whole(tmp_path, cache):
    work = tmp_path / "work"
    (work / "pkg" / "data").mkdir(parents=True)
    (work / "empty").mkdir()
    (work / "train.py").write_text("print('trained')\n")
    (work / "run.sh").write_text("#!/bin/sh\n")
    (work / "run.sh").chmod(0o750)
    (work / "pkg" / "data" / "weights.bin").write_bytes(os.urandom(300_000))
    (work / "pkg" / "data" / "private.txt").write_text("kept 0600 there")
    (work / "pkg" / "data" / "private.txt").chmod(0o600)
    os.symlink("../train.py", work / "pkg" / "train.py")
    os.symlink("pkg/data", work / "data")
    os.symlink(".", work / "here")
    archive = codepack.pack(work)
    try:
        size = unpack(archive.path, cache / "tree", NAME)
    finally:
        archive.remove()
    tree = cache / "tree"
    entries = codepack.collect(work)
    assert sorted(str(p.relative_to(tree)) for p in tree.rglob("*")) == [e.path for e in entries]
    for entry in entries:
        path, found = tree / entry.path, os.lstat(tree / entry.path)
        if entry.kind == "link":
            assert stat.S_ISLNK(found.st_mode) and os.readlink(path) == entry.target
        elif entry.kind == "dir":
            assert stat.S_ISDIR(found.st_mode) and stat.S_IMODE(found.st_mode) == 0o755
        else:
            assert path.read_bytes() == (work / entry.path).read_bytes()
            assert stat.S_IMODE(found.st_mode) == (0o755 if entry.executable else 0o644)
        if os.geteuid() == 0:
            assert (found.st_uid, found.st_gid) == (0, 0)
    assert stat.S_IMODE(os.stat(tree).st_mode) == 0o755
    assert size == sum(os.lstat(p).st_size for p in tree.rglob("*") if not p.is_dir() or p.is_symlink())


def test_folders_only_implied_by_paths_are_made(tmp_path, cache):
    archive = craft(tmp_path / "a.tar.gz", member("bin/run", data=b"#!/bin/sh\n", mode=0o700),
                    member("lib", tarfile.DIRTYPE, mode=0o700), member("lib/x/y.py", data=b"y"))
    assert unpack(archive, cache / "tree", NAME) == 11
    assert stat.S_IMODE(os.stat(cache / "tree" / "bin").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(cache / "tree" / "lib").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(cache / "tree" / "bin" / "run").st_mode) == 0o755
    assert (cache / "tree" / "lib" / "x" / "y.py").read_bytes() == b"y"


# ---- more than it weighs ----------------------------------------------------------------------------

def test_a_sparse_member_counts_at_its_full_size(tmp_path, cache):
    archive = tmp_path / "sparse.tar.gz"
    archive.write_bytes(gzip.compress(gnu_sparse("data/zeros.bin", (4 << 30) + (10 << 20), b"x" * 100) +
                                      bytes(2 * tarfile.BLOCKSIZE)))
    assert archive.stat().st_size < 1000
    refused(archive, cache, "unpacks to 4.3 GB or more ('data/zeros.bin' alone is 4.3 GB), over this node's cap of "
                            "4 GiB (--max-code-unpacked-bytes)")


def test_a_real_sparse_file_packed_is_refused_past_the_cap(tmp_path, cache):
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print()\n")
    with open(work / "hole.bin", "wb") as f:
        os.truncate(f.fileno(), 48 << 20)
    archive = codepack.pack(work)
    try:
        assert archive.size < 1 << 20
        refused(archive.path, cache, "unpacks to 50.3 MB or more ('hole.bin' alone is 50.3 MB), over this node's "
                                     "cap of 32 MiB", Bounds(max_bytes=32 << 20))
    finally:
        archive.remove()


def test_too_many_members_are_refused(tmp_path, cache):
    archive = craft(tmp_path / "a.tar.gz", *(member(f"f{i}") for i in range(11)))
    refused(archive, cache, "holds more than 10 members (files, folders and links), this node's limit",
            Bounds(max_members=10))
    assert unpack(archive, cache / "tree", NAME, Bounds(max_members=11)) == 0
    shutil.rmtree(cache / "tree")
    deep = craft(tmp_path / "deep.tar.gz", member("/".join("abcdefghij") + "/f.py"))  # 10 folders, 1 file
    refused(deep, cache, "holds more than 10 members", Bounds(max_members=10))
    assert unpack(deep, cache / "tree", NAME, Bounds(max_members=11)) == 0


def test_an_archive_that_would_take_the_disk_below_its_floor_is_refused(tmp_path, cache):
    archive = craft(tmp_path / "a.tar.gz", member("weights.bin", data=bytes(1000)))
    free = shutil.disk_usage(cache).free
    message = refused(archive, cache, "unpacks to 1.0 kB, but this node's disk has",
                      Bounds(min_free_bytes=free + (1 << 30)))
    assert message.endswith(" free (--min-free-disk)")


def test_a_header_that_says_it_is_huge_is_refused_unread(tmp_path, cache):
    record = b" comment=" + b"x" * (2 * MAX_READ) + b"\n"
    record = b"%d%s" % (len(record) + 7, record)
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, len(record)
    raw = info.tobuf(tarfile.USTAR_FORMAT) + record + bytes(-len(record) % tarfile.BLOCKSIZE)
    archive = craft(tmp_path / "a.tar.gz", member("train.py", data=b"x"), raw=raw)
    refused(archive, cache, f"over the {MAX_READ} bytes any header may take")


def test_a_member_claiming_a_negative_size_is_refused(tmp_path, cache):
    info = tarfile.TarInfo("minus")
    info.size = -(4 << 30)
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(gzip.compress(info.tobuf(tarfile.GNU_FORMAT) + bytes(2 * tarfile.BLOCKSIZE)))
    refused(archive, cache, f"'minus' says it holds {-(4 << 30)} bytes")


# ---- what no tree of code holds ---------------------------------------------------------------------

@pytest.mark.parametrize("kind, said", [(tarfile.LNKTYPE, "a hard link"), (tarfile.CHRTYPE, "a character device"),
                                        (tarfile.BLKTYPE, "a block device"), (tarfile.FIFOTYPE, "a FIFO"),
                                        (b"Z", "a member of type b'Z'")])
def test_members_of_other_kinds_are_refused_by_name(tmp_path, cache, kind, said):
    archive = craft(tmp_path / "a.tar.gz", member("train.py", data=b"x"),
                    member("odd", kind, linkname="train.py" if kind == tarfile.LNKTYPE else ""))
    refused(archive, cache, f"'odd' is {said}; an archive of code holds only files, folders and symbolic links")


@pytest.mark.parametrize("name", ["../x", "/etc/x", "a/../../x", "a/..", "./x", "a//b", ".", "a" * 120 + "\0b"])
def test_paths_that_are_not_plain_relative_ones_are_refused(tmp_path, cache, name):
    archive = craft(tmp_path / "a.tar.gz", member("train.py", data=b"x"), member(name, data=b"x"))
    refused(archive, cache, f"a member is named {name!r}; each must be a relative, normalised path")
    assert not (tmp_path / "x").exists() and not Path("/etc/x").exists()


@pytest.mark.parametrize("name, target", [("l", "../outside"), ("l", "/etc/passwd"), ("d/l", "../../x"),
                                          ("l", "")])
def test_a_link_leaving_the_tree_as_written_is_refused(tmp_path, cache, name, target):
    archive = craft(tmp_path / "a.tar.gz", member(name, tarfile.SYMTYPE, linkname=target))
    refused(archive, cache, f"{name!r} is a symbolic link to {target!r}, outside the tree")


def test_links_that_leave_the_tree_only_together_are_refused(tmp_path, cache):
    # Each stays inside as written; resolved, m is l/.. with l the tree itself: the tree's parent.
    archive = craft(tmp_path / "a.tar.gz", member("l", tarfile.SYMTYPE, linkname="."),
                    member("m", tarfile.SYMTYPE, linkname="l/.."), member("train.py", data=b"x"))
    refused(archive, cache, "the symbolic link 'm' -> 'l/..' leads outside the tree through the archive's other "
                            "links")


def test_a_member_below_a_link_or_a_file_is_refused(tmp_path, cache):
    outside = tmp_path / "outside"
    outside.mkdir()
    archive = craft(tmp_path / "a.tar.gz", member("d", tarfile.DIRTYPE), member("l", tarfile.SYMTYPE, linkname="d"),
                    member("l/x", data=b"written through the link"))
    refused(archive, cache, "'l/x' lies below 'l', which is a symbolic link; only folders may hold members")
    archive = craft(tmp_path / "b.tar.gz", member("f", data=b"x"), member("f/x", data=b"y"))
    refused(archive, cache, "'f/x' lies below 'f', which is a file")
    assert list(outside.iterdir()) == []


def test_a_member_named_twice_is_refused(tmp_path, cache):
    archive = craft(tmp_path / "a.tar.gz", member("train.py", data=b"good"), member("train.py", data=b"evil"))
    refused(archive, cache, "'train.py' appears twice in the archive")


def test_what_is_not_a_gzipd_tar_is_refused(tmp_path, cache):
    (tmp_path / "junk").write_bytes(os.urandom(2000))
    refused(tmp_path / "junk", cache, "not a gzip'd tar archive that can be read")
    whole = craft(tmp_path / "a.tar.gz", member("a", data=os.urandom(100_000)), member("b", data=b"x")).read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(whole[:len(whole) // 2])
    refused(tmp_path / "cut.tar.gz", cache, "not a gzip'd tar archive that can be read")
