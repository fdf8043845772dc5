"""The code archive: the same tree gives the same bytes, ignore files are obeyed, links may not leave the tree,
and an archive over the cap is refused with its largest files named."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile

import pytest

from tfcluster import codepack
from tfcluster.codepack import PackError


def tree(root, files: dict[str, str | bytes]):
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


def members(archive) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive.path) as tar:
        return {m.name: m for m in tar.getmembers()}


@pytest.fixture
def packed():
    made = []

    def pack(root, **kwargs):
        archive = codepack.pack(root, **kwargs)
        made.append(archive)
        return archive
    yield pack
    for archive in made:
        archive.remove()


def test_same_tree_same_hash_whatever_the_mtimes_and_the_walk_order(tmp_path, packed):
    a = tree(tmp_path / "a", {"train.py": "print(1)\n", "lib/util.py": "X = 1\n", "lib/z/deep.txt": "d"})
    (a / "run.sh").write_text("#!/bin/sh\n")
    (a / "run.sh").chmod(0o700)
    first = packed(a)
    for path in a.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))
    (a / "train.py").chmod(0o600)  # permissions beyond executable-or-not do not count
    again = packed(a)
    b = tree(tmp_path / "b", {"lib/z/deep.txt": "d", "lib/util.py": "X = 1\n", "train.py": "print(1)\n"})
    (b / "run.sh").write_text("#!/bin/sh\n")
    (b / "run.sh").chmod(0o755)
    elsewhere = packed(b)
    assert first.sha256 == again.sha256 == elsewhere.sha256
    assert first.path.read_bytes() == elsewhere.path.read_bytes()
    assert (first.files, first.tree_bytes) == (4, len("print(1)\n") + len("X = 1\n") + 1 + len("#!/bin/sh\n"))
    names = members(first)
    assert list(names) == sorted(names)
    assert names["run.sh"].mode == 0o755 and names["train.py"].mode == 0o644
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in names.values()} == {(0, 0, 0, "", "")}
    (a / "train.py").write_text("print(2)\n")
    assert packed(a).sha256 != first.sha256


def test_git_and_ignored_files_are_left_out_with_nested_rules(tmp_path, packed):
    root = tree(tmp_path / "w", {
        ".git/HEAD": "ref", ".gitignore": "*.bin\n!keep.bin\nbuild/\n", ".tfclusterignore": "data/\n",
        "train.py": "", "big.bin": "x" * 1000, "keep.bin": "k", "build/out.o": "", "data/set.csv": "1",
        "sub/.gitignore": "local.txt\n!big.bin\n", "sub/local.txt": "", "sub/big.bin": "b", "sub/x.py": "",
        "other/local.txt": "kept: the rule is sub's alone"})
    names = set(members(packed(root)))
    assert names == {".gitignore", ".tfclusterignore", "train.py", "keep.bin", "sub", "sub/.gitignore",
                     "sub/big.bin", "sub/x.py", "other", "other/local.txt"}


def test_links_inside_the_tree_are_kept_and_those_leaving_it_refused_by_name(tmp_path, packed):
    outside = tree(tmp_path / "outside", {"secret": "s"})
    root = tree(tmp_path / "w", {"data/a.txt": "a", "train.py": ""})
    (root / "current").symlink_to("data/a.txt")
    (root / "data" / "again").symlink_to(root / "train.py")  # absolute, but inside: kept, made relative
    names = members(packed(root))
    assert names["current"].issym() and names["current"].linkname == "data/a.txt"
    assert names["data/again"].linkname == "../train.py"
    (root / "data" / "escape").symlink_to(outside / "secret")
    with pytest.raises(PackError, match=r"data/escape is a symbolic link to .*outside.*outside the workdir"):
        codepack.pack(root)
    (root / "data" / "escape").unlink()
    (root / "up").symlink_to("..")
    with pytest.raises(PackError, match="up is a symbolic link to .., outside the workdir"):
        codepack.pack(root)


def test_over_the_cap_names_the_largest_files(tmp_path):
    root = tree(tmp_path / "w", {"data/big.bin": os.urandom(300_000), "data/mid.bin": os.urandom(120_000),
                                 "train.py": "print()\n", **{f"f{i}.txt": os.urandom(10) for i in range(6)}})
    with pytest.raises(PackError) as refused:
        codepack.pack(root, max_bytes=256 << 10)
    message = str(refused.value)
    assert message.startswith("code: 420 kB is over the coordinator's cap of 256 KiB; "
                              "largest: data/big.bin 300 kB, data/mid.bin 120 kB, ")
    assert ", ..." in message and ".tfclusterignore" in message
    assert not list(tmp_path.glob("tfcluster-code-*"))


def test_the_temporary_file_goes_when_packing_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    root = tree(tmp_path / "w", {"a.bin": os.urandom(5000)})
    with pytest.raises(PackError):
        codepack.pack(root, max_bytes=1000)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_sizes_read_as_people_write_them():
    assert [codepack.human_bytes(n) for n in (900, 12_345, 1_200_000, 412_000_000, 3_000_000_000)] == \
        ["900 B", "12.3 kB", "1.2 MB", "412 MB", "3.0 GB"]
    assert [codepack.binary_bytes(n) for n in (256 << 20, 1 << 30, 1000)] == ["256 MiB", "1 GiB", "1.0 kB"]


def test_a_workdir_that_is_not_a_folder_is_refused(tmp_path):
    with pytest.raises(PackError, match="not a folder"):
        codepack.collect(tmp_path / "missing")


def test_the_fingerprint_changes_with_the_listing_and_not_otherwise(tmp_path):
    root = tree(tmp_path / "w", {"train.py": "print(1)\n", "lib/util.py": ""})
    first = codepack.fingerprint(root, codepack.collect(root))
    assert codepack.fingerprint(root, codepack.collect(root)) == first
    os.utime(root / "train.py", ns=(1, 1))
    touched = codepack.fingerprint(root, codepack.collect(root))
    assert touched != first, "a file touched may have changed: packed again"
    twin = tree(tmp_path / "twin", {"train.py": "print(2)\n", "lib/util.py": ""})
    os.utime(twin / "train.py", ns=(1, 1))
    os.utime(twin / "lib" / "util.py", ns=(os.stat(root / "lib" / "util.py").st_mtime_ns,) * 2)
    assert codepack.fingerprint(twin, codepack.collect(twin)) != touched, "another folder is another tree"


def repository(root, files: dict[str, str | bytes]):
    """A git working tree as git leaves one on disk, made by hand (git itself need not be installed)."""
    return tree(root, {".git/HEAD": "ref: refs/heads/main\n", ".git/info/exclude": "# git ls-files --others\n",
                       **files})


def test_a_workdir_inside_a_repository_obeys_the_rules_above_it(tmp_path, packed):
    top = repository(tmp_path / "repo", {
        ".gitignore": "sub/runs/\n*.log\n/build\n", "build/x.py": "", "sub/train.py": "", "sub/x.log": "",
        "sub/runs/ckpt": "c", "sub/lib/runs/kept.py": "", "sub/build/kept.py": "", "sub/lib/deep.log": ""})
    assert set(members(packed(top / "sub"))) == {"train.py", "lib", "lib/runs", "lib/runs/kept.py", "build",
                                                  "build/kept.py"}


def test_deeper_files_decide_after_the_repositorys(tmp_path, packed):
    top = repository(tmp_path / "repo", {
        ".gitignore": "*.log\n", ".tfclusterignore": "a/b/data/\n", "a/.gitignore": "!keep.log\n",
        "a/b/.gitignore": "!own.log\n", "a/b/keep.log": "", "a/b/own.log": "", "a/b/other.log": "",
        "a/b/data/set.csv": "", "a/b/c/keep.log": "", "a/b/c/.tfclusterignore": "*.log\n"})
    assert set(members(packed(top / "a" / "b"))) == {".gitignore", "keep.log", "own.log", "c",
                                                      "c/.tfclusterignore"}


def test_the_repositorys_info_exclude_applies(tmp_path, packed):
    top = repository(tmp_path / "repo", {".git/info/exclude": "scratch/\n", "w/train.py": "", "w/scratch/a": ""})
    assert set(members(packed(top / "w"))) == {"train.py"}
    assert set(members(packed(top))) == {"w", "w/train.py"}


def test_a_git_file_points_at_the_git_dir(tmp_path, packed):
    tree(tmp_path / "super" / ".git" / "modules" / "lib", {"info/exclude": "*.tmp\n"})
    top = tree(tmp_path / "super" / "lib", {".git": "gitdir: ../.git/modules/lib\n", ".gitignore": "out/\n",
                                            "w/train.py": "", "w/a.tmp": "", "w/out/x": ""})
    assert set(members(packed(top / "w"))) == {"train.py"}
    # a worktree: its git dir names the main repository's, whose info/exclude git reads
    worktree_dir = tree(tmp_path / "main" / ".git" / "worktrees" / "wt", {"commondir": "../..\n"})
    tree(tmp_path / "main" / ".git", {"info/exclude": "*.bin\n"})
    wt = tree(tmp_path / "wt", {".git": f"gitdir: {worktree_dir}\n", "w/train.py": "", "w/w.bin": ""})
    assert set(members(packed(wt / "w"))) == {"train.py"}


def test_outside_a_repository_only_the_workdirs_own_rules_count(tmp_path, packed):
    files = {"sub/.gitignore": "*.log\n", "sub/train.py": "", "sub/x.log": "", "sub/runs/ckpt": ""}
    plain = tree(tmp_path / "plain", {".gitignore": "sub/runs/\n", **files})
    assert set(members(packed(plain / "sub"))) == {".gitignore", "train.py", "runs", "runs/ckpt"}
    inside = repository(tmp_path / "repo", {".gitignore": "sub/runs/\n", **files})
    assert set(members(packed(inside / "sub"))) == {".gitignore", "train.py"}


def test_a_workdir_the_repository_ignores_is_packed_by_its_own_rules(tmp_path, packed):
    top = repository(tmp_path / "repo", {".gitignore": "generated/\n*.log\n", "generated/job/train.py": "",
                                         "generated/job/x.log": "", "generated/job/.gitignore": "*.tmp\n",
                                         "generated/job/a.tmp": ""})
    assert set(members(packed(top / "generated" / "job"))) == {".gitignore", "train.py", "x.log"}


def test_paths_left_out_go_whatever_the_ignore_files_say(tmp_path, packed):
    root = tree(tmp_path / "w", {"train.py": "", "runs/fit/ckpt-1": "c" * 1000, "runs/other.txt": "",
                                 "summaries": "a file", ".gitignore": "!runs/\n"})
    names = set(members(packed(root, leave_out=["runs/fit", "summaries", "not/there"])))
    assert names == {".gitignore", "train.py", "runs", "runs/other.txt"}


def test_the_same_tree_and_rules_give_the_same_archive(tmp_path, packed):
    top = repository(tmp_path / "repo", {".gitignore": "sub/runs/\n*.log\n", "sub/train.py": "print()\n",
                                         "sub/x.log": "l", "sub/runs/ckpt": "c", "sub/out/m": "m"})
    first, again = packed(top / "sub", leave_out=["out"]), packed(top / "sub", leave_out=["out"])
    assert first.sha256 == again.sha256 and first.path.read_bytes() == again.path.read_bytes()
    assert set(members(first)) == {"train.py"}
    assert packed(top / "sub").sha256 != first.sha256, "another leave_out, another archive"


def test_the_fingerprint_changes_with_what_is_left_out(tmp_path):
    root = tree(tmp_path / "w", {"train.py": ""})
    entries = codepack.collect(root)
    assert codepack.fingerprint(root, entries, ["runs"]) != codepack.fingerprint(root, entries)
    assert codepack.fingerprint(root, entries, ["b", "a"]) == codepack.fingerprint(root, entries, ["a", "b"])


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_files_packed_are_those_git_sees(tmp_path, packed):
    top = tree(tmp_path / "repo", {
        ".gitignore": "sub/runs/\n*.log\n/build\n!sub/lib/keep.log\n", "sub/.gitignore": "data/*\n!data/ok.csv\n",
        "sub/lib/.gitignore": "!debug.log\n", "sub/train.py": "", "sub/x.log": "", "sub/runs/ckpt": "",
        "sub/build/m.py": "", "sub/lib/keep.log": "", "sub/lib/debug.log": "", "sub/lib/other.log": "",
        "sub/data/ok.csv": "", "sub/data/no.csv": "", "sub/lib/runs/r.py": ""})
    # the machine's own git settings (a global excludesFile) would change what git sees
    alone = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q", str(top)], check=True, env=alone)
    (top / ".git" / "info" / "exclude").write_text("sub/lib/runs/\n")
    seen = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "--", "sub"], cwd=top, check=True,
                          capture_output=True, text=True, env=alone).stdout.split()
    assert "sub/lib/keep.log" in seen and "sub/x.log" not in seen
    files = {name for name, m in members(packed(top / "sub")).items() if m.isfile()}
    assert files == {path.removeprefix("sub/") for path in seen}


def test_files_and_folders_removed_while_the_tree_is_packed_are_left_out(tmp_path, packed, monkeypatch):
    """Another job writing checkpoints under the workdir removes its temporary files and folders meanwhile (a
    submission failed on one): what is gone is not in the archive, which is the tree as it is after."""
    root = tree(tmp_path / "w", {"train.py": "x", "ckpt/tmp_1/part-0.tempstate": "y", "ckpt/done": "z",
                                 "ckpt/tmp_2/part-1.tempstate": "w"})
    entries = codepack.collect(root)
    (root / "ckpt" / "tmp_1" / "part-0.tempstate").unlink()  # listed, then gone before it is read
    archive = packed(root, entries=entries)
    assert "ckpt/tmp_1/part-0.tempstate" not in members(archive) and "ckpt/done" in members(archive)
    assert archive.files == 3, "a file that was not packed is not counted"
    real_scandir = os.scandir

    def scandir_after_removal(path):  # the folder goes between its parent's listing and its own
        if str(path).endswith("tmp_2"):
            shutil.rmtree(path)
        return real_scandir(path)
    monkeypatch.setattr(codepack.os, "scandir", scandir_after_removal)
    assert [e.path for e in codepack.collect(root)] == ["ckpt", "ckpt/done", "ckpt/tmp_1", "train.py"]
