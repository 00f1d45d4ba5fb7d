"""An image classifier: a small Sequential convnet, compile() and fit() with a
validation set, under mixed_bfloat16 (its softmax in float32).

Follows in shape keras.io's "Simple MNIST convnet" and "Image classification from
scratch" examples (augmentation layers in the model, Conv2D/pooling blocks, dropout).
"""

import keras
import numpy as np

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS, CLASSES = 12, 8, 2, 4


def make_images(rng: np.random.Generator, n: int):
  """Noise images whose class brightens one quadrant: learnable, tiny."""
  labels = rng.integers(0, CLASSES, n)
  images = rng.random((n, 16, 16, 3), dtype=np.float32) * 0.5
  for i, label in enumerate(labels):
    row, col = divmod(int(label), 2)
    images[i, row * 8:row * 8 + 8, col * 8:col * 8 + 8, :] += 0.5
  return images, labels


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(0)
  x_train, y_train = make_images(rng, BATCH * STEPS_PER_EPOCH)
  x_val, y_val = make_images(rng, 24)

  model = keras.Sequential([
      keras.Input((16, 16, 3)),
      keras.layers.RandomFlip("horizontal"),
      keras.layers.Conv2D(8, 3, activation="relu"),
      keras.layers.MaxPooling2D(),
      keras.layers.Conv2D(16, 3, activation="relu"),
      keras.layers.GlobalAveragePooling2D(),
      keras.layers.Dropout(0.25),
      keras.layers.Dense(CLASSES),
      keras.layers.Activation("softmax", dtype="float32"),
  ], name="image_classifier")
  model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                metrics=["accuracy"])
  model.fit(x_train, y_train, batch_size=BATCH, epochs=EPOCHS,
            validation_data=(x_val, y_val), verbose=0,
            callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                    log_every=5, sample_every=None))
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "mixed_bfloat16", "loop": "fit",
          "skipped_steps": 0, "loss_scale": None}
