"""MultiWorkerMirroredStrategy with Keras fit: every worker runs this program; each step is synchronous.

BackupAndRestore lets a restarted group resume from its last epoch (its backup dir must be the same path
on every worker; non-chief workers write to their own copies). Every worker takes part in each
checkpoint save (it is collective); only the chief's lands in the checkpoint dir.
"""

import os

from tfcluster import task
from tfcluster.demo import digits

import tf_keras as keras  # noqa: E402

EPOCHS = int(os.environ.get("EPOCHS", "5"))

strategy = task.make_strategy()  # MultiWorkerMirroredStrategy from TF_CONFIG, NCCL when there are GPUs
global_batch = digits.BATCH_PER_REPLICA * strategy.num_replicas_in_sync
with strategy.scope():
    model = digits.compile_model(digits.make_model())

model.fit(digits.train_dataset(global_batch), epochs=EPOCHS, steps_per_epoch=digits.steps_per_epoch(global_batch),
          callbacks=[digits.SaveEveryEpoch(model),  # before the backup: see its docstring
                     keras.callbacks.BackupAndRestore(os.path.join(task.checkpoint_dir, "backup"))],
          verbose=2)
digits.write_metrics(model, task.strategy, EPOCHS, strategy.num_replicas_in_sync)
