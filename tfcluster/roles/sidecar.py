"""`tfcluster.task.SidecarEvaluator`: tf-keras's SidecarEvaluator for an evaluator that tfcluster runs.

It takes the same arguments and evaluates the same way as `tf.keras.utils.SidecarEvaluator`: each new
checkpoint in `checkpoint_dir` is restored into the compiled model and evaluated with `model.evaluate` and
the callbacks given (a `TensorBoard` callback writes the summaries). Two things differ:

- it follows checkpoints with `task.checkpoints()`, so once tfcluster says training has finished it
  evaluates the final checkpoint (unless it already has) and returns. tf-keras's waits for new checkpoints
  forever unless `max_evaluations` is given, and training's last checkpoint number is rarely known up front;
- it reports each result with `task.report_evaluation()`, so `tfcluster status` shows it.

Outside tfcluster it behaves as tf-keras's does. Imports TensorFlow: use it in evaluator programs only.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from tfcluster import checkpoints  # noqa: E402


class SidecarEvaluator(tf_keras.utils.SidecarEvaluator):
    """tf-keras's SidecarEvaluator that ends after training's final checkpoint and reports to tfcluster."""

    def start(self) -> None:
        """Evaluates each newly committed checkpoint; returns after the final one, or once a checkpoint's
        number reaches max_evaluations (tf-keras's rule)."""
        for path in checkpoints.checkpoints(self.checkpoint_dir):
            if not self._restore(path):
                continue
            logs = self.model.evaluate(self.data, steps=self.steps, callbacks=self.callbacks, verbose=2,
                                       return_dict=True)
            metrics = {name: float(value) for name, value in logs.items()}
            step = self._step(path)
            checkpoints.report_evaluation(path, step, metrics)
            shown = ", ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()))
            print(f"SidecarEvaluator: {os.path.basename(path)} (step {step}): {shown}", flush=True)
            if self.max_evaluations and self.max_evaluations <= checkpoints.checkpoint_step(path):
                return
        print("SidecarEvaluator: training finished; the final checkpoint is evaluated", flush=True)

    def _restore(self, path: str) -> bool:
        """Restores the model (and the optimizer, whose iteration count labels the evaluation) from path."""
        trackables = {"model": self.model}
        if self.model.optimizer is not None:
            trackables["optimizer"] = self.model.optimizer
        try:
            tf.train.Checkpoint(**trackables).restore(path).expect_partial()
            if not any(name.startswith("model/") for name, _ in tf.train.list_variables(path)):
                # ModelCheckpoint(save_weights_only=True) saves the model itself as the checkpoint's root; the
                # optimizer's slots are not needed to evaluate.
                self.model.load_weights(path).expect_partial()
        except tf.errors.UnavailableError:
            raise  # a preempted worker under a distribution strategy: not a checkpoint problem
        except tf.errors.OpError as e:
            # An old checkpoint can be deleted while it is read (max_to_keep): a newer one follows.
            print(f"SidecarEvaluator: cannot read {path} ({type(e).__name__}); skipping it", flush=True)
            return False
        return True

    def _step(self, path: str) -> int:
        """The optimizer's iteration count (what TensorBoard's callback labels the summaries with), else the
        checkpoint's number."""
        optimizer = self.model.optimizer
        iterations = int(optimizer.iterations.numpy()) if optimizer is not None else 0
        return iterations if iterations > 0 else checkpoints.checkpoint_step(path)
