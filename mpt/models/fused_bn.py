"""BatchNormalization through TensorFlow's fused kernel, and the swap into any model.

Keras 3's BatchNormalization on TensorFlow normalises with separate float32 ops
(moments, subtract, multiply, casts to and from the 16-bit compute dtype). On a
Sapphire Rapids CPU that was about half of the seed convnet's bfloat16 step; TF's
`FusedBatchNormV3` (oneDNN's batch_normalization primitive on CPU) does the same in
one kernel, forward and backward. `FusedBatchNormalization` has Keras' variables
(gamma, beta, moving_mean, moving_variance, float32), its epsilon and momentum rule
and its inference mode, so a model keeps its meaning; tests/models/test_fused_bn.py
checks the outputs, gradients and moving statistics against Keras' layer per dtype.

`with_fused_batchnorm(model)` clones a functional or sequential model (fresh weights,
before training), each BatchNormalization over the last axis replaced by this layer
(the ones it cannot replace are kept as Keras' layer, and counted).
"""

from typing import Any

import keras
import tensorflow as tf


class FusedBatchNormalization(keras.layers.Layer):
  """Keras' BatchNormalization (last axis, center and scale) on TF's fused kernel."""

  def __init__(self, momentum: float = 0.99, epsilon: float = 1e-3, **kwargs):
    super().__init__(**kwargs)
    self.momentum, self.epsilon = float(momentum), float(epsilon)
    self.supports_masking = True

  def build(self, input_shape):
    dim = (input_shape[-1],)
    weight = lambda name, init, trainable: self.add_weight(
        name=name, shape=dim, initializer=init, trainable=trainable, autocast=False)
    self.gamma = weight("gamma", "ones", True)
    self.beta = weight("beta", "zeros", True)
    self.moving_mean = weight("moving_mean", "zeros", False)
    self.moving_variance = weight("moving_variance", "ones", False)

  def call(self, inputs, training=False, mask=None):
    del mask  # Normalised over every position, as Keras does without a mask.
    x = inputs
    rank = len(x.shape)
    if rank != 4:  # The fused kernel takes NHWC images; others as 1x1 images.
      shape = tf.shape(x)
      x = tf.reshape(x, [-1, 1, 1, x.shape[-1]])
    # The fused kernel's one public entry in TF 2.21 is tf.compat.v1 (fenced in
    # tests/test_architecture.py).
    if training:
      y, mean, variance = tf.compat.v1.nn.fused_batch_norm(
          x, self.gamma, self.beta, epsilon=self.epsilon, is_training=True)
      # The kernel normalises with the batch's population variance but returns the
      # sample variance (n / (n - 1)); Keras' moving variance averages the former.
      n = tf.cast(tf.size(x) // tf.shape(x)[-1], tf.float32)
      variance = variance * tf.maximum(n - 1.0, 1.0) / n
      m = self.momentum
      self.moving_mean.assign(self.moving_mean * m + mean * (1.0 - m))
      self.moving_variance.assign(self.moving_variance * m + variance * (1.0 - m))
    else:
      y, _, _ = tf.compat.v1.nn.fused_batch_norm(
          x, self.gamma, self.beta, mean=self.moving_mean,
          variance=self.moving_variance, epsilon=self.epsilon, is_training=False)
    return tf.reshape(y, shape) if rank != 4 else y

  def compute_output_shape(self, input_shape):
    return input_shape

  def get_config(self) -> dict[str, Any]:
    return {**super().get_config(), "momentum": self.momentum, "epsilon": self.epsilon}


def replaceable(layer: keras.layers.Layer) -> bool:
  """A Keras BatchNormalization the fused kernel computes the same way."""
  if not isinstance(layer, keras.layers.BatchNormalization):
    return False
  axis = layer.axis if isinstance(layer.axis, int) else None
  return (axis in (-1, len(layer.input.shape) - 1) and layer.center and layer.scale
          and not layer.synchronized and not getattr(layer, "renorm", False))


def unswappable(model: keras.Model) -> str | None:
  """Why `keras.models.clone_model` cannot swap this model's BatchNorm layers (None:
  it can): it rebuilds only a Functional or Sequential model's own layers from their
  configs, not the layers inside a subclassed model or a custom layer."""
  top = {id(l) for l in model.layers}
  nested = [l for l in all_layers(model)
            if isinstance(l, keras.layers.BatchNormalization) and id(l) not in top]
  if nested:
    return (f"{len(nested)} of its BatchNormalization layers sit inside a subclassed "
            f"model or custom layer ({nested[0].name}), which keras.models.clone_model "
            "cannot rebuild")
  return None


def all_layers(model: keras.Model) -> list[keras.layers.Layer]:
  """Every layer of `model`, nested ones included (through the public `layers` of
  models and the layers a custom layer keeps as attributes, alone or in a list,
  tuple or dict: a Transformer block's `self.norms = [LayerNormalization(), ...]`)."""
  found, seen, todo = [], {id(model)}, list(model.layers)
  while todo:
    layer = todo.pop()
    if id(layer) in seen:
      continue
    seen.add(id(layer))
    found.append(layer)
    todo += list(getattr(layer, "layers", []) or []) + held(layer)
  return found


def held(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
  """The layers `layer` keeps as attributes, alone or in a list, tuple or dict (a
  model's graph layers among them)."""
  found = []
  for value in vars(layer).values():
    values = list(value.values()) if isinstance(value, dict) else \
        list(value) if isinstance(value, (list, tuple)) else [value]
    found += [v for v in values if isinstance(v, keras.layers.Layer) and v is not layer]
  return found


def with_fused_batchnorm(model: keras.Model) -> tuple[keras.Model, int, int]:
  """(a clone of `model` with its BatchNormalization layers fused, replaced, kept)."""
  counts = {"replaced": 0, "kept": 0}

  def clone(layer):
    if isinstance(layer, keras.layers.BatchNormalization):
      if replaceable(layer):
        counts["replaced"] += 1
        return FusedBatchNormalization(momentum=layer.momentum, epsilon=layer.epsilon,
                                       name=layer.name, dtype=layer.dtype_policy)
      counts["kept"] += 1
    if isinstance(layer, keras.layers.Lambda):
      # Keras refuses to rebuild a Python lambda from a config (it could be untrusted
      # code from a file); this one is the running model's own function.
      return keras.layers.Lambda(layer.function, name=layer.name,
                                 dtype=layer.dtype_policy)
    # A fresh copy (its weights are copied below). Reusing the layer would give it a
    # second graph node, which per-layer inspection cannot tell apart.
    return layer.__class__.from_config(layer.get_config())

  fused = keras.models.clone_model(model, clone_function=clone)
  # The original's weights, so that the same --seed starts from the same point under
  # either BatchNorm (the fused layer's are gamma, beta, moving mean and variance, in
  # Keras' order).
  for new, old in zip(fused.layers, model.layers):
    if old.weights:
      new.set_weights(old.get_weights())
  return fused, counts["replaced"], counts["kept"]
