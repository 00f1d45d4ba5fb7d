"""A training loop written from scratch: a Functional MLP, a tf.function step under
tf.GradientTape returning a dict of logs, metrics reset per epoch, a validation pass
at each epoch's end; float32, measured by mpt.track.

Follows in shape keras.io's guide "Writing a training loop from scratch in TensorFlow".
"""

import keras
import numpy as np
import tensorflow as tf

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS, CLASSES = 16, 8, 2, 3


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("float32")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(2)
  centres = rng.normal(size=(CLASSES, 20)).astype(np.float32)
  labels = rng.integers(0, CLASSES, BATCH * STEPS_PER_EPOCH + 32)
  features = centres[labels] + rng.normal(size=(len(labels), 20)).astype(np.float32)
  train = tf.data.Dataset.from_tensor_slices(
      (features[:-32], labels[:-32])).shuffle(128, seed=0).batch(BATCH)
  val = tf.data.Dataset.from_tensor_slices((features[-32:], labels[-32:])).batch(BATCH)

  inputs = keras.Input((20,), name="features")
  h = keras.layers.Dense(32, activation="relu")(inputs)
  h = keras.layers.Dense(32, activation="relu")(h)
  outputs = keras.layers.Dense(CLASSES, name="logits")(h)
  model = keras.Model(inputs, outputs, name="mlp_from_scratch")

  optimizer = keras.optimizers.SGD(learning_rate=1e-2, momentum=0.9)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  train_acc = keras.metrics.SparseCategoricalAccuracy()
  val_acc = keras.metrics.SparseCategoricalAccuracy()

  @tf.function
  def train_step(x, y):
    with tf.GradientTape() as tape:
      logits = model(x, training=True)
      loss = loss_fn(y, logits)
    grads = tape.gradient(loss, model.trainable_weights)
    optimizer.apply(grads, model.trainable_weights)
    train_acc.update_state(y, logits)
    return {"loss": loss, "accuracy": train_acc.result()}

  @tf.function
  def test_step(x, y):
    val_acc.update_state(y, model(x, training=False))

  run = mpt.track(run_dir, model, batch_size=BATCH, optimizer=optimizer,
                  warmup_steps=2, log_every=5, sample_every=None)
  step = run.step(train_step)
  with run:
    for _ in range(EPOCHS):
      for x, y in run.batches(train):
        logs = step(x, y)
      for x, y in val:
        test_step(x, y)
      run.end_epoch({"loss": float(logs["loss"]),
                     "accuracy": float(train_acc.result()),
                     "val_accuracy": float(val_acc.result())})
      train_acc.reset_state()
      val_acc.reset_state()
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "float32", "loop": "custom",
          "skipped_steps": 0, "loss_scale": None}
