"""The coordinator's code archives: an upload is taken in order, goes on where it stopped, is kept only once
its size, sha256 and headers check out, and is removed once no kept job names it and its grace is over. Each
archive keeps who uploaded it, through a restart; one person's upload under way is theirs alone."""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile

import pytest

from tfcluster.daemon.coordinator.store.code_archives import CodeRefused, CodeStore


def archive(content: bytes, kind: bytes = tarfile.REGTYPE) -> bytes:
    """A gzip'd tar of one member: a file is what an upload must hold (random content: as large packed)."""
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size, info.type, info.linkname = len(content), kind, "" if kind == tarfile.REGTYPE else "other.py"
        tar.addfile(info, io.BytesIO(content))
    return packed.getvalue()


DATA = archive(os.urandom(2900))
SHA = "sha256:" + hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def store(tmp_path):
    now = [1000.0]
    s = CodeStore(tmp_path / "code", max_bytes=4096, clock=lambda: now[0], grace_seconds=60)
    s.now = now
    return s


def test_an_upload_cut_off_goes_on_where_it_stopped(store):
    assert store.received(SHA, len(DATA), "alice") == 0
    assert store.write(SHA, len(DATA), 0, DATA[:1000], "alice") == 1000
    assert store.received(SHA, len(DATA), "alice") == 1000
    with pytest.raises(CodeRefused, match="send the rest") as cut:
        store.finish(SHA, len(DATA), "alice")
    assert cut.value.received == 1000
    with pytest.raises(CodeRefused, match="a chunk at byte 0, but 1000 bytes of this archive are held") as again:
        store.write(SHA, len(DATA), 0, DATA[:1000], "alice")
    assert again.value.received == 1000
    assert store.write(SHA, len(DATA), 1000, DATA[1000:], "alice") == len(DATA)
    assert not store.has(SHA) and store.owners(SHA) is None
    store.finish(SHA, len(DATA), "alice")
    assert store.has(SHA) and store.path(SHA).read_bytes() == DATA
    assert store.owners(SHA) == {"alice"} and store.touch(SHA) == len(DATA)
    assert sorted(p.name for p in store.directory.iterdir()) == [f"{SHA[7:]}.owners", f"{SHA[7:]}.tar.gz"]


def test_bytes_that_do_not_hash_to_the_name_are_thrown_away(store):
    wrong = "sha256:" + "0" * 64
    store.write(wrong, len(DATA), 0, DATA, "alice")
    with pytest.raises(CodeRefused, match=f"hash to {SHA}, not {wrong}: send the archive again"):
        store.finish(wrong, len(DATA), "alice")
    assert not store.has(wrong) and list(store.directory.iterdir()) == []


def test_what_is_refused(store):
    with pytest.raises(CodeRefused, match="over this coordinator's cap of 4096 bytes"):
        store.write(SHA, 5000, 0, b"x", "alice")
    with pytest.raises(CodeRefused, match="run past the archive's size"):
        store.write(SHA, 10, 0, b"x" * 11, "alice")
    for bad in ("sha256:../../etc/passwd", "md5:abc", "sha256:" + "A" * 64):
        with pytest.raises(CodeRefused, match="expected \"sha256:\" and 64 lowercase hex digits"):
            store.received(bad, 1, "alice")
        with pytest.raises(CodeRefused, match="expected \"sha256:\" and 64 lowercase hex digits"):
            store.owners(bad)
        assert not store.has(bad)


def test_an_archive_the_nodes_would_refuse_to_unpack_is_refused_once_whole(store):
    assert store.max_unpacked_bytes == 16 * 4096  # by default
    refused = {"unpacks to 100 kB or more ('train.py' alone is 100 kB), over this coordinator's cap of 64 KiB "
               "(--max-code-unpacked-bytes)": archive(bytes(100_000)),
               "'train.py' is a hard link; an archive of code holds only files, folders and symbolic links":
                   archive(b"", tarfile.LNKTYPE),
               "not a gzip'd tar archive that can be read": os.urandom(1000)}
    for reason, data in refused.items():
        sha = "sha256:" + hashlib.sha256(data).hexdigest()
        assert len(data) < store.max_bytes
        store.write(sha, len(data), 0, data, "alice")
        with pytest.raises(CodeRefused, match="^" + re.escape(f"sha256:{sha[7:19]}...: {reason}")) as refusal:
            store.finish(sha, len(data), "alice")
        assert refusal.value.received == 0, "sent again it would be refused again"
        assert not store.has(sha) and store.received(sha, len(data), "alice") == 0
    assert list(store.directory.iterdir()) == []


def test_uploads_past_the_whole_stores_cap_are_refused_until_archives_go(store):
    store.store_bytes = 5000
    store.write(SHA, len(DATA), 0, DATA, "alice")
    store.finish(SHA, len(DATA), "alice")
    other = archive(os.urandom(2400))
    other_sha = "sha256:" + hashlib.sha256(other).hexdigest()
    with pytest.raises(CodeRefused, match=rf"holds {len(DATA)} of its 5000 bytes \(--code-store-bytes\), too few "
                                          rf"for {len(other)}"):
        store.write(other_sha, len(other), 0, other[:100], "bob")
    assert store.received(other_sha, len(other), "bob") == 0, "nothing of it kept"
    os.utime(store.path(SHA), (store.now[0] - 61, store.now[0] - 61))  # its grace is over
    assert store.sweep(in_use=set()) == [f"{SHA[7:]}.tar.gz"]
    assert store.write(other_sha, len(other), 0, other, "bob") == len(other)


def test_an_archive_stays_while_a_job_names_it_and_for_its_grace(store):
    store.write(SHA, len(DATA), 0, DATA, "alice")
    store.finish(SHA, len(DATA), "alice")
    for path in store.directory.iterdir():
        os.utime(path, (store.now[0], store.now[0]))
    other = "sha256:" + "1" * 64
    store.write(other, 100, 0, b"p" * 10, "bob")  # an upload left unfinished
    part = store._part(other, 100, "bob")
    os.utime(part, (store.now[0], store.now[0]))
    store.now[0] += 30
    assert store.sweep(set()) == []  # within the grace: the job that needs it may not be submitted yet
    store.now[0] += 60
    assert store.sweep({SHA}) == [part.name]
    assert store.has(SHA) and store.owners(SHA) == {"alice"}, "its owners stay while it does, however old"
    store.touch(SHA)  # a client found it here: its job comes next, the grace starts again
    store.now[0] = os.stat(store.path(SHA)).st_mtime + 30
    assert store.sweep(set()) == []
    store.now[0] += 60
    assert store.sweep(set()) == [f"{SHA[7:]}.tar.gz"] and not store.has(SHA)
    assert list(store.directory.iterdir()) == [], "its owners went with it"


def test_the_coordinator_sweeps_what_its_kept_jobs_no_longer_name(store, monkeypatch):
    import asyncio
    from types import SimpleNamespace

    from tfcluster.daemon.coordinator.rpc import code_service as codeservice

    unused = archive(b"")
    unused_sha = "sha256:" + hashlib.sha256(unused).hexdigest()
    for sha, data in ((SHA, DATA), (unused_sha, unused)):
        store.write(sha, len(data), 0, data, "alice")
        store.finish(sha, len(data), "alice")
    store.now[0] = os.stat(store.path(SHA)).st_mtime + 120  # both past their grace
    job = SimpleNamespace(spec=SimpleNamespace(code_sha256=SHA))  # an ended job that is still kept counts too
    shared = SimpleNamespace(spec=SimpleNamespace(code_sha256=""))
    coordinator = SimpleNamespace(code=store, cluster=SimpleNamespace(jobs={"a-1": job, "b-2": shared},
                                                                     sweeps=SimpleNamespace(by_id={})))
    monkeypatch.setattr(codeservice, "SWEEP_SECONDS", 0.01)

    async def sweep_once():
        sweeper = asyncio.create_task(codeservice.sweep_code(coordinator))
        await asyncio.sleep(0.2)
        sweeper.cancel()
    asyncio.run(sweep_once())
    assert store.has(SHA) and not store.has(unused_sha)


def test_each_persons_upload_is_their_own_and_a_second_uploader_of_the_same_tree_becomes_an_owner(store):
    store.write(SHA, len(DATA), 0, DATA[:1000], "alice")
    assert store.received(SHA, len(DATA), "bob") == 0, "bob learns nothing of alice's upload under way"
    store.write(SHA, len(DATA), 0, b"junk" * 10, "bob")  # nor can he spoil it
    assert store.received(SHA, len(DATA), "alice") == 1000
    store.write(SHA, len(DATA), 1000, DATA[1000:], "alice")
    store.finish(SHA, len(DATA), "alice")
    assert store.owners(SHA) == {"alice"}
    with pytest.raises(CodeRefused, match="send the rest"):
        store.finish(SHA, len(DATA), "bob")  # his 40 bytes are not the archive: he is no owner for naming it
    assert store.owners(SHA) == {"alice"}
    store._part(SHA, len(DATA), "bob").unlink()
    store.write(SHA, len(DATA), 0, DATA, "bob")  # the whole archive: bob holds the tree too
    store.finish(SHA, len(DATA), "bob")
    assert store.owners(SHA) == {"alice", "bob"} and store.path(SHA).read_bytes() == DATA
    assert sorted(p.name for p in store.directory.iterdir()) == [f"{SHA[7:]}.owners", f"{SHA[7:]}.tar.gz"]
    restarted = CodeStore(store.directory, max_bytes=4096)
    assert restarted.owners(SHA) == {"alice", "bob"}, "kept on disk beside the archive"


def test_an_archive_from_before_owners_were_recorded_keeps_its_earlier_users_when_uploaded_again(store):
    store.path(SHA).write_bytes(DATA)  # as an earlier release left it: no owners file
    assert store.has(SHA) and store.owners(SHA) is None
    store.write(SHA, len(DATA), 0, DATA, "bob")
    store.finish(SHA, len(DATA), "bob", earlier_users={"alice"})
    assert store.owners(SHA) == {"alice", "bob"}
    store.write(SHA, len(DATA), 0, DATA, "carol")
    store.finish(SHA, len(DATA), "carol", earlier_users={"dave"})  # recorded now: earlier users count no more
    assert store.owners(SHA) == {"alice", "bob", "carol"}


def test_a_damaged_owners_file_leaves_the_archive_to_admins_and_an_orphan_one_is_swept(store):
    store.write(SHA, len(DATA), 0, DATA, "alice")
    store.finish(SHA, len(DATA), "alice")
    for junk in (b"{not json", b'{"owners": "alice"}', b"[1, 2]", b'{"owners": [1]}', b" " * (2 << 20)):
        (store.directory / f"{SHA[7:]}.owners").write_bytes(junk)
        assert store.owners(SHA) == frozenset()
    orphan = store.directory / f"{'2' * 64}.owners"  # left by a crash before its archive was renamed
    orphan.write_text('{"owners": ["alice"]}')
    os.utime(store.path(SHA), (store.now[0], store.now[0]))
    os.utime(orphan, (store.now[0], store.now[0]))
    assert store.sweep({SHA}) == [], "within its grace an owners file may be an upload finishing"
    store.now[0] += 61
    assert store.sweep({SHA}) == [orphan.name] and store.has(SHA)
