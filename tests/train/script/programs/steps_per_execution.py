"""fit() running several steps per call: a Functional MLP compiled with
steps_per_execution=4, 8 steps an epoch; mixed_bfloat16. In the shape of keras.io's
guide "Training & evaluation with the built-in methods", with the compile() option
Keras documents for small models.
"""

import keras
import numpy as np

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS, PER_EXECUTION = 16, 8, 2, 4


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(16)
  x = rng.normal(size=(BATCH * STEPS_PER_EPOCH, 24)).astype(np.float32)
  y = (x[:, :12].sum(1) > x[:, 12:].sum(1)).astype(np.float32)

  inputs = keras.Input((24,))
  h = keras.layers.Dense(32, activation="relu")(inputs)
  h = keras.layers.Dense(16, activation="relu")(h)
  outputs = keras.layers.Dense(1, activation="sigmoid", dtype="float32")(h)
  model = keras.Model(inputs, outputs, name="mlp_spe")
  model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"],
                steps_per_execution=PER_EXECUTION)
  model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0,
            callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                    log_every=5, sample_every=None))
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "mixed_bfloat16", "loop": "fit",
          "skipped_steps": 0, "loss_scale": None}
