"""A siamese network: two keras.Input images through one shared, nested Functional
embedding model, a Lambda euclidean distance, a custom contrastive loss; fit() on
pairs; float32. In the shape of keras.io's example "Image similarity estimation
using a Siamese Network with a contrastive loss".
"""

import keras
import numpy as np

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS, CLASSES = 12, 8, 2, 4


def euclidean_distance(vectors):
  a, b = vectors
  squared = keras.ops.sum(keras.ops.square(a - b), axis=1, keepdims=True)
  return keras.ops.sqrt(keras.ops.maximum(squared, keras.backend.epsilon()))


def contrastive_loss(margin: float = 1.0):
  """Pulls pairs labelled 1 (same class) together, pushes the others past `margin`."""
  def loss(y_true, y_pred):
    y_true = keras.ops.cast(y_true, y_pred.dtype)
    same = y_true * keras.ops.square(y_pred)
    apart = (1 - y_true) * keras.ops.square(keras.ops.maximum(margin - y_pred, 0))
    return keras.ops.mean(same + apart)
  return loss


def make_pairs(rng: np.random.Generator, n: int):
  """Pairs of 8x8 images, each class a stripe pattern plus noise; half the pairs of
  one class."""
  patterns = rng.random((CLASSES, 8, 8, 1)).astype(np.float32)
  first = rng.integers(0, CLASSES, n)
  same = rng.integers(0, 2, n)
  second = np.where(same == 1, first, (first + rng.integers(1, CLASSES, n)) % CLASSES)
  noise = lambda: 0.3 * rng.random((n, 8, 8, 1)).astype(np.float32)  # noqa: E731
  return patterns[first] + noise(), patterns[second] + noise(), same.astype(np.float32)


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("float32")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(13)
  left, right, same = make_pairs(rng, BATCH * STEPS_PER_EPOCH)

  image = keras.Input((8, 8, 1))
  h = keras.layers.Conv2D(8, 3, activation="tanh")(image)
  h = keras.layers.AveragePooling2D(pool_size=2)(h)
  h = keras.layers.Flatten()(h)
  h = keras.layers.BatchNormalization()(h)
  embedding = keras.Model(image, keras.layers.Dense(8, activation="tanh")(h),
                          name="embedding")
  input_1, input_2 = keras.Input((8, 8, 1)), keras.Input((8, 8, 1))
  distance = keras.layers.Lambda(euclidean_distance, output_shape=(1,))(
      [embedding(input_1), embedding(input_2)])
  h = keras.layers.BatchNormalization()(distance)
  outputs = keras.layers.Dense(1, activation="sigmoid")(h)
  siamese = keras.Model([input_1, input_2], outputs, name="siamese")
  siamese.compile(optimizer="rmsprop", loss=contrastive_loss(margin=1.0),
                  metrics=["accuracy"])
  siamese.fit([left, right], same, batch_size=BATCH, epochs=EPOCHS, verbose=0,
              callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                      log_every=5, sample_every=None))
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "float32", "loop": "fit",
          "skipped_steps": 0, "loss_scale": None}
