"""A GAN in a loop written from scratch: two Sequential networks, two optimizers, a
tf.function step returning the tuple (d_loss, g_loss, generated_images), tracked with
both models and both optimizers; mixed_bfloat16 (the score in float32). In the shape
of the GAN section of keras.io's guide "Writing a training loop from scratch in
TensorFlow".
"""

import keras
import numpy as np
import tensorflow as tf

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS, LATENT = 16, 6, 2, 8


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(4)
  # "Digits": a bright bar at a random row of an 8x8 image.
  real = np.zeros((BATCH * STEPS_PER_EPOCH, 8, 8, 1), np.float32)
  for image, row in zip(real, rng.integers(0, 8, len(real))):
    image[row, 1:7] = 1.0
  dataset = tf.data.Dataset.from_tensor_slices(real).shuffle(96, seed=0).batch(BATCH)

  generator = keras.Sequential([
      keras.Input((LATENT,)),
      keras.layers.Dense(4 * 4 * 8, activation="relu"),
      keras.layers.Reshape((4, 4, 8)),
      keras.layers.UpSampling2D(),
      keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
      keras.layers.Conv2D(1, 3, padding="same", activation="sigmoid"),
  ], name="generator")
  discriminator = keras.Sequential([
      keras.Input((8, 8, 1)),
      keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu"),
      keras.layers.Flatten(),
      keras.layers.Dense(1, dtype="float32"),
  ], name="discriminator")
  d_optimizer = keras.optimizers.Adam(1e-3)
  g_optimizer = keras.optimizers.Adam(1e-3)
  loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

  @tf.function
  def train_step(real_images):
    batch = tf.shape(real_images)[0]
    noise = tf.random.normal((batch, LATENT))
    generated = generator(noise)
    images = tf.concat([tf.cast(generated, real_images.dtype), real_images], axis=0)
    labels = tf.concat([tf.ones((batch, 1)), tf.zeros((batch, 1))], axis=0)
    with tf.GradientTape() as tape:
      d_loss = loss_fn(labels, discriminator(images, training=True))
    grads = tape.gradient(d_loss, discriminator.trainable_weights)
    d_optimizer.apply(grads, discriminator.trainable_weights)

    noise = tf.random.normal((batch, LATENT))
    with tf.GradientTape() as tape:
      g_loss = loss_fn(tf.zeros((batch, 1)),
                       discriminator(generator(noise, training=True)))
    grads = tape.gradient(g_loss, generator.trainable_weights)
    g_optimizer.apply(grads, generator.trainable_weights)
    return d_loss, g_loss, generated

  run = mpt.track(run_dir, (generator, discriminator), batch_size=BATCH,
                  optimizer=(d_optimizer, g_optimizer), warmup_steps=2, log_every=5,
                  sample_every=None)
  step = run.step(train_step)
  with run:
    for _ in range(EPOCHS):
      for real_images in run.batches(dataset):
        d_loss, g_loss, _ = step(real_images)
      run.end_epoch({"d_loss": float(d_loss), "g_loss": float(g_loss)})
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "mixed_bfloat16", "loop": "custom",
          "skipped_steps": 0, "loss_scale": None}
