"""A job's scalar curves out of its stored event files (web/curves.py, web/event_records.py): written with
tensorboard's own event writer into a real summary store, read on as the file grows (a record cut in two between
two readings included), thinned past MAX_POINTS, and a damaged file stops with a message, not an exception."""

from __future__ import annotations

import importlib.util
import struct

import pytest

from tfcluster.daemon.coordinator.core.model.usage_history import UsageHistory
from tfcluster.daemon.coordinator.store.summaries import SummaryStore
from tfcluster.daemon.coordinator.web import curves
from tfcluster.model import Attempt, TaskProgress
from tfcluster.summaries import SummaryChunk

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs the tf extra")


def event_file_bytes(tmp_path, steps) -> bytes:
    """An event file as tensorboard's writer writes it: a scalar per step, TF1 style and TF2 style (a tensor)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    writer = EventFileWriter(str(tmp_path))
    for step in steps:
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_content=struct.pack("<f", step / 2))
        writer.add_event(event_pb2.Event(wall_time=1000.0 + step, step=step, summary=summary_pb2.Summary(value=[
            summary_pb2.Summary.Value(tag="loss", simple_value=step / 10),
            summary_pb2.Summary.Value(tag="epoch_accuracy", tensor=tensor)])))
    writer.close()
    [path] = tmp_path.glob("events.out.tfevents.*")
    return path.read_bytes()


def test_curves_grow_as_the_file_does_and_are_thinned_past_the_limit(tmp_path):
    data = event_file_bytes(tmp_path / "written", range(1200))
    store = SummaryStore(tmp_path / "store")
    job = curves.Curves(store)
    cut = len(data) // 3 + 5  # inside a record
    store.write(SummaryChunk("j1", "worker", 0, "train/events.out.tfevents.1", 0, data[:cut]))
    first = {s["tag"]: s for s in job.read("j1")["series"]}
    assert first["loss"]["run"] == "worker:0/train"
    written = first["loss"]["written"]
    assert 300 < written < 1200 and [p[0] for p in first["loss"]["points"][:3]] == [0, 1, 2]
    store.write(SummaryChunk("j1", "worker", 0, "train/events.out.tfevents.1", cut, data[cut:]))
    doc = job.read("j1")
    by_tag = {s["tag"]: s for s in doc["series"]}
    loss, accuracy = by_tag["loss"], by_tag["epoch_accuracy"]
    assert loss["written"] == accuracy["written"] == 1200, "every record once: none lost or read twice at the cut"
    steps = [p[0] for p in loss["points"]]
    assert len(steps) <= curves.MAX_POINTS + 1 and loss["stride"] >= 4
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == 1199, "spread evenly, the newest shown"
    assert accuracy["points"][-1][:2] == [1199, 599.5] and accuracy["points"][1][:2] == [accuracy["stride"], accuracy["stride"] / 2]
    assert loss["points"][-1] == [1199, pytest.approx(119.9), 2199.0]
    assert doc["problems"] == [] and doc["skipped"] == 0


def test_a_damaged_file_is_named_and_the_others_still_read(tmp_path):
    good = event_file_bytes(tmp_path / "written", range(3))
    store = SummaryStore(tmp_path / "store")
    store.write(SummaryChunk("j2", "chief", 0, "events.out.tfevents.1", 0, good))
    store.write(SummaryChunk("j2", "worker", 1, "events.out.tfevents.2", 0, b"\xff" * 64))
    doc = curves.Curves(store).read("j2")
    assert [(s["run"], s["tag"], len(s["points"])) for s in doc["series"]] == \
        [("chief:0", "epoch_accuracy", 3), ("chief:0", "loss", 3)]
    assert len(doc["problems"]) == 1 and "worker:1/events.out.tfevents.2" in doc["problems"][0]


def test_only_the_jobs_looked_at_last_are_kept(tmp_path):
    job = curves.Curves(SummaryStore(tmp_path))
    for n in range(curves.MAX_JOBS + 5):
        job.read(f"j{n}")
    assert len(job.jobs) == curves.MAX_JOBS and "j0" not in job.jobs and f"j{curves.MAX_JOBS + 4}" in job.jobs


def test_usage_history_turns_cpu_seconds_into_cores_and_stays_bounded():
    history = UsageHistory(sample_seconds=5, max_tasks=2)
    attempt = Attempt("j", "worker", 0, 1)
    for second, cpu, gpu in ((0, 10.0, 0.5), (1, 11.0, 0.5), (5, 20.0, 0.9), (10, 30.0, None)):
        history.heartbeat("a", [TaskProgress(attempt, cpu_seconds=cpu, rss_bytes=1 << 20, gpu_utilization=gpu)], second)
    assert list(history.of_job("j")["worker:0"].samples) == [(5, 2.0, 1 << 20, 0.9), (10, 2.0, 1 << 20, None)]
    for index in (1, 2):
        history.heartbeat("a", [TaskProgress(Attempt("k", "worker", index, 1))], 11)
    assert list(history.of_job("j")) == [] and len(history.tasks) == 2


def test_a_tasks_gpu_use_crosses_the_wire_checked_and_is_absent_where_nvml_does_not_read_it():
    from tfcluster import wire
    attempt = Attempt("j", "worker", 0, 1)
    sent = [TaskProgress(attempt, gpu_utilization=0.73), TaskProgress(attempt), TaskProgress(attempt, gpu_utilization=7.0),
            TaskProgress(attempt, gpu_utilization=float("nan"))]
    received = wire.progress_from_proto(wire.heartbeat_to_proto("s", sent).heartbeat)
    assert [p.gpu_utilization for p in received] == [0.73, None, 1.0, None]
