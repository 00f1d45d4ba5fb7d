"""A recurrent classifier over padded integer sequences: Embedding with mask_zero,
two stacked Bidirectional LSTMs, a sigmoid head; mixed_float16 with a
LossScaleOptimizer of a fixed initial scale given to compile().

Follows in shape keras.io's example "Bidirectional LSTM on IMDB".
"""

import keras
import numpy as np

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS = 16, 6, 2
VOCAB, LENGTH = 30, 12
INITIAL_SCALE = 2.0 ** 12


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("mixed_float16")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(9)
  n = BATCH * STEPS_PER_EPOCH
  sequences = np.zeros((n, LENGTH), np.int32)  # Zero-padded at the end.
  labels = rng.integers(0, 2, n).astype(np.float32)
  for row, label in zip(sequences, labels):
    length = int(rng.integers(4, LENGTH + 1))
    row[:length] = rng.integers(1, VOCAB // 2, length) + (VOCAB // 2 - 1) * int(label)

  inputs = keras.Input((None,), dtype="int32")
  h = keras.layers.Embedding(VOCAB, 8, mask_zero=True)(inputs)
  h = keras.layers.Bidirectional(keras.layers.LSTM(8, return_sequences=True))(h)
  h = keras.layers.Bidirectional(keras.layers.LSTM(8))(h)
  outputs = keras.layers.Dense(1, activation="sigmoid", dtype="float32")(h)
  model = keras.Model(inputs, outputs, name="bilstm")
  optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3),
                                                  initial_scale=INITIAL_SCALE)
  model.compile(optimizer=optimizer, loss="binary_crossentropy", metrics=["accuracy"])
  model.fit(sequences, labels, batch_size=BATCH, epochs=EPOCHS, verbose=0,
            callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                    log_every=5, sample_every=None))
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "mixed_float16", "loop": "fit",
          "skipped_steps": 0, "loss_scale": INITIAL_SCALE}
