"""A U-Net segmenter: a per-pixel classifier with a downsampling path, an upsampling
path (Conv2DTranspose) and skip connections (Concatenate); mixed_bfloat16, the
per-pixel softmax kept in float32.

Follows in shape keras.io's example "Image segmentation with a U-Net-like
architecture" (its Keras 3 version), at toy sizes.
"""

import keras
import numpy as np

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS, SIZE, CLASSES = 4, 4, 2, 16, 3


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(4)
  n = BATCH * STEPS_PER_EPOCH
  images = rng.uniform(size=(n, SIZE, SIZE, 3)).astype("float32")
  masks = (images.mean(axis=-1) * CLASSES).astype("int32").clip(0, CLASSES - 1)

  inputs = keras.Input((SIZE, SIZE, 3))
  down1 = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
  down2 = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(down1)
  bottom = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(down2)
  up = keras.layers.Conv2DTranspose(8, 3, strides=2, padding="same",
                                    activation="relu")(bottom)
  merged = keras.layers.Concatenate()([up, down1])
  outputs = keras.layers.Conv2D(CLASSES, 1, activation="softmax", dtype="float32",
                                name="per_pixel")(merged)
  model = keras.Model(inputs, outputs, name="unet")
  model.compile(optimizer=keras.optimizers.Adam(1e-3),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
  model.fit(images, masks, batch_size=BATCH, epochs=EPOCHS, verbose=0,
            callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                    log_every=5, sample_every=None))
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "mixed_bfloat16", "loop": "fit",
          "skipped_steps": 0, "loss_scale": None}
