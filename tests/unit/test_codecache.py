"""The node's code cache: one fetch per archive, modes tasks can read, an LRU cap that spares pinned entries,
entries kept across a restart, archives past the node's bounds refused and removed, no entry made of a fetch
that failed in any way; and the per-attempt working directories over it."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import stat
import tarfile
import threading
import time
from pathlib import Path

import pytest

from tfcluster.api.v1 import types_pb2
from tfcluster.codechunks import CodeError, read_chunks, write_chunks
from tfcluster.daemon.agent.code import cache as codecache
from tfcluster.daemon.agent.code.cache import CodeCache
from tfcluster.daemon.agent.code.unpack import Bounds
from tfcluster.daemon.agent.code.workspace import Workspaces, is_mount


def make_archive(directory: Path, files: dict[str, bytes], executable: tuple[str, ...] = ()) -> tuple[str, Path]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name in executable else 0o600
            tar.addfile(info, io.BytesIO(data))
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    path = directory / f"{digest}.tar.gz"
    path.write_bytes(buffer.getvalue())
    return digest, path


class Origin:
    """Archives a fetch copies from, counting the fetches; `delay` holds each fetch up."""

    def __init__(self, directory: Path, delay: float = 0.0):
        self.directory, self.delay, self.fetched, self.fail = directory, delay, [], ""

    def __call__(self, hex_digest: str, job_id: str, sources: tuple[str, ...], dest: Path) -> None:
        time.sleep(self.delay)
        if self.fail:
            raise CodeError(self.fail)
        self.fetched.append(hex_digest)
        write_chunks(read_chunks(self.directory / f"{hex_digest}.tar.gz", hex_digest), dest, hex_digest)


@pytest.fixture
def origin(tmp_path):
    (tmp_path / "origin").mkdir()
    return Origin(tmp_path / "origin")


def test_an_archive_is_fetched_once_and_unpacked_for_every_uid_to_read(tmp_path, origin):
    digest, _ = make_archive(origin.directory, {"train.py": b"print(1)\n", "bin/run": b"#!/bin/sh\n"}, ("bin/run",))
    cache = CodeCache(tmp_path / "cache", 1 << 30, origin)
    tree = cache.acquire(digest, "job-1", (), "attempt-a")
    assert cache.acquire(digest, "job-2", (), "attempt-b") == tree
    assert origin.fetched == [digest] and cache.fetches == 1
    assert (tree / "train.py").read_bytes() == b"print(1)\n"
    assert stat.S_IMODE(os.stat(tree / "train.py").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tree / "bin/run").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(tree / "bin").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(tmp_path / "cache").st_mode) == 0o700, "tasks reach their own code elsewhere"


def test_an_empty_tree_unpacks_to_an_empty_directory(tmp_path, origin):
    digest, _ = make_archive(origin.directory, {})
    tree = CodeCache(tmp_path / "cache", 1 << 30, origin).acquire(digest, "job-1", (), "attempt-a")
    assert tree.is_dir() and list(tree.iterdir()) == []


def test_launches_of_one_archive_at_once_wait_for_one_fetch(tmp_path, origin):
    digest, _ = make_archive(origin.directory, {"a": b"x" * 1000})
    origin.delay = 0.3
    cache = CodeCache(tmp_path / "cache", 1 << 30, origin)
    trees = []
    threads = [threading.Thread(target=lambda i=i: trees.append(cache.acquire(digest, "job", (), f"p{i}")))
               for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(trees) == 6 and len(set(trees)) == 1 and origin.fetched == [digest]


def test_a_failed_fetch_fails_every_waiter_and_the_next_launch_tries_again(tmp_path, origin):
    digest, _ = make_archive(origin.directory, {"a": b"1"})
    origin.fail = "the coordinator holds no code"
    cache = CodeCache(tmp_path / "cache", 1 << 30, origin)
    with pytest.raises(CodeError, match="holds no code"):
        cache.acquire(digest, "job", (), "p1")
    origin.fail = ""
    assert (cache.acquire(digest, "job", (), "p2") / "a").read_bytes() == b"1"


def test_an_archive_with_a_path_leaving_the_tree_is_refused(tmp_path, origin):
    digest, _ = make_archive(origin.directory, {"../escape": b"x"})
    cache = CodeCache(tmp_path / "cache", 1 << 30, origin)
    with pytest.raises(CodeError, match=rf"^sha256:{digest[:12]}\.\.\.: a member is named '\.\./escape'"):
        cache.acquire(digest, "job", (), "p")
    assert not (tmp_path / "escape").exists() and list((tmp_path / "cache").iterdir()) == []


def test_archives_past_the_nodes_bounds_are_refused_and_removed_with_every_waiter_told(tmp_path, origin):
    digest, _ = make_archive(origin.directory, {"weights.bin": bytes(5000)})
    origin.delay = 0.2
    cache = CodeCache(tmp_path / "cache", 1 << 30, origin, bounds=Bounds(max_bytes=4096))
    errors = []

    def launch(pin: str) -> None:
        try:
            cache.acquire(digest, "job", (), pin)
        except CodeError as e:
            errors.append(str(e))
    threads = [threading.Thread(target=launch, args=(f"p{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 3 and origin.fetched == [digest]
    assert set(errors) == {f"sha256:{digest[:12]}...: unpacks to 5.0 kB or more ('weights.bin' alone is 5.0 kB), "
                           f"over this node's cap of 4 KiB (--max-code-unpacked-bytes)"}
    assert list((tmp_path / "cache").iterdir()) == [] and not cache.holds(digest) and cache.used_bytes() == 0
    cache.bounds = Bounds(min_free_bytes=shutil.disk_usage(tmp_path).free + (1 << 30))
    with pytest.raises(CodeError, match=r"unpacks to 5\.0 kB, but this node's disk has .* \(--min-free-disk\)"):
        cache.acquire(digest, "job", (), "p")
    assert list((tmp_path / "cache").iterdir()) == []
    cache.bounds = Bounds()
    assert (cache.acquire(digest, "job", (), "p") / "weights.bin").stat().st_size == 5000


@pytest.mark.parametrize("failure", [TypeError("extractall() got an unexpected keyword argument 'filter'"),
                                     PermissionError(13, "Permission denied"), KeyboardInterrupt()])
def test_no_failure_of_any_kind_makes_an_entry_or_leaks_out_as_an_internal_error(tmp_path, origin, monkeypatch,
                                                                                  failure):
    """As on Pythons without tarfile's extraction filters, where unpacking raised TypeError and the cache then
    failed on a size it never had (UnboundLocalError) instead of saying the archive could not be had."""
    digest, _ = make_archive(origin.directory, {"a": b"1"})
    cache = CodeCache(tmp_path / "cache", 1 << 30, origin)

    def fail(*args, **kwargs):
        raise failure
    monkeypatch.setattr(codecache, "unpack", fail)
    if isinstance(failure, Exception):
        said = "the agent failed (its log says why)" if isinstance(failure, TypeError) else "Permission denied"
        with pytest.raises(CodeError, match=rf"^cannot unpack sha256:{digest[:12]}\.\.\.: {re.escape(said)}$"):
            cache.acquire(digest, "job", (), "p1")
    else:
        with pytest.raises(KeyboardInterrupt):
            cache.acquire(digest, "job", (), "p1")
    assert not cache.holds(digest) and cache.pending == {} and cache.used_bytes() == 0
    monkeypatch.undo()
    assert (cache.acquire(digest, "job", (), "p2") / "a").read_bytes() == b"1"


def test_eviction_drops_the_least_recently_used_unpinned_entries_only(tmp_path, origin):
    a, b, c = (make_archive(origin.directory, {"f": bytes([i]) * 10_000})[0] for i in range(3))
    cache = CodeCache(tmp_path / "cache", 1 << 30, origin)
    cache.acquire(a, "job-a", (), "attempt-a")       # oldest, but a live task uses it
    cache.acquire(b, "job-b", (), "attempt-b")
    cache.release("attempt-b")
    one = cache.used_bytes() // 2
    cache.max_bytes = 2 * one + one // 2            # room for two entries
    cache.acquire(c, "job-c", (), "attempt-c")
    assert cache.holds(a) and cache.holds(c) and not cache.holds(b)
    assert not (tmp_path / "cache" / b).exists() and not (tmp_path / "cache" / f"{b}.tar.gz").exists()
    cache.max_bytes = 1                              # nothing fits: only what no task uses goes
    cache.release("attempt-c")
    assert cache.holds(a) and not cache.holds(c)
    cache.release("attempt-a")
    assert not cache.holds(a) and cache.used_bytes() == 0


def test_a_restarted_agent_keeps_whole_entries_and_removes_leftovers(tmp_path, origin):
    a, b = (make_archive(origin.directory, {"f": bytes([i]) * 5000})[0] for i in range(2))
    cache = CodeCache(tmp_path / "cache", 1 << 30, origin)
    cache.acquire(a, "job", (), "p1")
    time.sleep(0.05)
    cache.acquire(b, "job", (), "p2")
    (tmp_path / "cache" / f"{'0' * 64}.part").write_bytes(b"half")
    (tmp_path / "cache" / f"{'1' * 64}.unpacking").mkdir()
    again = CodeCache(tmp_path / "cache", 1 << 30, origin)
    assert again.holds(a) and again.holds(b) and again.used_bytes() == cache.used_bytes()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([a, b, f"{a}.tar.gz", f"{b}.tar.gz"])
    again.acquire(a, "job", (), "p3")
    assert origin.fetched == [a, b]  # nothing fetched again
    assert again.pin(b, "adopted") and not again.pin("2" * 64, "adopted")
    again.max_bytes = 1
    again.release("p3")
    assert again.holds(b) and not again.holds(a)  # b pinned by the adopted task


def test_a_transfer_cut_off_goes_on_from_its_bytes_and_a_wrong_hash_is_refused(tmp_path, origin):
    digest, path = make_archive(origin.directory, {"f": os.urandom(3 << 20)})
    data = path.read_bytes()
    dest = tmp_path / "part"
    dest.write_bytes(data[:1_500_000])
    assert write_chunks(read_chunks(path, digest, 1_500_000), dest, digest) == len(data)
    assert dest.read_bytes() == data
    bad = tmp_path / "bad"
    with pytest.raises(CodeError, match="hash to"):
        write_chunks(read_chunks(path, digest), bad, "0" * 64)
    assert not bad.exists()
    with pytest.raises(CodeError, match="ended after"):
        write_chunks(iter([types_pb2.CodeChunk(size=10, offset=0, data=b"12345")]), tmp_path / "short", digest)


@pytest.mark.parametrize("agent_is_root", [True, False])
def test_the_working_directory_is_the_tasks_own_and_leaves_the_cache_as_it_was(tmp_path, origin, agent_is_root):
    if os.geteuid() != 0:
        pytest.skip("overlay mounts and giving files to another user need root")
    digest, _ = make_archive(origin.directory, {"train.py": b"x", "data/a.txt": b"a"})
    tree = CodeCache(tmp_path / "cache", 1 << 30, origin).acquire(digest, "job", (), "p")
    spaces = Workspaces(tmp_path / "probe", agent_is_root)
    attempt = tmp_path / "jobs" / "job" / "tasks" / "worker-0" / "1"
    attempt.mkdir(parents=True)
    cwd, view = spaces.make(attempt, tree, digest, 54321, 54321)
    try:
        assert is_mount(cwd) == is_mount(view) == agent_is_root and Workspaces.code_of(attempt) == digest
        tree.parent.chmod(0o700)  # the cache, root's alone: the task reaches its code all the same
        pid = os.fork()
        if pid == 0:  # as the task's user: write where the job may
            try:
                os.setgid(54321)
                os.setuid(54321)
                (cwd / "out.txt").write_text("mine")
                (cwd / "data" / "b.txt").write_text("mine too")
                assert (view / "train.py").read_bytes() == b"x" and (cwd / "data" / "a.txt").read_bytes() == b"a"
                try:
                    (view / "written.txt").write_text("no")
                    os._exit(2)
                except OSError:
                    pass
                os._exit(0)
            except BaseException:
                os._exit(1)
        assert os.waitpid(pid, 0)[1] == 0
        assert (cwd / "train.py").read_bytes() == b"x" and (cwd / "out.txt").read_text() == "mine"
        assert sorted(p.name for p in tree.rglob("*")) == ["a.txt", "data", "train.py"]
        if agent_is_root:
            assert Workspaces.unmount_stale(tmp_path / "jobs", {attempt}) == 0
            assert Workspaces.unmount_stale(tmp_path / "jobs", set()) == 1
            assert not is_mount(cwd) and not is_mount(view)
            assert (attempt / "code" / "upper" / "out.txt").read_text() == "mine"
    finally:  # a failed assertion leaves no mount behind
        spaces.release(attempt)
    shutil.rmtree(attempt)
