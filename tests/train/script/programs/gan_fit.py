"""A GAN trained by fit(): a keras.Model with no call() holding a generator and a
discriminator, compile() overridden to take two optimizers (d_optimizer,
g_optimizer) and a loss, train_step updating each network in turn; float32.

Follows in shape keras.io's example "GAN overriding `Model.train_step`" (DCGAN).
"""

import keras
import numpy as np
import tensorflow as tf

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS, LATENT = 12, 8, 2, 8


def make_generator() -> keras.Model:
  return keras.Sequential([
      keras.Input((LATENT,)),
      keras.layers.Dense(4 * 4 * 16),
      keras.layers.LeakyReLU(negative_slope=0.2),
      keras.layers.Reshape((4, 4, 16)),
      keras.layers.Conv2DTranspose(16, 4, strides=2, padding="same"),
      keras.layers.LeakyReLU(negative_slope=0.2),
      keras.layers.Conv2D(1, 3, padding="same", activation="sigmoid"),
  ], name="generator")


def make_discriminator() -> keras.Model:
  return keras.Sequential([
      keras.Input((8, 8, 1)),
      keras.layers.Conv2D(8, 3, strides=2, padding="same"),
      keras.layers.LeakyReLU(negative_slope=0.2),
      keras.layers.Conv2D(16, 3, strides=2, padding="same"),
      keras.layers.LeakyReLU(negative_slope=0.2),
      keras.layers.GlobalMaxPooling2D(),
      keras.layers.Dense(1),
  ], name="discriminator")


class GAN(keras.Model):
  """No call(): fit only ever runs train_step."""

  def __init__(self, discriminator, generator):
    super().__init__(name="gan")
    self.discriminator, self.generator = discriminator, generator
    self.seeds = keras.random.SeedGenerator(7)

  def compile(self, d_optimizer, g_optimizer, loss_fn):
    super().compile()
    self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn
    self.d_loss_metric = keras.metrics.Mean(name="d_loss")
    self.g_loss_metric = keras.metrics.Mean(name="g_loss")

  @property
  def metrics(self):
    return [self.d_loss_metric, self.g_loss_metric]

  def train_step(self, real_images):
    batch = tf.shape(real_images)[0]
    noise = keras.random.normal((batch, LATENT), seed=self.seeds)
    fakes = self.generator(noise)
    images = tf.concat([fakes, real_images], axis=0)
    labels = tf.concat([tf.ones((batch, 1)), tf.zeros((batch, 1))], axis=0)
    labels += 0.05 * keras.random.uniform(tf.shape(labels), seed=self.seeds)
    with tf.GradientTape() as tape:
      d_loss = self.loss_fn(labels, self.discriminator(images))
    grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
    self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))

    noise = keras.random.normal((batch, LATENT), seed=self.seeds)
    with tf.GradientTape() as tape:  # Fool the discriminator: "real" is 0.
      g_loss = self.loss_fn(tf.zeros((batch, 1)),
                            self.discriminator(self.generator(noise)))
    grads = tape.gradient(g_loss, self.generator.trainable_weights)
    self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
    self.d_loss_metric.update_state(d_loss)
    self.g_loss_metric.update_state(g_loss)
    return {m.name: m.result() for m in self.metrics}


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("float32")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(3)
  real = np.zeros((BATCH * STEPS_PER_EPOCH, 8, 8, 1), np.float32)  # Bright squares.
  for image, (r, c) in zip(real, rng.integers(0, 5, (len(real), 2))):
    image[r:r + 4, c:c + 4] = 1.0
  dataset = tf.data.Dataset.from_tensor_slices(real).shuffle(96, seed=0).batch(BATCH)

  gan = GAN(make_discriminator(), make_generator())
  gan.compile(d_optimizer=keras.optimizers.Adam(3e-4, beta_1=0.5),
              g_optimizer=keras.optimizers.Adam(3e-4, beta_1=0.5),
              loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
  gan.fit(dataset, epochs=EPOCHS, verbose=0,
          callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                  log_every=5, sample_every=None))
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "float32", "loop": "fit",
          "skipped_steps": 0, "loss_scale": None}
