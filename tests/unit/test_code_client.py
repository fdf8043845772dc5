"""`tfcluster start`'s packing against the coordinator's cap: a tree over the default asks the coordinator's
own, which may be higher; a tree over that is refused with its largest files. The job's own output folders
inside its workdir are left out, and said so."""

from __future__ import annotations

import os
from dataclasses import replace
from types import SimpleNamespace

import pytest

from tfcluster import codepack
from tfcluster import codeship as code
from tfcluster.errors import InvalidRequest


class Coordinator:
    def __init__(self, max_bytes: int):
        self.max_bytes, self.asked = max_bytes, 0

    def code_status(self, sha256: str, size: int):
        self.asked += 1
        return SimpleNamespace(complete=False, received=0, max_bytes=self.max_bytes)


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.setattr(codepack, "DEFAULT_MAX_BYTES", 50_000)
    (tmp_path / "weights.bin").write_bytes(os.urandom(80_000))
    return tmp_path, codepack.collect(tmp_path)


def test_a_tree_over_the_default_cap_is_packed_under_the_coordinators_higher_one(tree):
    root, entries = tree
    coordinator = Coordinator(max_bytes=1 << 20)
    archive = code._pack(coordinator, str(root), entries)
    archive.remove()
    assert coordinator.asked == 1 and archive.size > codepack.DEFAULT_MAX_BYTES


def test_a_tree_over_the_coordinators_cap_is_refused_with_its_largest_files(tree):
    root, entries = tree
    with pytest.raises(InvalidRequest) as refused:
        code._pack(Coordinator(max_bytes=64 << 10), str(root), entries)
    assert refused.value.exit_code == 2
    assert "code: 80.0 kB is over the coordinator's cap of 64 KiB; largest: weights.bin 80.0 kB" in str(refused.value)


class Holding(Coordinator):
    """A coordinator that already holds every archive it is asked about."""

    def __init__(self):
        super().__init__(max_bytes=1 << 20)
        self.sha256s: list[str] = []

    def code_status(self, sha256: str, size: int):
        self.sha256s.append(sha256)
        return SimpleNamespace(complete=True, received=size, max_bytes=self.max_bytes)


def test_the_jobs_output_folders_inside_the_workdir_are_left_out_and_named(tmp_path, monkeypatch, capsys):
    from tfcluster.specfile import load_spec_file
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    w = tmp_path / "w"
    for rel, content in {"train.py": b"print()\n", "runs/fit/ckpt-1": os.urandom(5000),
                         "runs/fit/eval/events": b"e", "runs/notes.txt": b"n", "model/saved.pb": b"m"}.items():
        (w / rel).parent.mkdir(parents=True, exist_ok=True)
        (w / rel).write_bytes(content)
    (w / "job.toml").write_text('name = "fit"\nstrategy = "multi_worker_mirrored"\ncommand = ["python3", "train.py"]\n'
                                'checkpoint_dir = "runs/fit"\nmodel_dir = "../elsewhere"\n'
                                '[roles.worker]\ncount = 2\n[roles.evaluator]\nsummary_dir = "runs/fit/eval"\n'
                                'command = ["python3", "train.py"]\n')
    spec = load_spec_file(w / "job.toml")
    shipped = code.ship_code(Holding(), spec)
    expected = codepack.pack(w, leave_out=["runs/fit"])
    expected.remove()
    assert shipped.code_sha256 == expected.sha256
    said = capsys.readouterr().err
    assert "code: left out runs/fit (the job's checkpoint_dir)\n" in said, said
    again = code.ship_code(Holding(), replace(spec, checkpoint_dir=str(w / "model")))
    assert again.code_sha256 != shipped.code_sha256, "another folder left out: not the remembered archive"
    assert "code: left out model (the job's checkpoint_dir), runs/fit/eval (the evaluator's summary_dir)\n" in \
        capsys.readouterr().err
