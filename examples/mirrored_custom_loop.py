"""MirroredStrategy with a custom training loop: strategy.run, the loss scaled by the global batch.

Each epoch ends with a checkpoint (model, optimizer, step, epoch); a restarted task restores the newest
one and carries on from the next epoch.
"""

import os

from tfcluster import task
from tfcluster.demo import digits

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

EPOCHS = int(os.environ.get("EPOCHS", "5"))

strategy = tf.distribute.MirroredStrategy()
global_batch = digits.BATCH_PER_REPLICA * strategy.num_replicas_in_sync
steps = digits.steps_per_epoch(global_batch)

with strategy.scope():
    model = digits.make_model()
    optimizer = keras.optimizers.Adam(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=keras.losses.Reduction.NONE)
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    step = tf.Variable(0, dtype=tf.int64, trainable=False)
    epoch = tf.Variable(0, dtype=tf.int64, trainable=False)

checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step, epoch=epoch)
manager = tf.train.CheckpointManager(checkpoint, task.checkpoint_dir, max_to_keep=digits.CHECKPOINTS_KEPT)
if manager.latest_checkpoint:
    checkpoint.restore(manager.latest_checkpoint)
    print(f"resumed from {manager.latest_checkpoint} at epoch {int(epoch.numpy())}", flush=True)

batches = iter(strategy.experimental_distribute_dataset(digits.train_dataset(global_batch)))


@tf.function
def train_step(inputs):
    def replica_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            # Average over the global batch, not the replica's: gradients are summed across replicas.
            loss = tf.nn.compute_average_loss(loss_fn(y, logits), global_batch_size=global_batch)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        accuracy.update_state(y, logits)
        return loss

    losses = strategy.run(replica_step, args=inputs)
    step.assign_add(1)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


while int(epoch.numpy()) < EPOCHS:
    total = 0.0
    for _ in range(steps):
        total += float(train_step(next(batches)))
    epoch.assign_add(1)
    print(f"epoch {int(epoch.numpy())}/{EPOCHS}: loss {total / steps:.4f} accuracy {float(accuracy.result()):.4f}",
          flush=True)
    accuracy.reset_state()
    manager.save(checkpoint_number=int(epoch.numpy()))

digits.write_metrics(digits.compile_model(model), "mirrored", EPOCHS, strategy.num_replicas_in_sync)
