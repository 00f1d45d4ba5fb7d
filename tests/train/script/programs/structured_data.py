"""A classifier of structured records: a dict of named inputs, numeric features through
adapted Normalization layers, a string category one-hot by StringLookup, an integer
category through IntegerLookup and an Embedding; mixed_bfloat16. In the shape of
keras.io's example "Structured data classification from scratch".
"""

import keras
import numpy as np
import tensorflow as tf

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS = 16, 8, 2
CITIES = np.array(["paris", "lyon", "nice", "lille"])


def make_records(rng: np.random.Generator, n: int):
  features = {
      "age": rng.uniform(18, 80, (n, 1)).astype(np.float32),
      "income": rng.lognormal(10, 0.5, (n, 1)).astype(np.float32),
      "city": rng.choice(CITIES, (n, 1)),
      "plan": rng.integers(1, 4, (n, 1)).astype(np.int64),
  }
  score = (features["age"][:, 0] > 45) + (features["plan"][:, 0] == 3) + \
      (features["city"][:, 0] == "nice")
  return features, (score >= 2).astype(np.float32)


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(10)
  features, labels = make_records(rng, BATCH * STEPS_PER_EPOCH)
  val_features, val_labels = make_records(rng, 32)
  train = tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH)
  val = tf.data.Dataset.from_tensor_slices((val_features, val_labels)).batch(BATCH)

  inputs = {"age": keras.Input((1,), name="age"),
            "income": keras.Input((1,), name="income"),
            "city": keras.Input((1,), dtype="string", name="city"),
            "plan": keras.Input((1,), dtype="int64", name="plan")}
  encoded = []
  for name in ("age", "income"):
    norm = keras.layers.Normalization(name=f"{name}_norm")
    norm.adapt(features[name])
    encoded.append(norm(inputs[name]))
  city = keras.layers.StringLookup(vocabulary=list(CITIES), output_mode="one_hot",
                                   name="city_lookup")
  encoded.append(city(inputs["city"]))
  plan = keras.layers.IntegerLookup(vocabulary=[1, 2, 3], name="plan_lookup")
  embedded = keras.layers.Embedding(4, 3, name="plan_embedding")(plan(inputs["plan"]))
  encoded.append(keras.layers.Flatten()(embedded))
  h = keras.layers.Concatenate()(encoded)
  h = keras.layers.Dense(16, activation="relu")(h)
  h = keras.layers.Dropout(0.2)(h)
  outputs = keras.layers.Dense(1, activation="sigmoid", dtype="float32")(h)
  model = keras.Model(inputs, outputs, name="records_classifier")
  model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
  model.fit(train, epochs=EPOCHS, validation_data=val, verbose=0,
            callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                    log_every=5, sample_every=None))
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "mixed_bfloat16", "loop": "fit",
          "skipped_steps": 0, "loss_scale": None}
