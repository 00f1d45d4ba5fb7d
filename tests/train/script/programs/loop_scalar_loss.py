"""A from-scratch regression loop whose step returns the loss tensor alone, on a
subclassed Conv1D model unbuilt until its first step, tracked without naming the
optimizer; float32. In the shape of keras.io's guides "Writing a training loop from
scratch in TensorFlow" and "Making new layers and models via subclassing".
"""

import keras
import numpy as np
import tensorflow as tf

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS = 16, 8, 2


class Forecaster(keras.Model):
  """Conv1D over a window of a series, then a Dense forecast of the next value."""

  def __init__(self):
    super().__init__(name="forecaster")
    self.conv = keras.layers.Conv1D(8, 3, activation="relu")
    self.pool = keras.layers.GlobalAveragePooling1D()
    self.out = keras.layers.Dense(1)

  def call(self, x):
    return self.out(self.pool(self.conv(x)))


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("float32")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(18)
  t = np.arange(BATCH * STEPS_PER_EPOCH + 20, dtype=np.float32)
  series = np.sin(t / 4) + 0.1 * rng.normal(size=t.shape).astype(np.float32)
  windows = np.stack([series[i:i + 20] for i in range(BATCH * STEPS_PER_EPOCH)])
  targets = series[20:20 + len(windows)]
  train = tf.data.Dataset.from_tensor_slices(
      (windows[..., None], targets[:, None])).shuffle(128, seed=0).batch(BATCH)

  model = Forecaster()  # Unbuilt: the first step builds it.
  optimizer = keras.optimizers.Adam(1e-2)

  @tf.function
  def train_step(x, y):
    with tf.GradientTape() as tape:
      loss = keras.ops.mean(keras.ops.square(model(x, training=True) - y))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)
    return loss

  run = mpt.track(run_dir, model, batch_size=BATCH, warmup_steps=2, log_every=5,
                  sample_every=None)
  step = run.step(train_step)
  with run:
    for _ in range(EPOCHS):
      for x, y in run.batches(train):
        loss = step(x, y)
      run.end_epoch({"loss": float(loss)})
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "float32", "loop": "custom",
          "skipped_steps": 0, "loss_scale": None}
