"""A job's checkpoints and evaluations as tfcluster follows them: TensorFlow's `checkpoint` state file, the newest
committed checkpoint, every one it lists, the final one once training has finished, and the evaluation results a
task reports. Standard library only: task programs (through `tfcluster.task`, which re-exports these), the
evaluator sidecar and the agent all read it.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Iterator

from tfcluster import layout

CHECKPOINT_POLL_SECONDS = 0.2
STATE_FILE = "checkpoint"  # TensorFlow's checkpoint state file, rewritten after each complete save
_STATE_LINE = re.compile(r'^model_checkpoint_path:\s*"((?:[^"\\]|\\.)*)"\s*$', re.MULTILINE)
_STATE_ALL_LINE = re.compile(r'^all_model_checkpoint_paths:\s*"((?:[^"\\]|\\.)*)"\s*$', re.MULTILINE)
# Where a checkpoint keeps the training step, in order of preference: a `step` variable saved next to the model,
# else the optimizer's iteration count (tf-keras optimizers, then legacy ones; at the root when the model was
# saved as the root, as save_weights and ModelCheckpoint do). TensorBoard's callback and tf-keras's
# SidecarEvaluator label evaluations with the iteration count.
STEP_VARIABLES = ("step/.ATTRIBUTES/VARIABLE_VALUE",
                  "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE", "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE",
                  "model/optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE",
                  "model/optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE")


def default_checkpoint_dir() -> str:
    """The task's checkpoint dir (TFCLUSTER_CHECKPOINT_DIR), or a temporary one outside tfcluster."""
    return os.environ.get(layout.CHECKPOINT_DIR) or os.path.join(tempfile.gettempdir(), "tfcluster-checkpoints")


def latest_checkpoint(directory: str, state: str | None = None) -> str | None:
    """The newest committed checkpoint prefix in directory, from its `checkpoint` state file (or the
    state file's text, already read).

    The state file is rewritten atomically after a checkpoint is complete, so it is followed instead of
    globbing; a prefix whose .index file is missing is not committed (or already deleted)."""
    if state is None:
        try:
            with open(os.path.join(directory, STATE_FILE)) as f:
                state = f.read()
        except OSError:
            return None
    match = _STATE_LINE.search(state)
    if not match:
        return None
    prefix = _state_path(directory, match.group(1))
    return prefix if os.path.exists(prefix + ".index") else None


def checkpoint_paths(directory: str, state: str | None = None) -> list[str]:
    """Every committed checkpoint prefix the `checkpoint` state file in directory lists (or the state file's text,
    already read), oldest first."""
    if state is None:
        try:
            with open(os.path.join(directory, STATE_FILE)) as f:
                state = f.read()
        except OSError:
            return []
    paths = [_state_path(directory, m.group(1)) for m in _STATE_ALL_LINE.finditer(state)]
    newest = latest_checkpoint(directory, state)
    if newest and newest not in paths:
        paths.append(newest)
    return [p for p in paths if os.path.exists(p + ".index")]


def _state_path(directory: str, quoted: str) -> str:
    prefix = quoted.encode().decode("unicode_escape")
    return prefix if os.path.isabs(prefix) else os.path.join(directory, prefix)


def final_checkpoint(directory: str | None = None) -> str | None:
    """None while training runs; once it has finished, the final checkpoint's path ("" if there is none)."""
    path = os.environ.get(layout.CONTROL_FILE, "")
    if not path:
        return None
    try:
        with open(path) as f:
            control = json.load(f)
    except (OSError, ValueError):
        return None
    if not control.get("training_finished"):
        return None
    name = control.get("final_checkpoint") or ""
    return os.path.join(directory or default_checkpoint_dir(), name) if name else ""


def checkpoints(directory: str | None = None, poll_seconds: float = CHECKPOINT_POLL_SECONDS,
                timeout: float | None = None) -> Iterator[str]:
    """Yields each newly committed checkpoint (the newest when several arrived since the last one).

    When tfcluster says training has finished, it yields the final checkpoint if it has not already,
    and ends. timeout: give up after that many seconds without a new checkpoint (None: never)."""
    directory = directory or default_checkpoint_dir()
    last = None
    waited_since = time.monotonic()
    while True:
        final = final_checkpoint(directory)
        newest = latest_checkpoint(directory)
        if final == "":  # training finished without a checkpoint
            return
        if final is not None and os.path.exists(final + ".index"):
            if final != last:
                yield final
            return
        if newest and newest != last:
            last = newest
            yield newest
            waited_since = time.monotonic()
        elif timeout is not None and time.monotonic() - waited_since > timeout:
            return
        time.sleep(poll_seconds)


def checkpoint_step(path: str) -> int:
    """The number at the end of a checkpoint prefix (ckpt-12 -> 12), or -1."""
    match = re.search(r"-(\d+)$", path)
    return int(match.group(1)) if match else -1


def report_evaluation(checkpoint: str, step: int, metrics: dict[str, float]) -> None:
    """Records an evaluation result; the agent forwards it and `tfcluster status` shows it."""
    path = os.environ.get(layout.EVENTS_FILE, "")
    if not path:
        return
    line = json.dumps({"kind": "evaluation", "checkpoint": checkpoint, "step": int(step), "time": time.time(),
                       "metrics": {k: float(v) for k, v in metrics.items()}})
    with open(path, "a") as f:
        f.write(line + "\n")
