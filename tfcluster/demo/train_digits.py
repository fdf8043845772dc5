"""The demo's training program: a small tf-keras classifier on scikit-learn's handwritten digits.

Runs under whatever the job asked for (tfcluster sets TF_CONFIG and TFCLUSTER_STRATEGY): with two workers,
MultiWorkerMirroredStrategy synchronises every step across both processes. BackupAndRestore lets a
restarted group resume from its last epoch. The chief (worker 0) writes the held-out metrics to
<model_dir>/metrics.json.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

BATCH_PER_REPLICA = 32


def make_strategy(name: str) -> tf.distribute.Strategy:
    if name == "multi_worker_mirrored":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "central_storage":
        return tf.distribute.experimental.CentralStorageStrategy()
    return tf.distribute.MirroredStrategy()


def load_data() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order].astype("int64")
    split = int(len(x) * 0.8)
    return (x[:split], y[:split]), (x[split:], y[split:])


def main() -> None:
    strategy = make_strategy(os.environ.get("TFCLUSTER_STRATEGY", "mirrored"))
    epochs = int(os.environ.get("EPOCHS", "5"))
    task_type = os.environ.get("TFCLUSTER_TASK_TYPE", "worker")
    task_index = int(os.environ.get("TFCLUSTER_TASK_INDEX", "0"))
    is_chief = task_type == "chief" or (task_type == "worker" and task_index == 0 and "chief" not in
                                         json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {}))
    checkpoint_dir = os.environ.get("TFCLUSTER_CHECKPOINT_DIR") or tempfile.mkdtemp()
    model_dir = os.environ.get("TFCLUSTER_MODEL_DIR") or checkpoint_dir

    (x_train, y_train), (x_test, y_test) = load_data()
    global_batch = BATCH_PER_REPLICA * strategy.num_replicas_in_sync
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train = (tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(len(x_train), seed=1).repeat()
             .batch(global_batch).with_options(options))
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(global_batch).with_options(options)

    with strategy.scope():
        model = keras.Sequential([
            keras.layers.Input(shape=(64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])

    # Every worker must see the same backup dir name; non-chief workers write to their own copy.
    backup = keras.callbacks.BackupAndRestore(backup_dir=os.path.join(checkpoint_dir, "backup"))
    started = time.time()
    model.fit(train, epochs=epochs, steps_per_epoch=len(x_train) // global_batch, callbacks=[backup], verbose=2)
    loss, accuracy = model.evaluate(test, verbose=0)
    print(f"{task_type}:{task_index} held-out loss {loss:.4f} accuracy {accuracy:.4f} "
          f"({time.time() - started:.1f} s training)", flush=True)
    if is_chief:
        os.makedirs(model_dir, exist_ok=True)
        with open(os.path.join(model_dir, "metrics.json"), "w") as f:
            json.dump({"loss": float(loss), "accuracy": float(accuracy), "epochs": epochs,
                       "replicas": strategy.num_replicas_in_sync, "train_examples": len(x_train),
                       "test_examples": len(x_test)}, f)


if __name__ == "__main__":
    main()
