"""The demo's training program: a small tf-keras classifier on scikit-learn's handwritten digits.

Runs under the strategy the job asked for (TFCLUSTER_STRATEGY, TF_CONFIG): with two workers,
MultiWorkerMirroredStrategy synchronises every step across both processes. BackupAndRestore lets a
restarted group resume from its last epoch; each epoch leaves a checkpoint for an evaluator. The chief
writes the held-out metrics to <model_dir>/metrics.json.
"""

from __future__ import annotations

import os
import time

from tfcluster import task
from tfcluster.demo import digits

import tf_keras as keras  # noqa: E402  (after tfcluster.demo.digits set TF_USE_LEGACY_KERAS)


def main() -> None:
    epochs = int(os.environ.get("EPOCHS", "5"))
    strategy = task.make_strategy()
    global_batch = digits.BATCH_PER_REPLICA * strategy.num_replicas_in_sync
    with strategy.scope():
        model = digits.compile_model(digits.make_model())
    started = time.time()
    model.fit(digits.train_dataset(global_batch), epochs=epochs,
              steps_per_epoch=digits.steps_per_epoch(global_batch),
              callbacks=[digits.SaveEveryEpoch(model),  # before the backup: see its docstring
                         keras.callbacks.BackupAndRestore(os.path.join(task.checkpoint_dir, "backup"))],
              verbose=2)
    print(f"{task.type}:{task.index} trained {epochs} epochs in {time.time() - started:.1f} s", flush=True)
    digits.write_metrics(model, task.strategy, epochs, strategy.num_replicas_in_sync)


if __name__ == "__main__":
    main()
