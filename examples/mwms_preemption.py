"""MultiWorkerMirroredStrategy custom loop that survives preemption: PreemptionCheckpointHandler.

On the job's stop signal ([preemption] signal: `tfcluster stop`, a preemption by a job of a higher class and
`tfcluster node drain --requeue` send it) every worker saves a checkpoint at the same step and exits with code
42. tfcluster restarts a group that exited 42 without using the restart budget, a preempted job resumes at the
saved step when it is placed again, and after `tfcluster stop` a new job with the same checkpoint_dir resumes
there. task.preemption_handler wires the signal and restores that checkpoint when it is created.
"""

import os
import time

from tfcluster import task
from tfcluster.demo import digits

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

EPOCHS = int(os.environ.get("EPOCHS", "5"))
STEP_PAUSE_SECONDS = float(os.environ.get("STEP_PAUSE_SECONDS", "0"))

strategy = task.make_strategy()
global_batch = digits.BATCH_PER_REPLICA * strategy.num_replicas_in_sync
steps = digits.steps_per_epoch(global_batch)

with strategy.scope():
    model = digits.make_model()
    optimizer = keras.optimizers.Adam(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=keras.losses.Reduction.NONE)
    step = tf.Variable(0, dtype=tf.int64, trainable=False)

checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
# Created on the main thread: it installs the stop signal's handler. Non-chief workers save to temp dirs.
handler = task.preemption_handler(checkpoint, os.path.join(task.checkpoint_dir, "preemption"), strategy)
if handler.total_run_calls:
    print(f"resumed at step {handler.total_run_calls}", flush=True)

batches = iter(strategy.experimental_distribute_dataset(digits.train_dataset(global_batch)))


@tf.function
def train_step(inputs):
    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)), global_batch_size=global_batch)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    step.assign_add(1)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=inputs), axis=None)


first_step = True
for epoch in range(handler.total_run_calls // steps, EPOCHS):
    for _ in range(handler.total_run_calls % steps, steps):
        loss = handler.run(train_step, next(batches))
        if first_step:  # the group is training: its collectives are up (how long a restart took ends here)
            print(f"training at step {int(step.numpy())} with {strategy.num_replicas_in_sync} replicas", flush=True)
            first_step = False
        time.sleep(STEP_PAUSE_SECONDS)
    print(f"epoch {epoch + 1}/{EPOCHS}: loss {float(loss):.4f} (step {int(step.numpy())})", flush=True)

digits.write_metrics(model, task.strategy, EPOCHS, strategy.num_replicas_in_sync)
