"""Keras fit reading its input through the tf.data service: the job's data workers (CPU nodes) run the input
pipeline, the training task only trains.

tfcluster starts the dispatcher and the data workers before training and gives every task the dispatcher's
address in TFCLUSTER_DATA_SERVICE. `distribute` sends the dataset's definition to the service; in
"parallel_epochs" mode every data worker produces the whole dataset and the reader takes batches from all of
them, so a data worker that fails and is restarted leaves training running on the others.
"""

import os

import tensorflow as tf

from tfcluster import task
from tfcluster.demo import digits

EPOCHS = int(os.environ.get("EPOCHS", "3"))

strategy = task.make_strategy()  # MirroredStrategy: one task, all its GPUs
global_batch = digits.BATCH_PER_REPLICA * strategy.num_replicas_in_sync
dataset = digits.train_dataset(global_batch).apply(tf.data.experimental.service.distribute(
    processing_mode="parallel_epochs", service=os.environ["TFCLUSTER_DATA_SERVICE"], job_name="train"))
with strategy.scope():
    model = digits.compile_model(digits.make_model())

model.fit(dataset, epochs=EPOCHS, steps_per_epoch=digits.steps_per_epoch(global_batch),
          callbacks=[digits.SaveEveryEpoch(model)], verbose=2)
digits.write_metrics(model, task.strategy, EPOCHS, strategy.num_replicas_in_sync)
