"""A multi-input, multi-output Functional model: title and body token sequences and a
tags vector in, a priority and a department out, two losses with loss_weights, dict
inputs and targets; mixed_float16, the LossScaleOptimizer Keras adds itself. In the
shape of the multi-input, multi-output section of keras.io's guide "The Functional
API".
"""

import keras
import numpy as np

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS = 12, 8, 2
WORDS, TAGS, DEPARTMENTS = 60, 6, 4


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("mixed_float16")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(12)
  n = BATCH * STEPS_PER_EPOCH
  x = {"title": rng.integers(1, WORDS, (n, 8)), "body": rng.integers(1, WORDS, (n, 24)),
       "tags": rng.integers(0, 2, (n, TAGS)).astype(np.float32)}
  y = {"priority": rng.random((n, 1)).astype(np.float32),
       "department": rng.integers(0, DEPARTMENTS, n)}

  title = keras.Input((None,), dtype="int32", name="title")
  body = keras.Input((None,), dtype="int32", name="body")
  tags = keras.Input((TAGS,), name="tags")
  title_features = keras.layers.GlobalAveragePooling1D()(
      keras.layers.Embedding(WORDS, 16)(title))
  body_features = keras.layers.Conv1D(16, 3, activation="relu")(
      keras.layers.Embedding(WORDS, 16)(body))
  body_features = keras.layers.GlobalMaxPooling1D()(body_features)
  h = keras.layers.Concatenate()([title_features, body_features, tags])
  h = keras.layers.Dense(16, activation="relu")(h)
  priority = keras.layers.Dense(1, dtype="float32", name="priority")(h)
  department = keras.layers.Dense(DEPARTMENTS, activation="softmax", dtype="float32",
                                  name="department")(h)
  model = keras.Model([title, body, tags], [priority, department], name="ticket_router")
  model.compile(optimizer=keras.optimizers.RMSprop(1e-3),
                loss={"priority": "mean_squared_error",
                      "department": "sparse_categorical_crossentropy"},
                loss_weights={"priority": 1.0, "department": 0.2})
  model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0,
            callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                    log_every=5, sample_every=None))
  # The scale Keras chose (2**15) is not this program's: no loss_scale expected.
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "mixed_float16", "loop": "fit"}
