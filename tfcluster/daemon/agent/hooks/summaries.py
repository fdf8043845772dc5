"""Evaluation results read from the TensorBoard summaries an evaluator writes.

An evaluator that reports nothing through its events file (tf-keras's SidecarEvaluator, or any program that
only writes TensorBoard summaries) still has its results shown: its agent reads the scalar summaries in the
evaluator's summary dir (TFCLUSTER_SUMMARY_DIR: the role's `summary_dir`, else `<model dir>/eval`), one
evaluation per step, and reports them as the built-in evaluator's are. An evaluation is tied to the checkpoint
of the evaluator's checkpoint dir that was saved at that step (checkpoint_steps.py reads the step out of each
checkpoint), which is how the coordinator learns that the final checkpoint has been evaluated.

Only summaries written since the attempt started count: a summary dir shared with an earlier run or job says
nothing about this one. Event files are read with tensorboard's pure-Python record reader (its TensorFlow
stub): tensorboard's EventFileLoader imports TensorFlow whenever it is installed, and the agent never does.
Only files of the evaluator's own user are read, none through a link (handback.py): the reader is given the
agent's descriptor of the file it checked (/proc/self/fd/N), so what it reads is that file and no other.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import threading
import time
from typing import Any

from google.protobuf.message import DecodeError

from tfcluster import wire
from tfcluster.checkpoints import STEP_VARIABLES, checkpoint_paths, checkpoint_step
from tfcluster.daemon.agent.hooks.api import Send, TaskHook, remember
from tfcluster.daemon.agent.hooks.checkpoint_steps import read_steps
from tfcluster.daemon.agent.tasks import handback
from tfcluster.model import EVALUATOR, Attempt, Evaluation

log = logging.getLogger("tfcluster.agent")

SCAN_SECONDS = 1.0  # how often the summary dir is listed for new event files (known ones are read every poll)
EVENT_FILE_MARK = ".tfevents."  # TensorBoard's event files: events.out.tfevents.<time>.<host>...
MAX_RECORDS_PER_FILE_POLL = 10_000  # a huge event file is read over several polls, not in one go
MAX_METRICS = 256  # what the coordinator accepts in one evaluation
# tf-keras's TensorBoard callback names an evaluation's scalars evaluation_<metric>_vs_iterations.
KERAS_EVALUATION_TAG = re.compile(r"^evaluation_(.+)_vs_iterations$")
SCALAR_FORMATS = {1: "<f", 2: "<d", 3: "<i", 9: "<q"}  # DataType DT_FLOAT, DT_DOUBLE, DT_INT32, DT_INT64


class SummaryReader:
    """Follows one evaluator attempt's summary dir; each poll returns the evaluations that are new or changed."""

    def __init__(self, summary_dir: str, checkpoint_dir: str, since: float, owner: int | None = None):
        from tensorboard.compat.proto import event_pb2
        from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
        self._event, self._errors, self._reader = event_pb2.Event, errors, pywrap_tensorflow.PyRecordReader_New
        self.summary_dir, self.checkpoint_dir, self.since = summary_dir, checkpoint_dir, since
        self.owner = owner  # the evaluator's user: only its files are read
        self.files: dict[str, Any] = {}  # event file -> its record reader, which keeps its place
        self.held: dict[str, Any] = {}  # event file -> the agent's open file of it, which the reader reads through
        self.scanned_at = float("-inf")
        self.metrics: dict[int, dict[str, float]] = {}  # step -> metric -> value
        self.times: dict[int, float] = {}  # step -> when its last scalar was written
        # checkpoint prefix -> (the step variables it holds, the number in its name), oldest first
        self.checkpoints: dict[str, tuple[set[int], int]] = {}

    def poll(self) -> list[Evaluation]:
        # Every time: the state file may list only the newest checkpoint (ModelCheckpoint's does), and an old one
        # can be replaced before its evaluation ends.
        self._learn_checkpoints()
        return [self._evaluation(step) for step in sorted(self._read_scalars())]

    def _learn_checkpoints(self) -> None:
        state = handback.read_state(self.checkpoint_dir, self.owner) if self.checkpoint_dir else None
        for prefix in checkpoint_paths(self.checkpoint_dir, state) if state is not None else []:
            if prefix not in self.checkpoints:
                try:
                    steps = set(read_steps(prefix, STEP_VARIABLES, self.owner).values())
                except (OSError, ValueError):
                    steps = set()  # deleted meanwhile, or not readable: the number in its name still labels it
                self.checkpoints[prefix] = (steps, checkpoint_step(prefix))

    def checkpoint_of(self, step: int) -> str:
        """The newest checkpoint saved at step: by its step variables, else by the number in its name;
        `step N` when no checkpoint of the evaluator's checkpoint dir was."""
        by_variable = [p for p, (steps, _) in self.checkpoints.items() if step in steps]
        by_name = [p for p, (_, number) in self.checkpoints.items() if number == step]
        found = by_variable or by_name
        return found[-1] if found else f"step {step}"

    def _read_scalars(self) -> set[int]:
        if time.monotonic() - self.scanned_at >= SCAN_SECONDS:
            self.scanned_at = time.monotonic()
            for path in self._new_event_files():
                try:
                    self.files[path] = self._open(path)
                except (OSError, self._errors.OpError):
                    self.held.pop(path, None)
                    continue
        changed: set[int] = set()
        for path, reader in sorted(self.files.items()):
            for event in self._new_events(reader):
                if event.wall_time < self.since:
                    continue
                scalars = _scalars(event)
                if scalars:
                    self.metrics.setdefault(event.step, {}).update(scalars)
                    self.times[event.step] = event.wall_time
                    changed.add(event.step)
        return changed

    def _open(self, path: str):
        """A record reader of the event file, reading through the agent's descriptor of it (see the module's
        docstring); the file stays open for as long as this reader follows it."""
        self.held[path] = os.fdopen(handback.open_file(path, self.owner), "rb")
        return self._reader(f"/proc/self/fd/{self.held[path].fileno()}")

    def _new_event_files(self) -> list[str]:
        """Event files under the summary dir (TensorBoard's callback writes into subfolders) not followed yet
        and written to since the attempt started; the walk follows no link."""
        found = []
        for relative, _, name in handback.files_under(self.summary_dir):
            path = os.path.join(self.summary_dir, relative)
            if EVENT_FILE_MARK in name and path not in self.files and _modified_since(path, self.since):
                found.append(path)
        return found

    def _new_events(self, reader) -> list:
        events = []
        for _ in range(MAX_RECORDS_PER_FILE_POLL):
            try:
                reader.GetNext()
            except self._errors.OutOfRangeError:
                break  # the end, for now
            except self._errors.DataLossError:
                break  # a record still being written: the reader starts it again next time
            try:
                events.append(self._event.FromString(reader.record()))
            except DecodeError:
                log.warning("%s: skipping a record that is not a TensorBoard event", self.summary_dir)
        return events

    def _evaluation(self, step: int) -> Evaluation:
        metrics = dict(list(self.metrics[step].items())[:MAX_METRICS])
        return Evaluation(checkpoint=self.checkpoint_of(step), step=step, metrics=metrics, time=self.times[step])


class EvaluatorSummaries:
    """A SummaryReader for each evaluator attempt on this node, unless the attempt reports its results
    itself through its events file (those reports name the checkpoint exactly: they win)."""

    def __init__(self):
        self.readers: dict[Attempt, SummaryReader] = {}
        self.reporting: dict[Attempt, None] = {}  # attempts that report through their events file, oldest first
        self.finished: dict[Attempt, None] = {}   # ended attempts whose summaries have all been read
        self.unavailable = False  # the agent's Python has no tensorboard package

    def reports_itself(self, attempt: Attempt) -> None:
        remember(self.reporting, attempt)
        self.readers.pop(attempt, None)

    def read_again(self) -> None:
        """Every result is reported again from the start (after a registration: the coordinator may be new)."""
        self.readers.clear()
        self.finished.clear()

    def forget(self, attempt: Attempt) -> None:
        for kept in (self.readers, self.reporting, self.finished):
            kept.pop(attempt, None)

    def done(self, record) -> bool:
        """Whether a supervisor TaskRecord has no results (left) to read here."""
        attempt = record.attempt
        return attempt.type != EVALUATOR or not record.summary_dir or self.unavailable or \
            attempt in self.reporting or attempt in self.finished

    def poll(self, record) -> list[Evaluation]:
        """New results of a supervisor TaskRecord; the last ones once when it has ended."""
        attempt = record.attempt
        if self.done(record):
            return []
        reader = self.readers.get(attempt)
        if reader is None:
            try:
                reader = self.readers[attempt] = SummaryReader(record.summary_dir, record.checkpoint_dir,
                                                               record.started_at, record.uid)
            except ImportError:
                self.unavailable = True
                log.warning("evaluator summaries are not read: this agent's Python lacks the tensorboard package")
                return []
        if record.exited.is_set():
            reader.scanned_at = float("-inf")  # its last look: every event file it wrote
            remember(self.finished, attempt)
            del self.readers[attempt]
        return reader.poll()


class SummariesHook(TaskHook):
    """Sends the results read from evaluators' summaries; all of them again after each registration."""

    def __init__(self, send: Send):
        self.send = send
        self.summaries = EvaluatorSummaries()
        self.lock = threading.Lock()

    def reports_itself(self, attempt: Attempt) -> None:
        with self.lock:
            self.summaries.reports_itself(attempt)

    def on_register(self) -> None:
        with self.lock:
            self.summaries.read_again()

    def on_poll(self, record) -> None:
        with self.lock:
            results = self.summaries.poll(record)
        for result in results:
            self.send(wire.evaluation_to_proto(record.attempt, result))

    on_exit = on_poll  # its last results, before its exit

    def finished_with(self, record) -> bool:
        with self.lock:
            return self.summaries.done(record)

    def on_forget(self, record) -> None:
        with self.lock:
            self.summaries.forget(record.attempt)


def _scalars(event) -> dict[str, float]:
    """The event's scalar values by metric name (tf-keras's evaluation_<metric>_vs_iterations gives <metric>)."""
    found = {}
    for value in event.summary.value:
        number = _number(value)
        if number is not None:
            match = KERAS_EVALUATION_TAG.match(value.tag)
            found[match.group(1) if match else value.tag] = number
    return found


def _number(value) -> float | None:
    """A summary value's number when it is a scalar: TF1's simple_value, or a rank-0 numeric tensor (TF2)."""
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if not value.HasField("tensor") or value.tensor.tensor_shape.dim:
        return None
    tensor = value.tensor
    layout = SCALAR_FORMATS.get(tensor.dtype)
    if layout is None:
        return None
    if tensor.tensor_content:
        if len(tensor.tensor_content) != struct.calcsize(layout):
            return None
        return float(struct.unpack(layout, tensor.tensor_content)[0])
    for values in (tensor.float_val, tensor.double_val, tensor.int_val, tensor.int64_val):
        if values:
            return float(values[0])
    return None


def _modified_since(path: str, since: float) -> bool:
    try:
        return os.stat(path).st_mtime >= since
    except OSError:
        return False
