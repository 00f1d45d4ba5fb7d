"""The seed convnet as a plain Keras script: what a user writes without mpt.

  python experiments/peers/keras_plain.py --image_size=64 --policy=mixed_bfloat16 \
      --steps=30 --warmup=5 [--batchnorm=fused]

Prints one JSON line with the median step time after the warm-up. The model is written
out here rather than imported from mpt (the point is a script that owes mpt nothing):
the same layers as mpt's `seed_convnet` (BatchNorm momentum 0.9), compiled with Adam
1e-3 and sparse cross-entropy with accuracy, trained by `model.fit` on an in-memory
batch repeated by tf.data. Each step's loss is read in a callback, so a step's time
includes finishing it, as mpt's timed steps do. `--batchnorm=fused` swaps in mpt's
fused layer (mpt/models/fused_bn.py), to compare mpt with a plain script using the same
BatchNorm.
"""

import argparse
import json
import statistics
import time

import keras
import tensorflow as tf


def seed_convnet(image_size: int, fused: bool, num_classes: int = 10) -> keras.Model:
  if fused:
    from mpt.models.fused_bn import FusedBatchNormalization as BatchNorm
  else:
    BatchNorm = keras.layers.BatchNormalization
  inputs = keras.Input((image_size, image_size, 3))
  x = inputs
  for filters, kernel in ((32, 5), (64, 7), (128, 11)):
    x = keras.layers.Conv2D(filters, kernel, strides=2, padding="same",
                            activation="relu")(x)
    x = BatchNorm(momentum=0.9)(x)
  x = keras.layers.GlobalAveragePooling2D()(x)
  x = keras.layers.Dense(num_classes)(x)
  outputs = keras.layers.Activation("softmax", dtype="float32")(x)
  return keras.Model(inputs, outputs)


class StepTimes(keras.callbacks.Callback):

  def __init__(self):
    super().__init__()
    self.times = []

  def on_train_batch_begin(self, batch, logs=None):
    self.start = time.perf_counter()

  def on_train_batch_end(self, batch, logs=None):
    float(logs["loss"])  # Finish the step before stopping the clock.
    self.times.append((time.perf_counter() - self.start) * 1e3)


def train(image_size: int, batch_size: int, policy: str, steps: int, warmup: int,
          batchnorm: str = "keras", seed: int = 0) -> dict:
  keras.utils.set_random_seed(seed)
  keras.mixed_precision.set_global_policy(policy)
  model = seed_convnet(image_size, batchnorm == "fused")
  model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy",
                metrics=["accuracy"])
  images = tf.random.uniform((batch_size, image_size, image_size, 3))
  labels = tf.random.uniform((batch_size,), maxval=10, dtype=tf.int32)
  data = tf.data.Dataset.from_tensors((images, labels)).repeat().prefetch(2)
  timer = StepTimes()
  model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=[timer], verbose=0)
  return {"ms_per_step": statistics.median(timer.times[warmup:]),
          "timed_steps": len(timer.times[warmup:])}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--image_size", type=int, default=64)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--policy", default="float32",
                      choices=["float32", "mixed_bfloat16", "mixed_float16"])
  parser.add_argument("--batchnorm", choices=["keras", "fused"], default="keras")
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--warmup", type=int, default=5)
  args = parser.parse_args()
  print(json.dumps(train(args.image_size, args.batch_size, args.policy, args.steps,
                         args.warmup, args.batchnorm)))


if __name__ == "__main__":
  main()
