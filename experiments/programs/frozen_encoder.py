"""A classifier trained whole, then the same classifier on its frozen encoder, in one
process: the shape of keras.io's "Supervised Contrastive Learning" example, whose
encoder is a keras.applications ResNet50V2 (random weights here) and whose second
stage trains a new head with `encoder.trainable = False`. Two run folders: whole,
frozen. Their layers, inputs, loss and batch are the same; what trains is not.
"""

import keras
import numpy as np

import mpt

BATCH, STEPS, SIZE, CLASSES = 32, 30, 32, 10


def encoder() -> keras.Model:
  base = keras.applications.ResNet50V2(include_top=False, weights=None,
                                       input_shape=(SIZE, SIZE, 3), pooling="avg")
  inputs = keras.Input((SIZE, SIZE, 3))
  return keras.Model(inputs, base(inputs), name="encoder")


def classifier(enc: keras.Model) -> keras.Model:
  inputs = keras.Input((SIZE, SIZE, 3))
  h = keras.layers.Dropout(0.5)(enc(inputs))
  h = keras.layers.Dense(512, activation="relu")(h)
  outputs = keras.layers.Dense(CLASSES, activation="softmax", dtype="float32")(h)
  return keras.Model(inputs, outputs, name="classifier")


def main(run_dir: str) -> dict:
  rng = np.random.default_rng(1)
  x = rng.random((BATCH * STEPS, SIZE, SIZE, 3), dtype=np.float32)
  y = rng.integers(0, CLASSES, len(x))
  enc = encoder()
  for name in ("whole", "frozen"):
    enc.trainable = name == "whole"
    model = classifier(enc)
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
              callbacks=mpt.callbacks(f"{run_dir}/{name}", batch_size=BATCH))
  return {"runs": ["whole", "frozen"]}
