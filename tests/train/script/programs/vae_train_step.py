"""A variational autoencoder as a keras.Model with no call(): encoder and decoder
inside, train_step computing reconstruction and KL losses with their own trackers,
fit() on images only; mixed_bfloat16. In the shape of keras.io's example
"Variational AutoEncoder" (its VAE class overriding train_step).
"""

import keras
import numpy as np
import tensorflow as tf

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS, LATENT = 16, 6, 2, 2


class Sampling(keras.layers.Layer):
  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.seeds = keras.random.SeedGenerator(13)

  def call(self, inputs):
    z_mean, z_log_var = inputs
    eps = keras.random.normal(keras.ops.shape(z_mean), dtype=z_mean.dtype,
                              seed=self.seeds)
    return z_mean + keras.ops.exp(0.5 * z_log_var) * eps


def make_encoder() -> keras.Model:
  inputs = keras.Input((8, 8, 1))
  h = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(inputs)
  h = keras.layers.Flatten()(h)
  h = keras.layers.Dense(16, activation="relu")(h)
  z_mean = keras.layers.Dense(LATENT, dtype="float32", name="z_mean")(h)
  z_log_var = keras.layers.Dense(LATENT, dtype="float32", name="z_log_var")(h)
  z = Sampling(dtype="float32", name="z")([z_mean, z_log_var])
  return keras.Model(inputs, [z_mean, z_log_var, z], name="encoder")


def make_decoder() -> keras.Model:
  return keras.Sequential([
      keras.Input((LATENT,)),
      keras.layers.Dense(4 * 4 * 8, activation="relu"),
      keras.layers.Reshape((4, 4, 8)),
      keras.layers.Conv2DTranspose(8, 3, strides=2, padding="same", activation="relu"),
      keras.layers.Conv2D(1, 3, padding="same"),
      keras.layers.Activation("sigmoid", dtype="float32"),
  ], name="decoder")


class VAE(keras.Model):
  def __init__(self, encoder, decoder):
    super().__init__(name="vae_no_call")
    self.encoder, self.decoder = encoder, decoder
    self.total = keras.metrics.Mean(name="loss")
    self.reconstruction = keras.metrics.Mean(name="reconstruction_loss")
    self.kl = keras.metrics.Mean(name="kl_loss")

  @property
  def metrics(self):
    return [self.total, self.reconstruction, self.kl]

  def train_step(self, images):
    with tf.GradientTape() as tape:
      z_mean, z_log_var, z = self.encoder(images, training=True)
      decoded = self.decoder(z, training=True)
      reconstruction = keras.ops.mean(keras.ops.sum(
          keras.losses.binary_crossentropy(images, decoded), axis=(1, 2)))
      kl = -0.5 * (1 + z_log_var - keras.ops.square(z_mean) - keras.ops.exp(z_log_var))
      kl = keras.ops.mean(keras.ops.sum(kl, axis=1))
      loss = reconstruction + kl
    grads = tape.gradient(loss, self.trainable_weights)
    self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
    self.total.update_state(loss)
    self.reconstruction.update_state(reconstruction)
    self.kl.update_state(kl)
    return {m.name: m.result() for m in self.metrics}


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(6)
  images = (rng.random((BATCH * STEPS_PER_EPOCH, 8, 8, 1)) > 0.7).astype(np.float32)

  vae = VAE(make_encoder(), make_decoder())
  vae.compile(optimizer=keras.optimizers.Adam(1e-3))
  vae.fit(images, epochs=EPOCHS, batch_size=BATCH, verbose=0,
          callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                  log_every=5, sample_every=None))
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "mixed_bfloat16", "loop": "fit",
          "skipped_steps": 0, "loss_scale": None}
