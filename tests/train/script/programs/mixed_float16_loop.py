"""A custom loop under mixed_float16, the Keras 3 LossScaleOptimizer recipe (scale_loss
in the tape, apply() of the scaled loss' gradients), the loss times 1e30 at two known
steps as a fault injector would: exactly those updates are skipped. In the shape of
keras.io's "Mixed precision" guide with a loop as in its guide "Writing a training
loop from scratch in TensorFlow".
"""

import keras
import numpy as np
import tensorflow as tf

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS, CLASSES = 8, 8, 2, 5
INITIAL_SCALE = 2.0 ** 10
FAULT_STEPS = (3, 11)  # Global steps, 1-based, whose gradients are made non-finite.


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("mixed_float16")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(14)
  images = rng.random((BATCH * STEPS_PER_EPOCH, 12, 12, 3), dtype=np.float32)
  labels = rng.integers(0, CLASSES, len(images))
  train = tf.data.Dataset.from_tensor_slices((images, labels)).batch(BATCH)

  inputs = keras.Input((12, 12, 3))
  h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
  h = keras.layers.MaxPooling2D()(h)
  h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(h)
  h = keras.layers.GlobalAveragePooling2D()(h)
  h = keras.layers.Dense(CLASSES)(h)
  outputs = keras.layers.Activation("softmax", dtype="float32")(h)
  model = keras.Model(inputs, outputs, name="fp16_convnet")

  optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3),
                                                  initial_scale=INITIAL_SCALE)
  # Built before the step is traced, so that scale_loss reads the dynamic scale
  # variable (an unbuilt one gives the initial scale as a constant).
  optimizer.build(model.trainable_variables)
  loss_fn = keras.losses.SparseCategoricalCrossentropy()
  fault = tf.Variable(1.0, trainable=False)  # What a fault injector sets.

  @tf.function
  def train_step(x, y):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
      scaled = optimizer.scale_loss(loss * fault)
    grads = tape.gradient(scaled, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)  # Skips non-finite gradients.
    return {"loss": loss}

  run = mpt.track(run_dir, model, batch_size=BATCH, optimizer=optimizer,
                  warmup_steps=2, log_every=5, sample_every=None)
  step = run.step(train_step)
  global_step = 0
  with run:
    for _ in range(EPOCHS):
      for x, y in run.batches(train):
        global_step += 1
        fault.assign(1e30 if global_step in FAULT_STEPS else 1.0)
        logs = step(x, y)
      run.end_epoch({"loss": float(logs["loss"])})
  # Each skipped step halves the scale; it grows only after 2000 good steps in a row.
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "mixed_float16", "loop": "custom",
          "skipped_steps": len(FAULT_STEPS),
          "loss_scale": INITIAL_SCALE / 2 ** len(FAULT_STEPS)}
