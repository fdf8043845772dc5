"""CentralStorageStrategy with Keras fit: one task; variables live on the CPU, computation is
replicated on the task's GPUs. BackupAndRestore does not support this strategy, so a restarted task
resumes from the newest epoch checkpoint instead (initial_epoch)."""

import os

from tfcluster.demo import digits

import tensorflow as tf  # noqa: E402

EPOCHS = int(os.environ.get("EPOCHS", "5"))

strategy = tf.distribute.experimental.CentralStorageStrategy()
global_batch = digits.BATCH_PER_REPLICA * strategy.num_replicas_in_sync
with strategy.scope():
    model = digits.compile_model(digits.make_model())

model.fit(digits.train_dataset(global_batch), epochs=EPOCHS, steps_per_epoch=digits.steps_per_epoch(global_batch),
          initial_epoch=digits.resume(model), callbacks=[digits.SaveEveryEpoch(model)], verbose=2)
digits.write_metrics(model, "central_storage", EPOCHS, strategy.num_replicas_in_sync)
