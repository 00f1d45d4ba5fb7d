"""Data-parallel training with tf.distribute.MirroredStrategy: the model built and
compiled inside the strategy's scope, fit() on a tf.data dataset batched at the
global batch size, with validation; float32 (on a CPU-only machine: one replica).

Follows in shape keras.io's guide "Multi-GPU distributed training with TensorFlow".
"""

import keras
import numpy as np
import tensorflow as tf

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS, CLASSES = 16, 8, 2, 3


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("float32")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(15)
  images = rng.random((BATCH * STEPS_PER_EPOCH + 32, 12, 12, 1), dtype=np.float32)
  labels = (images.mean(axis=(1, 2, 3)) * 100).astype(int) % CLASSES
  train = tf.data.Dataset.from_tensor_slices(
      (images[:-32], labels[:-32])).batch(BATCH).prefetch(2)
  val = tf.data.Dataset.from_tensor_slices((images[-32:], labels[-32:])).batch(BATCH)

  strategy = tf.distribute.MirroredStrategy()
  with strategy.scope():
    inputs = keras.Input((12, 12, 1))
    h = keras.layers.Conv2D(8, 3, activation="relu")(inputs)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(16, activation="relu")(h)
    outputs = keras.layers.Dense(CLASSES)(h)
    model = keras.Model(inputs, outputs, name="mirrored_net")
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
  model.fit(train, epochs=EPOCHS, validation_data=val, verbose=0,
            callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                    log_every=5, sample_every=None))
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "float32", "loop": "fit",
          "skipped_steps": 0, "loss_scale": None}
