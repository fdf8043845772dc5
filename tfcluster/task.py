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
import tempfile
from typing import Any

from tfcluster import layout
from tfcluster.checkpoints import (CHECKPOINT_POLL_SECONDS, STATE_FILE, STEP_VARIABLES,  # noqa: F401
                                   checkpoint_paths, checkpoint_step, checkpoints, default_checkpoint_dir,
                                   final_checkpoint, latest_checkpoint, report_evaluation)

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
        return default_checkpoint_dir()
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
