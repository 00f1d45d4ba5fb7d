"""A small vision transformer: matmul-heavy, where 16-bit math should pay most.

The numerically sensitive parts are kept safe under float16: attention scores are
scaled before the softmax and the softmax itself runs in float32 (a float16 softmax
overflows at exp(11.1)); LayerNormalization computes its statistics in float32 (Keras
upcasts 16-bit inputs) and uses epsilon 1e-5, not 1e-6, which is subnormal in float16.
"""

import math

import keras

from mpt.models import classifier_head
from mpt.models import register


class PositionEmbedding(keras.layers.Layer):
  """Adds a learned embedding per token position."""

  def build(self, input_shape):
    self.embedding = self.add_weight(shape=tuple(input_shape[1:]), name="embedding",
                                     initializer=keras.initializers.RandomNormal(0.02))

  def call(self, x):
    return x + keras.ops.cast(self.embedding, x.dtype)


class Attention(keras.layers.Layer):
  """Multi-head scaled dot-product attention over precomputed q, k, v (B, T, D). Scores
  are computed in the compute dtype; the softmax runs in float32."""

  def __init__(self, heads: int, **kwargs):
    super().__init__(**kwargs)
    self.heads = heads

  def call(self, q, k, v):
    b, t, d = keras.ops.shape(q)[0], q.shape[1], q.shape[2]
    split = lambda x: keras.ops.transpose(
        keras.ops.reshape(x, (b, t, self.heads, d // self.heads)), (0, 2, 1, 3))
    q, k, v = split(q), split(k), split(v)
    scores = keras.ops.matmul(q, keras.ops.transpose(k, (0, 1, 3, 2)))
    scores = scores * keras.ops.cast(1.0 / math.sqrt(d // self.heads), scores.dtype)
    weights = keras.ops.cast(keras.ops.softmax(keras.ops.cast(scores, "float32")),
                             v.dtype)
    out = keras.ops.matmul(weights, v)
    return keras.ops.reshape(keras.ops.transpose(out, (0, 2, 1, 3)), (b, t, d))

  def flops_per_example(self) -> int:
    """QK^T and weights x V: 2 x (2 x T x T x D) multiply-add FLOPs."""
    t, d = self.input[0].shape[1], self.input[0].shape[2]
    return 4 * t * t * d

  def get_config(self):
    return {**super().get_config(), "heads": self.heads}


@register
def vit(input_shape, num_classes, *, patch: int = 8, dim: int = 192, depth: int = 6,
        heads: int = 3, mlp: int = 768) -> keras.Model:
  """A small ViT (ViT-Tiny widths, 6 blocks): patches -> transformer -> mean token."""
  ln = lambda name: keras.layers.LayerNormalization(epsilon=1e-5, name=name)
  inputs = keras.Input(input_shape, name="image")
  x = keras.layers.Conv2D(dim, patch, strides=patch, name="patch_embed")(inputs)
  x = keras.layers.Reshape((-1, dim), name="tokens")(x)
  x = PositionEmbedding(name="pos_embed")(x)
  for i in range(1, depth + 1):
    y = ln(f"b{i}_ln1")(x)
    q, k, v = (keras.layers.Dense(dim, name=f"b{i}_{n}")(y) for n in "qkv")
    y = Attention(heads, name=f"b{i}_attention")(q, k, v)
    x = keras.layers.Add(name=f"b{i}_add1")([x, keras.layers.Dense(
        dim, name=f"b{i}_proj")(y)])
    y = ln(f"b{i}_ln2")(x)
    y = keras.layers.Dense(mlp, activation="gelu", name=f"b{i}_mlp1")(y)
    x = keras.layers.Add(name=f"b{i}_add2")([x, keras.layers.Dense(
        dim, name=f"b{i}_mlp2")(y)])
  x = ln("final_ln")(x)
  x = keras.layers.GlobalAveragePooling1D(name="mean_token")(x)
  return keras.Model(inputs, classifier_head(x, num_classes), name="vit")
