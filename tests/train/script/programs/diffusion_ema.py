"""A denoising diffusion model in the shape of keras.io's "Denoising Diffusion Implicit
Models" (its Keras 3 version), at toy sizes: a model with no call() of its own that
holds a small convolutional network and an EMA copy of it (keras.models.clone_model:
the same model name), its own train_step (noise the images, predict the noise, step
the network, move the EMA weights towards it) and test_step (the EMA copy predicts);
float32.
"""

import keras
import numpy as np
import tensorflow as tf

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS, SIZE, EMA = 8, 4, 2, 8, 0.99


def network() -> keras.Model:
  images = keras.Input((SIZE, SIZE, 3))
  noise_rates = keras.Input((1, 1, 1))
  x = keras.layers.Conv2D(8, 3, padding="same", activation="swish")(images)
  rates = keras.layers.UpSampling2D(SIZE)(noise_rates)
  x = keras.layers.Concatenate()([x, rates])
  x = keras.layers.Conv2D(8, 3, padding="same", activation="swish")(x)
  return keras.Model([images, noise_rates], keras.layers.Conv2D(3, 1)(x),
                     name="residual_unet")


class DiffusionModel(keras.Model):
  def __init__(self):
    super().__init__(name="diffusion_model")
    self.network = network()
    self.ema_network = keras.models.clone_model(self.network)
    self.noise_loss_tracker = keras.metrics.Mean(name="n_loss")

  @property
  def metrics(self):
    return [self.noise_loss_tracker]

  def denoise(self, noisy, rates, training):
    net = self.network if training else self.ema_network
    return net([noisy, rates ** 2], training=training)

  def train_step(self, images):
    noises = tf.random.normal(tf.shape(images))
    rates = tf.random.uniform((tf.shape(images)[0], 1, 1, 1), 0.1, 0.9)
    noisy = (1 - rates) * images + rates * noises
    with tf.GradientTape() as tape:
      predicted = self.denoise(noisy, rates, training=True)
      loss = keras.ops.mean(keras.ops.abs(noises - predicted))
    grads = tape.gradient(loss, self.network.trainable_weights)
    self.optimizer.apply_gradients(zip(grads, self.network.trainable_weights))
    self.noise_loss_tracker.update_state(loss)
    for weight, ema_weight in zip(self.network.weights, self.ema_network.weights):
      ema_weight.assign(EMA * ema_weight + (1 - EMA) * weight)
    return {m.name: m.result() for m in self.metrics}

  def test_step(self, images):
    noises = tf.random.normal(tf.shape(images))
    rates = tf.fill((tf.shape(images)[0], 1, 1, 1), 0.5)
    predicted = self.denoise(0.5 * images + 0.5 * noises, rates, training=False)
    self.noise_loss_tracker.update_state(keras.ops.mean(keras.ops.abs(noises - predicted)))
    return {m.name: m.result() for m in self.metrics}


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("float32")
  keras.utils.set_random_seed(0)
  images = np.random.default_rng(3).uniform(
      size=(BATCH * STEPS_PER_EPOCH, SIZE, SIZE, 3)).astype("float32")
  model = DiffusionModel()
  model.compile(optimizer=keras.optimizers.AdamW(1e-3))
  model.fit(tf.data.Dataset.from_tensor_slices(images).batch(BATCH), epochs=EPOCHS,
            validation_data=tf.data.Dataset.from_tensor_slices(images[:BATCH]).batch(BATCH),
            verbose=0, callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                               log_every=5, sample_every=None))
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "float32", "loop": "fit",
          "skipped_steps": 0, "loss_scale": None}
