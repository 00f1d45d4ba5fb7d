"""A subclassed model overriding train_step and test_step, trained by fit(): its own
loss and metric trackers, the optimizer from compile(); float32.

Follows in shape keras.io's guide "Customizing what happens in `fit()` with
TensorFlow" (the lower-level variant: no compiled loss, metrics listed by the model).
"""

import keras
import numpy as np
import tensorflow as tf

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS = 10, 10, 2


class Regressor(keras.Model):
  """Two Dense layers; fit runs its own steps."""

  def __init__(self):
    super().__init__(name="custom_regressor")
    self.hidden = keras.layers.Dense(16, activation="relu")
    self.out = keras.layers.Dense(1)
    self.loss_tracker = keras.metrics.Mean(name="loss")
    self.mae = keras.metrics.MeanAbsoluteError(name="mae")

  def call(self, x, training=False):
    return self.out(self.hidden(x))

  @property
  def metrics(self):
    return [self.loss_tracker, self.mae]  # Reset by fit at each epoch's start.

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      y_pred = self(x, training=True)
      loss = keras.ops.mean(keras.ops.square(y - y_pred))
    grads = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply(grads, self.trainable_variables)
    self.loss_tracker.update_state(loss)
    self.mae.update_state(y, y_pred)
    return {"loss": self.loss_tracker.result(), "mae": self.mae.result()}

  def test_step(self, data):
    x, y = data
    y_pred = self(x, training=False)
    self.loss_tracker.update_state(keras.ops.mean(keras.ops.square(y - y_pred)))
    self.mae.update_state(y, y_pred)
    return {"loss": self.loss_tracker.result(), "mae": self.mae.result()}


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("float32")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(1)
  weights = rng.normal(size=(8, 1)).astype(np.float32)
  x = rng.normal(size=(BATCH * STEPS_PER_EPOCH + 20, 8)).astype(np.float32)
  y = x @ weights + 0.1 * rng.normal(size=(len(x), 1)).astype(np.float32)
  train = tf.data.Dataset.from_tensor_slices((x[:-20], y[:-20])).batch(BATCH)
  val = tf.data.Dataset.from_tensor_slices((x[-20:], y[-20:])).batch(BATCH)

  model = Regressor()
  model.compile(optimizer=keras.optimizers.Adam(1e-2))
  model.fit(train, epochs=EPOCHS, validation_data=val, verbose=0,
            callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                    log_every=5, sample_every=None))
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "float32", "loop": "fit",
          "skipped_steps": 0, "loss_scale": None}
