"""A text classifier trained with a custom `keras.losses.Loss` subclass (a focal loss:
cross-entropy down-weighted on confident examples), in the shape of keras.io's guide
"Training & evaluation with the built-in methods" (its custom-loss section) on the
token model of "Text classification from scratch" (embedding, 1-D convolutions).
"""

import keras
import numpy as np

import mpt

BATCH, STEPS, LENGTH, VOCAB = 64, 40, 256, 20000


class FocalLoss(keras.losses.Loss):
  """Binary focal loss on logits."""

  def __init__(self, gamma: float = 2.0, name: str = "focal"):
    super().__init__(name=name)
    self.gamma = gamma

  def call(self, y_true, y_pred):
    y_true = keras.ops.cast(y_true, y_pred.dtype)
    p = keras.ops.sigmoid(y_pred)
    ce = keras.ops.binary_crossentropy(y_true, y_pred, from_logits=True)
    p_t = y_true * p + (1 - y_true) * (1 - p)
    return keras.ops.mean(ce * (1 - p_t) ** self.gamma, axis=-1)


def main(run_dir: str) -> dict:
  rng = np.random.default_rng(2)
  x = rng.integers(0, VOCAB, (BATCH * STEPS, LENGTH)).astype("int32")
  y = rng.integers(0, 2, (len(x), 1)).astype("float32")
  inputs = keras.Input((LENGTH,), dtype="int32")
  h = keras.layers.Embedding(VOCAB, 128)(inputs)
  h = keras.layers.Conv1D(128, 7, strides=3, activation="relu")(h)
  h = keras.layers.Conv1D(128, 7, strides=3, activation="relu")(h)
  h = keras.layers.GlobalMaxPooling1D()(h)
  h = keras.layers.Dense(128, activation="relu")(h)
  outputs = keras.layers.Dense(1, dtype="float32")(h)
  model = keras.Model(inputs, outputs, name="text_focal")
  model.compile("adam", FocalLoss(), metrics=[keras.metrics.BinaryAccuracy(threshold=0.0)])
  model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
            callbacks=mpt.callbacks(f"{run_dir}/focal", batch_size=BATCH))
  return {"runs": ["focal"]}
