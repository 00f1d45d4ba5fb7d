"""A loop that trains no weight: an image variable optimised through a frozen feature
extractor towards a content and a style target (Gram matrices), as neural style
transfer does; mpt.track around it. float32.

Follows in shape keras.io's example "Neural style transfer" (its Keras 3 version), with
a small random convnet in place of VGG19 (no download).
"""

import keras
import numpy as np
import tensorflow as tf

import mpt

STEPS, SIZE = 6, 16


def gram(features):
  flat = tf.reshape(features, (-1, features.shape[-1]))
  return tf.matmul(flat, flat, transpose_a=True) / tf.cast(tf.shape(flat)[0], tf.float32)


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("float32")
  keras.utils.set_random_seed(0)
  inputs = keras.Input((SIZE, SIZE, 3))
  h = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="block1")(inputs)
  h = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu",
                          name="block2")(h)
  extractor = keras.Model(inputs, h, name="feature_extractor")
  extractor.trainable = False
  rng = np.random.default_rng(2)
  content = tf.constant(rng.uniform(size=(1, SIZE, SIZE, 3)), tf.float32)
  style = tf.constant(rng.uniform(size=(1, SIZE, SIZE, 3)), tf.float32)
  image = tf.Variable(content)
  optimizer = keras.optimizers.SGD(5.0)
  optimizer.build([image])

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      features = extractor(tf.concat([image, content, style], axis=0))
      content_loss = tf.reduce_mean(tf.square(features[0] - features[1]))
      style_loss = tf.reduce_mean(tf.square(gram(features[0]) - gram(features[2])))
      loss = content_loss + 1e-2 * style_loss
    optimizer.apply([tape.gradient(loss, image)], [image])
    return {"loss": loss, "content_loss": content_loss, "style_loss": style_loss}

  run = mpt.track(run_dir, extractor, batch_size=1, optimizer=optimizer,
                  warmup_steps=2, log_every=5, sample_every=None)
  tracked = run.step(step)
  with run:
    for _ in range(STEPS):
      tracked()
  return {"status": "completed", "steps": STEPS, "epochs_completed": 0,
          "policy": "float32", "loop": "custom", "skipped_steps": 0, "loss_scale": None}
