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
    task.stop_signal               the signal a stop, preemption or drain sends first ("SIGTERM", "SIGUSR1", ...)
    task.preemption_handler(ckpt)  PreemptionCheckpointHandler that saves on that signal and exits 42
    task.termination_config()      the TerminationConfig it uses, for a handler of your own
    task.check_keras()             exits 78 with the fix when an MWMS/PS task would run Keras 3 (make_strategy calls
                                   it); the job fails at once, its restarts unspent
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from tfcluster import layout
from tfcluster.model import CONFIG_EXIT_CODE, DEFAULT_STOP_SIGNAL, PREEMPTION_EXIT_CODE, PREEMPTION_SAVED_LINE
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
    if name == "stop_signal":
        return _env(layout.STOP_SIGNAL, DEFAULT_STOP_SIGNAL)
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
    check_keras()
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


def check_keras() -> None:
    """Under multi_worker_mirrored and parameter_server, exits with code 78 (model.CONFIG_EXIT_CODE: the job fails
    without a restart) and a message naming the fix when this task would train with Keras 3 (which does not work
    with those strategies) instead of tf-keras. make_strategy calls it."""
    from tfcluster.strategies import KERAS_FIX, LEGACY_KERAS, LEGACY_KERAS_ON

    name = __getattr__("strategy")
    if name not in strategies_needing_tf_keras():
        return
    problem = ""
    keras = sys.modules.get("keras")
    if keras is not None and str(getattr(keras, "__version__", "3")).split(".")[0] not in ("0", "1", "2"):
        problem = f"this program imported keras {getattr(keras, '__version__', '')}, which is Keras 3"
    elif os.environ.get(LEGACY_KERAS) not in LEGACY_KERAS_ON:
        problem = f"{LEGACY_KERAS}={os.environ.get(LEGACY_KERAS, '')!r} makes tf.keras Keras 3"
    elif importlib.util.find_spec("tf_keras") is None:
        problem = f"tf-keras is not installed for {sys.executable}, so tf.keras is Keras 3"
    if problem:
        # Exit code 78: the job fails at once instead of spending its restarts on a program no restart fixes.
        print(f"tfcluster: {problem}, which does not work with {name} (keras-team/keras#20585, #18624). "
              f"Fix: {KERAS_FIX}.", file=sys.stderr, flush=True)
        sys.exit(CONFIG_EXIT_CODE)


def strategies_needing_tf_keras() -> tuple[str, ...]:
    from tfcluster.strategies import PROFILES

    return tuple(name for name, p in PROFILES.items() if p.needs_tf_keras)


def termination_config(saved_step: Callable[[], int] | None = None, grace_period: int = 0):
    """A tf.distribute.experimental.TerminationConfig for PreemptionCheckpointHandler that watches the signal
    tfcluster sends this job on a stop, a preemption or a drain (TFCLUSTER_STOP_SIGNAL, [preemption] signal)
    and, once every worker saved, exits with code 42: tfcluster restarts the group without charging its
    restart budget, and a stopped job's next run resumes there. saved_step, when given, tells the step saved
    (tfcluster's status shows it). Call on the main thread: it installs the signal's handler."""
    import tensorflow as tf

    asked = threading.Event()
    signal.signal(signal.Signals[__getattr__("stop_signal")], lambda signum, frame: asked.set())

    def exit_saved() -> None:
        if saved_step is not None:
            print(PREEMPTION_SAVED_LINE.format(step=int(saved_step())), flush=True)
        sys.exit(PREEMPTION_EXIT_CODE)

    # The handler polls the watcher once a second from a thread of its own; the save waits for the next step.
    return tf.distribute.experimental.TerminationConfig(termination_watcher_fn=asked.is_set, exit_fn=exit_saved,
                                                        grace_period=grace_period)


def preemption_handler(checkpoint, checkpoint_dir: str = "", strategy=None):
    """tf.distribute.experimental.PreemptionCheckpointHandler over checkpoint (a tf.train.Checkpoint or
    CheckpointManager), saving under checkpoint_dir (default: <task.checkpoint_dir>/preemption), wired to the
    job's stop signal by termination_config. Creating it restores the latest preemption checkpoint; pass each
    single training step through `handler.run(step_fn, ...)`. Call on the main thread."""
    import tensorflow as tf

    resolver = strategy.cluster_resolver if strategy is not None else \
        tf.distribute.cluster_resolver.TFConfigClusterResolver()
    directory = checkpoint_dir or os.path.join(__getattr__("checkpoint_dir"), "preemption")
    handlers: list = []
    config = termination_config(saved_step=lambda: handlers[0].total_run_calls)
    handlers.append(tf.distribute.experimental.PreemptionCheckpointHandler(resolver, checkpoint, directory,
                                                                           termination_config=config))
    return handlers[0]
