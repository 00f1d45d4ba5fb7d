"""Your own training loop under mpt: a Keras 3 `LossScaleOptimizer` loop (the recipe of
keras-team/keras#19479 and #20894) on a subclassed model, measured by `mpt.track`.

  python experiments/own_loop.py [--run_dir=logs/own_loop] [--policy=mixed_float16]
                                 [--epochs=2] [--image_size=32] [--batch_size=16]

Writes the run folder a `python -m mpt.main --loop=custom` run would (summary.json with
the loss scale and skipped steps, dtypes.json, TensorBoard tags) and prints mpt's
diagnosis at the end. Random images stand in for data, so it runs anywhere in seconds.
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import mpt  # noqa: E402


class Block(keras.layers.Layer):
  """Conv, BatchNorm, ReLU: a custom layer with layers inside."""

  def __init__(self, width: int, **kwargs):
    super().__init__(**kwargs)
    self.conv = keras.layers.Conv2D(width, 3, padding="same", use_bias=False)
    self.bn = keras.layers.BatchNormalization()

  def call(self, x, training=False):
    return keras.ops.relu(self.bn(self.conv(x), training=training))


class Net(keras.Model):
  """A subclassed model, the research style: no `inputs`, only a call."""

  def __init__(self, num_classes: int, width: int = 16):
    super().__init__(name="own_net")
    self.blocks = [Block(width, name="block1"), Block(2 * width, name="block2")]
    self.pool = keras.layers.GlobalAveragePooling2D()
    self.head = keras.layers.Dense(num_classes)
    self.probs = keras.layers.Activation("softmax", dtype="float32")  # float32 loss.

  def call(self, x, training=False):
    for block in self.blocks:
      x = block(x, training=training)
    return self.probs(self.head(self.pool(x)))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--run_dir", default="logs/own_loop")
  parser.add_argument("--policy", default="mixed_float16")
  parser.add_argument("--epochs", type=int, default=2)
  parser.add_argument("--image_size", type=int, default=32)
  parser.add_argument("--batch_size", type=int, default=16)
  args = parser.parse_args()
  keras.mixed_precision.set_global_policy(args.policy)
  rng = np.random.default_rng(0)
  images = rng.random((8 * args.batch_size, args.image_size, args.image_size, 3),
                      dtype=np.float32)
  labels = rng.integers(0, 10, len(images))
  train = tf.data.Dataset.from_tensor_slices((images, labels)).batch(args.batch_size)

  model = Net(10)
  optimizer = keras.optimizers.Adam(1e-3)
  if args.policy == "mixed_float16":
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  loss_fn = keras.losses.SparseCategoricalCrossentropy()

  @tf.function
  def train_step(x, y):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
      scaled = optimizer.scale_loss(loss)  # Keras 3: scale inside the tape.
    grads = tape.gradient(scaled, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)  # Unscales, skips non-finite.
    return {"loss": loss}

  run = mpt.track(args.run_dir, model, batch_size=args.batch_size, optimizer=optimizer,
                  input_shape=(args.image_size, args.image_size, 3), warmup_steps=2,
                  log_every=4)
  step = run.step(train_step)
  with run:
    for _ in range(args.epochs):
      for x, y in run.batches(train):
        logs = step(x, y)
      run.end_epoch({"loss": float(logs["loss"])})


if __name__ == "__main__":
  main()
