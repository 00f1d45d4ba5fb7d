"""Transfer learning then fine-tuning with one mpt callback list over two fits: a frozen
base with BatchNormalization under a new head, then unfrozen and recompiled with a
lower rate and a new LossScaleOptimizer; mixed_float16. In the shape of keras.io's
guide "Transfer learning & fine-tuning" (freeze, train the head, unfreeze, recompile).
"""

import keras
import numpy as np

import mpt

BATCH, STEPS_PER_EPOCH = 12, 8
HEAD_EPOCHS, TUNE_EPOCHS = 2, 1
HEAD_SCALE, TUNE_SCALE = 2.0 ** 10, 2.0 ** 9


def make_base() -> keras.Model:
  inputs = keras.Input((16, 16, 3))
  h = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
  h = keras.layers.BatchNormalization()(h)
  h = keras.layers.Activation("relu")(h)
  h = keras.layers.MaxPooling2D()(h)
  h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(h)
  return keras.Model(inputs, h, name="base")


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("mixed_float16")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(17)
  x = rng.random((BATCH * STEPS_PER_EPOCH, 16, 16, 3), dtype=np.float32)
  y = (x[:, :8].mean(axis=(1, 2, 3)) > x[:, 8:].mean(axis=(1, 2, 3))).astype(np.float32)

  base = make_base()
  base.trainable = False
  inputs = keras.Input((16, 16, 3))
  h = base(inputs, training=False)  # BatchNorm stays in inference mode, even unfrozen.
  h = keras.layers.GlobalAveragePooling2D()(h)
  h = keras.layers.Dropout(0.2)(h)
  outputs = keras.layers.Dense(1, dtype="float32")(h)
  model = keras.Model(inputs, outputs, name="fine_tuned")
  loss = keras.losses.BinaryCrossentropy(from_logits=True)
  cbs = mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2, log_every=5,
                      sample_every=None)

  model.compile(optimizer=keras.optimizers.LossScaleOptimizer(
      keras.optimizers.Adam(1e-3), initial_scale=HEAD_SCALE), loss=loss,
      metrics=[keras.metrics.BinaryAccuracy()])
  model.fit(x, y, batch_size=BATCH, epochs=HEAD_EPOCHS, verbose=0, callbacks=cbs)

  base.trainable = True
  model.compile(optimizer=keras.optimizers.LossScaleOptimizer(
      keras.optimizers.Adam(1e-5), initial_scale=TUNE_SCALE), loss=loss,
      metrics=[keras.metrics.BinaryAccuracy()])
  model.fit(x, y, batch_size=BATCH, epochs=TUNE_EPOCHS, verbose=0, callbacks=cbs)
  return {"status": "completed", "steps": STEPS_PER_EPOCH * (HEAD_EPOCHS + TUNE_EPOCHS),
          "epochs_completed": HEAD_EPOCHS + TUNE_EPOCHS, "policy": "mixed_float16",
          "loop": "fit", "skipped_steps": 0, "loss_scale": TUNE_SCALE}
