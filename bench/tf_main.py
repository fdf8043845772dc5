"""TensorFlow's multi-worker tutorial program (main.py with mnist_setup's model), on synthetic MNIST-shaped data
so that it needs no download: every worker runs it with TF_CONFIG in its environment. EPOCHS sets its length."""

import json
import os

import numpy as np
import tensorflow as tf
import tf_keras as keras

EPOCHS = int(os.environ.get("EPOCHS", "3"))
STEPS_PER_EPOCH = 20
PER_WORKER_BATCH = 64


def mnist_dataset(batch_size):
    rng = np.random.default_rng(0)
    x_train = rng.random((6000, 28, 28), dtype=np.float32)
    y_train = rng.integers(0, 10, 6000).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(6000).repeat().batch(batch_size)


def build_and_compile_cnn_model():
    model = keras.Sequential([
        keras.layers.InputLayer(input_shape=(28, 28)),
        keras.layers.Reshape(target_shape=(28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(learning_rate=0.001), metrics=["accuracy"])
    return model


num_workers = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
strategy = tf.distribute.MultiWorkerMirroredStrategy()
dataset = mnist_dataset(PER_WORKER_BATCH * num_workers)
with strategy.scope():
    model = build_and_compile_cnn_model()
model.fit(dataset, epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH, verbose=2)
