"""ParameterServerStrategy with Keras fit: this program runs on the chief, which coordinates; the ps and
worker tasks run tfcluster's built-in server (`python -m tfcluster.roles.server`), started and listening
before the chief. The evaluator follows the chief's checkpoints; BackupAndRestore resumes per epoch.
"""

import os

from tfcluster import task
from tfcluster.demo import digits

import tf_keras as keras  # noqa: E402

EPOCHS = int(os.environ.get("EPOCHS", "5"))

strategy = task.make_strategy()  # ParameterServerStrategy over TF_CONFIG's ps and workers
global_batch = digits.BATCH_PER_REPLICA * task.num_workers
with strategy.scope():
    model = digits.compile_model(digits.make_model(), steps_per_execution=4)

model.fit(digits.train_dataset(global_batch), epochs=EPOCHS, steps_per_epoch=digits.steps_per_epoch(global_batch),
          callbacks=[digits.SaveEveryEpoch(model),  # before the backup: see its docstring
                     keras.callbacks.BackupAndRestore(os.path.join(task.checkpoint_dir, "backup"))],
          verbose=2)
digits.write_metrics(model, "parameter_server", EPOCHS, task.num_workers)
