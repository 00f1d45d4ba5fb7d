"""A small hyperparameter search in one process, in the shape of a KerasTuner random
search written by hand: each trial builds a convnet of another width, compiles and
fits it with its own mpt callbacks (its own run folder), one after the other. Three
trials: three models, three steps, three measurements.
"""

import keras
import numpy as np

import mpt

BATCH, STEPS, SIZE, CLASSES = 32, 30, 48, 10
WIDTHS = (16, 32, 64)


def build(width: int) -> keras.Model:
  inputs = keras.Input((SIZE, SIZE, 3))
  h = inputs
  for i in range(3):
    h = keras.layers.Conv2D(width * 2 ** i, 3, padding="same", use_bias=False)(h)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Activation("relu")(h)
    h = keras.layers.MaxPooling2D()(h)
  h = keras.layers.GlobalAveragePooling2D()(h)
  outputs = keras.layers.Dense(CLASSES, activation="softmax", dtype="float32")(h)
  return keras.Model(inputs, outputs, name=f"trial_w{width}")


def main(run_dir: str) -> dict:
  rng = np.random.default_rng(3)
  x = rng.random((BATCH * STEPS, SIZE, SIZE, 3), dtype=np.float32)
  y = rng.integers(0, CLASSES, len(x))
  for width in WIDTHS:
    model = build(width)
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
              callbacks=mpt.callbacks(f"{run_dir}/w{width}", batch_size=BATCH))
  return {"runs": [f"w{w}" for w in WIDTHS]}
