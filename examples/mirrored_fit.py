"""MirroredStrategy with Keras fit: one task trains on all of its node's GPUs it was given.

Run it with `tfcluster start examples/mirrored_fit.toml`. A restarted task resumes from the last
epoch (BackupAndRestore); every epoch leaves a checkpoint the evaluator follows.
"""

import os

from tfcluster import task
from tfcluster.demo import digits

import tensorflow as tf  # noqa: E402  (after tfcluster.demo.digits set TF_USE_LEGACY_KERAS)
import tf_keras as keras  # noqa: E402

EPOCHS = int(os.environ.get("EPOCHS", "5"))

strategy = tf.distribute.MirroredStrategy()
global_batch = digits.BATCH_PER_REPLICA * strategy.num_replicas_in_sync
with strategy.scope():
    model = digits.compile_model(digits.make_model())

model.fit(digits.train_dataset(global_batch), epochs=EPOCHS, steps_per_epoch=digits.steps_per_epoch(global_batch),
          callbacks=[digits.SaveEveryEpoch(model),  # before the backup: see its docstring
                     keras.callbacks.BackupAndRestore(os.path.join(task.checkpoint_dir, "backup"))],
          verbose=2)
digits.write_metrics(model, "mirrored", EPOCHS, strategy.num_replicas_in_sync)
