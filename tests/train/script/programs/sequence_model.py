"""A small transformer over integer token sequences: token and position embeddings,
one transformer block (multi-head self-attention, feed-forward, layer norms) as
custom layers, pooling, a softmax head; mixed_bfloat16.

Follows in shape keras.io's example "Text classification with Transformer".
"""

import keras
import numpy as np

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS = 16, 8, 2
VOCAB, LENGTH, DIM = 40, 16, 16


class TokenAndPosition(keras.layers.Layer):
  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.tokens = keras.layers.Embedding(VOCAB, DIM)
    self.positions = keras.layers.Embedding(LENGTH, DIM)

  def call(self, x):
    positions = keras.ops.arange(0, keras.ops.shape(x)[-1])
    return self.tokens(x) + self.positions(positions)


class TransformerBlock(keras.layers.Layer):
  def __init__(self, heads: int, hidden: int, rate: float = 0.1, **kwargs):
    super().__init__(**kwargs)
    self.attention = keras.layers.MultiHeadAttention(num_heads=heads,
                                                     key_dim=DIM // heads)
    self.ffn = keras.Sequential([keras.layers.Dense(hidden, activation="relu"),
                                 keras.layers.Dense(DIM)])
    self.norm1 = keras.layers.LayerNormalization(epsilon=1e-6)
    self.norm2 = keras.layers.LayerNormalization(epsilon=1e-6)
    self.drop1, self.drop2 = keras.layers.Dropout(rate), keras.layers.Dropout(rate)

  def call(self, x, training=False):
    attended = self.drop1(self.attention(x, x), training=training)
    x = self.norm1(x + attended)
    return self.norm2(x + self.drop2(self.ffn(x), training=training))


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(8)
  tokens = rng.integers(1, VOCAB, (BATCH * STEPS_PER_EPOCH + 32, LENGTH))
  labels = (tokens[:, :LENGTH // 2].sum(1) > tokens[:, LENGTH // 2:].sum(1)).astype(int)

  inputs = keras.Input((LENGTH,), dtype="int32")
  h = TokenAndPosition(name="embed")(inputs)
  h = TransformerBlock(heads=2, hidden=32, name="block")(h)
  h = keras.layers.GlobalAveragePooling1D()(h)
  h = keras.layers.Dense(16, activation="relu")(h)
  outputs = keras.layers.Dense(2, activation="softmax", dtype="float32")(h)
  model = keras.Model(inputs, outputs, name="tiny_transformer")
  model.compile(optimizer=keras.optimizers.Adam(1e-3),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
  model.fit(tokens[:-32], labels[:-32], batch_size=BATCH, epochs=EPOCHS,
            validation_data=(tokens[-32:], labels[-32:]), verbose=0,
            callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                    log_every=5, sample_every=None))
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "mixed_bfloat16", "loop": "fit",
          "skipped_steps": 0, "loss_scale": None}
