"""`tfcluster start`'s packing against the coordinator's cap: a tree over the default asks the coordinator's
own, which may be higher; a tree over that is refused with its largest files."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import typer

from tfcluster import codepack
from tfcluster.cli import code


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


def test_a_tree_over_the_coordinators_cap_is_refused_with_its_largest_files(tree, capsys):
    root, entries = tree
    with pytest.raises(typer.Exit) as refused:
        code._pack(Coordinator(max_bytes=64 << 10), str(root), entries)
    assert refused.value.exit_code == 2
    assert "code: 80.0 kB is over the coordinator's cap of 64 KiB; largest: weights.bin 80.0 kB" in \
        capsys.readouterr().err
