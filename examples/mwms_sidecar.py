"""MultiWorkerMirroredStrategy with Keras fit, evaluated by tf-keras's SidecarEvaluator, the way TensorFlow's
tutorials do it: every task runs this program, and the evaluator branches off to evaluate the checkpoints
that training saves.

Training saves its weights every epoch with ModelCheckpoint(save_weights_only=True), the flow SidecarEvaluator
documents for fit (under MultiWorkerMirroredStrategy only the chief's land in the checkpoint dir). The
evaluator runs SidecarEvaluator with max_evaluations=None, as its documentation does, and a TensorBoard callback
that writes into task.summary_dir: tfcluster reads those summaries, shows each evaluation in `tfcluster status`,
and stops the evaluator once it has evaluated the final checkpoint. With SIDECAR=tfcluster the evaluator runs
task.SidecarEvaluator instead, which takes the same arguments, ends by itself and reports its results.
"""

import os

from tfcluster import task
from tfcluster.demo import digits

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

EPOCHS = int(os.environ.get("EPOCHS", "4"))

if task.type == "evaluator":
    SidecarEvaluator = task.SidecarEvaluator if os.environ.get("SIDECAR") == "tfcluster" else \
        keras.utils.SidecarEvaluator
    SidecarEvaluator(
        model=digits.compile_model(digits.make_model()),
        data=digits.test_dataset(),
        checkpoint_dir=task.checkpoint_dir,
        max_evaluations=None,  # evaluate until stopped
        callbacks=[keras.callbacks.TensorBoard(log_dir=task.summary_dir)],
    ).start()
else:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch = digits.BATCH_PER_REPLICA * strategy.num_replicas_in_sync
    with strategy.scope():
        model = digits.compile_model(digits.make_model())
    model.fit(digits.train_dataset(global_batch), epochs=EPOCHS,
              steps_per_epoch=digits.steps_per_epoch(global_batch), verbose=2,
              callbacks=[keras.callbacks.ModelCheckpoint(os.path.join(task.checkpoint_dir, "ckpt-{epoch}"),
                                                         save_weights_only=True)])
