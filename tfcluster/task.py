"""Helpers for training and evaluation programs run by tfcluster: `from tfcluster import task`.

Importing this module has no side effects and needs neither TensorFlow nor the daemons: every attribute
is read from the environment the agent gives the task when it is asked for (so tests can set it too).

    task.type, task.index          this task's TF_CONFIG type and index
    task.is_chief                  the chief, or worker 0 when the job has no chief (TensorFlow's rule)
    task.num_workers               worker tasks in the job (the chief not counted)
    task.strategy                  the job's strategy name (auto already resolved)
    task.checkpoint_dir, task.model_dir, task.attempt, task.job_id
    task.summary_dir               where an evaluator writes TensorBoard summaries (its agent reports them)
    task.write_dir(path)           where this task should write: path on the chief, a private temp dir
                                   elsewhere (under MultiWorkerMirroredStrategy saving is collective)
    task.make_strategy()           the tf.distribute strategy the job asked for
    task.checkpoints()             each newly committed checkpoint; ends after the final one
    task.report_evaluation(...)    an evaluation result, shown by `tfcluster status`
    task.SidecarEvaluator          tf-keras's SidecarEvaluator that also ends after the final checkpoint and
                                   reports its results (imports TensorFlow when it is first used)
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from typing import Any

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
_write_dirs: dict[str, str] = {}


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def _tf_config() -> dict[str, Any]:
    try:
        return json.loads(_env(layout.TF_CONFIG) or "{}")
    except ValueError:
        return {}


def __getattr__(name: str) -> Any:
    if name == "type":
        return _env(layout.TASK_TYPE) or _tf_config().get("task", {}).get("type", "worker")
    if name == "index":
        return int(_env(layout.TASK_INDEX) or _tf_config().get("task", {}).get("index", 0))
    if name == "is_chief":
        kind, index = __getattr__("type"), __getattr__("index")
        has_chief = bool(_tf_config().get("cluster", {}).get("chief"))
        return kind == "chief" or (kind == "worker" and index == 0 and not has_chief)
    if name == "num_workers":
        default = len(_tf_config().get("cluster", {}).get("worker", [])) or 1
        return int(_env(layout.NUM_WORKERS) or default)
    if name == "strategy":
        return _env(layout.STRATEGY, "mirrored")
    if name == "checkpoint_dir":
        return _env(layout.CHECKPOINT_DIR) or os.path.join(tempfile.gettempdir(), "tfcluster-checkpoints")
    if name == "model_dir":
        return _env(layout.MODEL_DIR) or __getattr__("checkpoint_dir")
    if name == "attempt":
        return int(_env(layout.ATTEMPT) or 1)
    if name == "job_id":
        return _env(layout.JOB_ID)
    if name == "summary_dir":
        return _env(layout.SUMMARY_DIR) or os.path.join(__getattr__("model_dir"), layout.EVAL_SUMMARY_SUBDIR)
    if name == "SidecarEvaluator":  # it subclasses tf-keras's: TensorFlow is imported only when it is asked for
        from tfcluster.roles.sidecar import SidecarEvaluator
        return SidecarEvaluator
    raise AttributeError(f"module 'tfcluster.task' has no attribute {name!r}")


def write_dir(path: str) -> str:
    """path for the chief; for any other task a private temporary dir (the same one on every call)."""
    if __getattr__("is_chief"):
        os.makedirs(path, exist_ok=True)
        return path
    if path not in _write_dirs:
        _write_dirs[path] = tempfile.mkdtemp(prefix=f"tfcluster-{__getattr__('type')}-{__getattr__('index')}-")
    return _write_dirs[path]


def make_strategy():
    """The tf.distribute strategy of the job (TFCLUSTER_STRATEGY), built from TF_CONFIG.

    Under multi_worker_mirrored NCCL is asked for when GPUs are present (TensorFlow's AUTO means RING).
    Under parameter_server this is for the chief, which coordinates; workers and ps run a server.
    """
    import tensorflow as tf

    name = __getattr__("strategy")
    if name == "multi_worker_mirrored":
        options = None
        if tf.config.list_physical_devices("GPU"):
            options = tf.distribute.experimental.CommunicationOptions(
                implementation=tf.distribute.experimental.CommunicationImplementation.NCCL)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if name == "parameter_server":
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.experimental.ParameterServerStrategy(resolver)
    if name == "central_storage":
        return tf.distribute.experimental.CentralStorageStrategy()
    return tf.distribute.MirroredStrategy()


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
    path = _env(layout.CONTROL_FILE)
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
    return os.path.join(directory or __getattr__("checkpoint_dir"), name) if name else ""


def checkpoints(directory: str | None = None, poll_seconds: float = CHECKPOINT_POLL_SECONDS,
                timeout: float | None = None) -> Iterator[str]:
    """Yields each newly committed checkpoint (the newest when several arrived since the last one).

    When tfcluster says training has finished, it yields the final checkpoint if it has not already,
    and ends. timeout: give up after that many seconds without a new checkpoint (None: never)."""
    directory = directory or __getattr__("checkpoint_dir")
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
    path = _env(layout.EVENTS_FILE)
    if not path:
        return
    line = json.dumps({"kind": "evaluation", "checkpoint": checkpoint, "step": int(step), "time": time.time(),
                       "metrics": {k: float(v) for k, v in metrics.items()}})
    with open(path, "a") as f:
        f.write(line + "\n")
