"""An encoder-decoder Transformer over padded token ids: positional embeddings with
mask_zero, an encoder block (self-attention, feed-forward, residuals, LayerNorm) that
passes the padding mask on, a decoder block with causal self-attention and attention
over the encoder's output; mixed_float16, the loss scaling compile() adds.

Follows in shape keras.io's example "English-to-Spanish translation with a
sequence-to-sequence Transformer" (its Keras 3 version), at toy sizes.
"""

import keras
import numpy as np

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS = 8, 4, 2
VOCAB, LENGTH, WIDTH, HEADS, FFN = 40, 10, 16, 2, 32


class PositionalEmbedding(keras.layers.Layer):
  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.tokens = keras.layers.Embedding(VOCAB, WIDTH, mask_zero=True)
    self.positions = keras.layers.Embedding(LENGTH, WIDTH)

  def call(self, ids):
    return self.tokens(ids) + self.positions(keras.ops.arange(keras.ops.shape(ids)[-1]))

  def compute_mask(self, ids, mask=None):
    return keras.ops.not_equal(ids, 0)


class TransformerEncoder(keras.layers.Layer):
  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.attention = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS)
    self.dense_proj = keras.Sequential([keras.layers.Dense(FFN, activation="relu"),
                                        keras.layers.Dense(WIDTH)])
    self.norm_1, self.norm_2 = keras.layers.LayerNormalization(), \
        keras.layers.LayerNormalization()
    self.supports_masking = True

  def call(self, x, mask=None):
    padding = None if mask is None else keras.ops.cast(mask[:, None, :], "int32")
    h = self.norm_1(x + self.attention(x, x, attention_mask=padding))
    return self.norm_2(h + self.dense_proj(h))


class TransformerDecoder(keras.layers.Layer):
  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.self_attention = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS)
    self.cross_attention = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS)
    self.dense_proj = keras.Sequential([keras.layers.Dense(FFN, activation="relu"),
                                        keras.layers.Dense(WIDTH)])
    self.norms = [keras.layers.LayerNormalization() for _ in range(3)]
    self.supports_masking = True

  def call(self, x, encoded, mask=None):
    h = self.norms[0](x + self.self_attention(x, x, use_causal_mask=True))
    h = self.norms[1](h + self.cross_attention(h, encoded))
    return self.norms[2](h + self.dense_proj(h))


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("mixed_float16")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(5)
  n = BATCH * STEPS_PER_EPOCH
  source = rng.integers(1, VOCAB, (n, LENGTH)).astype("int32")
  source[:, 7:] = 0  # Padding at the end.
  target = np.roll(source, 1, axis=1)  # A toy "translation": the source, shifted.
  target_in, target_out = target[:, :-1], target[:, 1:]

  encoder_ids = keras.Input((LENGTH,), dtype="int32", name="encoder_inputs")
  decoder_ids = keras.Input((LENGTH - 1,), dtype="int32", name="decoder_inputs")
  encoded = TransformerEncoder(name="transformer_encoder")(
      PositionalEmbedding(name="source_embedding")(encoder_ids))
  decoded = TransformerDecoder(name="transformer_decoder")(
      PositionalEmbedding(name="target_embedding")(decoder_ids), encoded)
  logits = keras.layers.Dense(VOCAB, dtype="float32", name="logits")(decoded)
  model = keras.Model([encoder_ids, decoder_ids], logits, name="transformer")
  model.compile(optimizer=keras.optimizers.Adam(1e-3),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])
  model.fit({"encoder_inputs": source, "decoder_inputs": target_in}, target_out,
            batch_size=BATCH, epochs=EPOCHS, verbose=0,
            callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                    log_every=5, sample_every=None))
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "mixed_float16", "loop": "fit"}
