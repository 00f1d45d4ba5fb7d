"""A text classifier on raw strings: TextVectorization (adapted on the training text)
inside the model, Embedding, pooling, a sigmoid head in float32, binary_accuracy;
mixed_bfloat16. In the shape of keras.io's example "Text classification from
scratch" (its end-to-end model taking strings), on generated sentences.
"""

import keras
import numpy as np
import tensorflow as tf

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS = 15, 8, 2
POSITIVE = ["good", "great", "fine", "lovely", "superb"]
NEGATIVE = ["bad", "awful", "poor", "dull", "boring"]
FILLER = ["the", "film", "was", "a", "plot", "and", "actors", "very", "it", "quite"]


def make_reviews(rng: np.random.Generator, n: int):
  """Sentences of filler words with a few opinion words; 1 where praise wins."""
  texts, labels = [], []
  for _ in range(n):
    label = int(rng.integers(0, 2))
    major, minor = (POSITIVE, NEGATIVE) if label else (NEGATIVE, POSITIVE)
    words = list(rng.choice(FILLER, rng.integers(4, 8)))
    words += list(rng.choice(major, 2)) + list(rng.choice(minor, 1))
    rng.shuffle(words)
    texts.append(" ".join(words))
    labels.append(label)
  return np.array(texts), np.array(labels, np.float32)


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(7)
  texts, labels = make_reviews(rng, BATCH * STEPS_PER_EPOCH)
  val_texts, val_labels = make_reviews(rng, 30)
  train = tf.data.Dataset.from_tensor_slices((texts, labels)).batch(BATCH)
  val = tf.data.Dataset.from_tensor_slices((val_texts, val_labels)).batch(BATCH)

  vectorize = keras.layers.TextVectorization(max_tokens=40, output_mode="int",
                                             output_sequence_length=12)
  vectorize.adapt(texts)
  inputs = keras.Input(shape=(), dtype="string", name="review")
  h = vectorize(inputs)
  h = keras.layers.Embedding(40, 16)(h)
  h = keras.layers.GlobalAveragePooling1D()(h)
  h = keras.layers.Dense(16, activation="relu")(h)
  h = keras.layers.Dropout(0.2)(h)
  outputs = keras.layers.Dense(1, activation="sigmoid", dtype="float32")(h)
  model = keras.Model(inputs, outputs, name="text_classifier")
  model.compile(optimizer="adam", loss="binary_crossentropy",
                metrics=["binary_accuracy"])
  model.fit(train, epochs=EPOCHS, validation_data=val, verbose=0,
            callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                    log_every=5, sample_every=None))
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "mixed_bfloat16", "loop": "fit",
          "skipped_steps": 0, "loss_scale": None}
