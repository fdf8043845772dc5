"""The coordinator's store of jobs' event files: chunks at their offsets, bytes sent again taken as they are, a
gap or a job past its limit refused, paths that leave the task's folder refused, and retention's sweep."""

from __future__ import annotations

import pytest

from tfcluster.daemon.coordinator.store.summaries import SummaryError, SummaryStore
from tfcluster.summaries import SummaryChunk, board_path, path_problem, split_key

NAME = "events.out.tfevents.1.host"


def chunk(offset: int, data: bytes, path: str = NAME, job: str = "j1") -> SummaryChunk:
    return SummaryChunk(job, "worker", 0, path, offset, data)


def test_chunks_are_kept_at_their_offsets_and_read_back_past_what_the_client_has(tmp_path):
    store = SummaryStore(tmp_path)
    store.write(chunk(0, b"abc"))
    store.write(chunk(3, b"def"))
    store.write(chunk(0, b"abcd"))  # sent again after a registration: the same bytes
    store.write(chunk(0, b"xy", path=f"train/{NAME}"))
    assert (tmp_path / "j1" / "worker-0" / NAME).read_bytes() == b"abcdef"
    assert [(c.key, c.offset, c.data) for c in store.read("j1", {f"worker:0/{NAME}": 4})] == \
        [(f"worker:0/{NAME}", 4, b"ef"), (f"worker:0/train/{NAME}", 0, b"xy")]
    assert list(store.read("unknown", {})) == []
    assert split_key(f"worker:0/train/{NAME}") == ("worker", 0, f"train/{NAME}")


def test_a_gap_and_bytes_past_the_jobs_limit_are_refused(tmp_path):
    store = SummaryStore(tmp_path, job_limit=8)
    store.write(chunk(0, b"abc"))
    with pytest.raises(SummaryError, match="only 3 are held"):
        store.write(chunk(5, b"x"))
    store.write(chunk(3, b"defgh"))
    with pytest.raises(SummaryError, match="would pass 8 bytes"):
        store.write(chunk(0, b"z", path=f"b/{NAME}"))
    assert SummaryStore(tmp_path, job_limit=8)._held("j1") == 8, "counted again from the files by a new process"


@pytest.mark.parametrize("path", ["", "/etc/x.tfevents.1", f"../{NAME}", f"a/./{NAME}", f"a//{NAME}",
                                  "checkpoint", f"a\n/{NAME}", "/".join(["a"] * 9 + [NAME])])
def test_paths_that_are_no_event_file_below_the_summary_dir_are_refused(path):
    assert path_problem(path)


def test_the_sweep_removes_the_jobs_retention_let_go(tmp_path):
    store = SummaryStore(tmp_path)
    store.write(chunk(0, b"a", job="kept"))
    store.write(chunk(0, b"b", job="gone"))
    store.sweep({"kept"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


def test_the_task_folders_a_board_links_are_those_that_sent_summaries(tmp_path):
    store = SummaryStore(tmp_path)
    for task_type, task_index in (("worker", 1), ("evaluator", 0)):
        store.write(SummaryChunk("j1", task_type, task_index, NAME, 0, b"x"))
    (tmp_path / "j1" / "not-a-task").mkdir()
    assert [(t, i) for t, i, _ in store.task_folders("j1")] == [("evaluator", 0), ("worker", 1)]
    assert list(store.task_folders("j2")) == [] and list(store.task_folders("../j1")) == []


def test_a_board_has_one_address_per_set_of_jobs():
    assert board_path(["b-2", "a-1", "b-2"]) == board_path(["a-1", "b-2"]) == "/tensorboard/a-1+b-2/"
