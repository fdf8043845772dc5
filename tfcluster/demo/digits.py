"""Data, model and checkpointing shared by the demo and the examples: scikit-learn's handwritten digits
(1,797 8x8 images, shipped inside scikit-learn, so nothing is downloaded) and a small tf-keras classifier.

Also the evaluator entrypoint `tfcluster.demo.digits:evaluation` and a callback that saves a checkpoint
the evaluator can follow after every epoch. Imports TensorFlow; import it from training programs only.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from tfcluster import task  # noqa: E402

BATCH_PER_REPLICA = 32
CHECKPOINTS_KEPT = 3


def splits() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(train, test) arrays: 80% / 20% of the digits in a fixed shuffled order, pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order].astype("int64")
    cut = int(len(x) * 0.8)
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def train_dataset(global_batch: int) -> tf.data.Dataset:
    """Shuffled, repeated forever (fit needs steps_per_epoch); sharded by data under multi-worker."""
    (x, y), _ = splits()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=1).repeat().batch(global_batch)
            .with_options(options))


def test_dataset(batch: int = 256) -> tf.data.Dataset:
    _, (x, y) = splits()
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def steps_per_epoch(global_batch: int) -> int:
    (x, _), _ = splits()
    return max(1, len(x) // global_batch)


def make_model() -> keras.Model:
    return keras.Sequential([
        keras.layers.Input(shape=(64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def compile_model(model: keras.Model, **kwargs) -> keras.Model:
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], **kwargs)
    return model


def evaluation() -> tuple[keras.Model, tf.data.Dataset]:
    """The evaluator entrypoint: a compiled model to restore checkpoints into, and the held-out digits."""
    return compile_model(make_model()), test_dataset()


def checkpoint_manager(model: keras.Model, step: tf.Variable) -> tf.train.CheckpointManager:
    """Checkpoints of {model, step} in the job's checkpoint dir (a private temp dir on non-chief workers,
    since under MultiWorkerMirroredStrategy every worker must take part in a save)."""
    checkpoint = tf.train.Checkpoint(model=model, step=step)
    return tf.train.CheckpointManager(checkpoint, task.write_dir(task.checkpoint_dir), max_to_keep=CHECKPOINTS_KEPT)


def resume(model: keras.Model) -> int:
    """Restores the newest checkpoint SaveEveryEpoch left, if any; returns the epochs it had completed
    (pass as fit's initial_epoch), for strategies BackupAndRestore does not support."""
    manager = checkpoint_manager(model, model.optimizer.iterations)
    if not manager.latest_checkpoint:
        return 0
    manager.checkpoint.restore(manager.latest_checkpoint).expect_partial()
    print(f"resumed from {manager.latest_checkpoint}", flush=True)
    return task.checkpoint_step(manager.latest_checkpoint)


class SaveEveryEpoch(keras.callbacks.Callback):
    """Saves a checkpoint the evaluator follows after each epoch (the `checkpoint` state file is written
    last, so a reader never sees a half-written one); paces steps when STEP_PAUSE_SECONDS is set.

    List it before BackupAndRestore: a task killed between the two then repeats the epoch and saves its
    checkpoint again, where the other order would leave a backup that counts the epoch done and no checkpoint
    of it (the resumed run trains nothing more, and the evaluator's final checkpoint is the one before)."""

    def __new__(cls, model: keras.Model):
        # ParameterServerStrategy refuses any callback with a batch-level hook, so the step hook exists only on the
        # paced kind, made when STEP_PAUSE_SECONDS asks for pacing.
        if cls is SaveEveryEpoch and float(os.environ.get("STEP_PAUSE_SECONDS", "0")):
            cls = _PacedSaveEveryEpoch
        return super().__new__(cls)

    def __init__(self, model: keras.Model):
        super().__init__()
        self.manager = checkpoint_manager(model, model.optimizer.iterations)
        self.epochs_ended = 0  # in this run

    def on_epoch_begin(self, epoch, logs=None):
        # EPOCH_PAUSE_SECONDS stretches a run so that it can be watched, or disturbed on purpose. The pause comes
        # between epochs, after every callback of the one that ended (its backup too), so that a stop during it
        # loses nothing.
        if self.epochs_ended:
            time.sleep(float(os.environ.get("EPOCH_PAUSE_SECONDS", "0")))

    def on_epoch_end(self, epoch, logs=None):
        path = self.manager.save(checkpoint_number=epoch + 1)
        self.epochs_ended += 1
        if task.is_chief:
            print(f"saved {path} (epoch {epoch + 1})", flush=True)


class _PacedSaveEveryEpoch(SaveEveryEpoch):
    def __init__(self, model: keras.Model):
        super().__init__(model)
        self.step_pause = float(os.environ["STEP_PAUSE_SECONDS"])

    def on_train_batch_end(self, batch, logs=None):
        # Paces each step as examples/mwms_preemption.py does; the chief then says each step it trained, so that a
        # run killed mid-epoch shows how far it went (bench/preemption_save.py reads it).
        if task.is_chief:
            print(f"trained step {int(self.model.optimizer.iterations.numpy())}", flush=True)
        time.sleep(self.step_pause)


def write_metrics(model: keras.Model, strategy_name: str, epochs: int, replicas: int) -> dict:
    """Evaluates on the held-out digits; the chief writes metrics.json into the model dir.

    The trained weights are copied into a plain local model first: evaluating a distributed model
    would be collective under MultiWorkerMirroredStrategy and needs a repeated dataset under
    ParameterServerStrategy."""
    import json

    local = compile_model(make_model())
    local.set_weights(model.get_weights())
    loss, accuracy = local.evaluate(test_dataset(), verbose=0)
    metrics = {"loss": float(loss), "accuracy": float(accuracy), "epochs": epochs, "replicas": replicas,
               "strategy": strategy_name, "test_examples": int(len(splits()[1][0]))}
    print(f"{task.type}:{task.index} held-out loss {loss:.4f} accuracy {accuracy:.4f}", flush=True)
    if task.is_chief:
        os.makedirs(task.model_dir, exist_ok=True)
        with open(os.path.join(task.model_dir, "metrics.json"), "w") as f:
            json.dump(metrics, f)
    return metrics
