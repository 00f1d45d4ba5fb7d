"""Convolutional variants: the seed's convnet, its aligned twin, a small ResNet and a
MobileNet. Each builder's docstring says what it is for.
"""

import keras

from mpt.models import classifier_head
from mpt.models import register


def _bn(momentum: float, synchronized: bool):
  """(tensor, name) -> the tensor through a BatchNormalization with the run's options."""
  return lambda x, name: keras.layers.BatchNormalization(
      momentum=momentum, synchronized=synchronized, name=name)(x)


def _seed_convs(x, bn):
  """The seed convnet's body: three strided convs, each with BatchNorm, then GAP."""
  for i, (filters, kernel) in enumerate(((32, 5), (64, 7), (128, 11)), start=1):
    x = keras.layers.Conv2D(filters, kernel, strides=2, padding="same",
                            activation="relu", name=f"conv{i}")(x)
    x = bn(x, f"bn{i}")
  return keras.layers.GlobalAveragePooling2D(name="gap")(x)


@register
def seed_convnet(input_shape, num_classes, *, bn_momentum: float = 0.9,
                 bn_synchronized: bool = False) -> keras.Model:
  """The seed experiment's convnet: three strided convs with BatchNorm, GAP, dense.
  Filters are multiples of 8 as the TF guide asks; the first conv still sees 3 input
  channels. Keras' BatchNorm default momentum is 0.99 (the seed's); mpt defaults to 0.9
  so that short runs validate with settled moving statistics. `bn_synchronized`: batch
  statistics over all replicas (mpt sets it under a multi-replica strategy)."""
  inputs = keras.Input(input_shape, name="image")
  x = _seed_convs(inputs, _bn(bn_momentum, bn_synchronized))
  return keras.Model(inputs, classifier_head(x, num_classes), name="seed_convnet")


class PadChannels(keras.layers.Layer):
  """Zero-pads the channel axis up to a multiple of `multiple` (no weights)."""

  def __init__(self, multiple: int = 8, **kwargs):
    super().__init__(**kwargs)
    self.multiple = multiple

  def call(self, x):
    extra = -x.shape[-1] % self.multiple
    return keras.ops.pad(x, [[0, 0]] * (len(x.shape) - 1) + [[0, extra]])

  def compute_output_shape(self, shape):
    return (*shape[:-1], shape[-1] + -shape[-1] % self.multiple)

  def get_config(self):
    return {**super().get_config(), "multiple": self.multiple}


@register
def seed_convnet_aligned(input_shape, num_classes, *, bn_momentum: float = 0.9,
                         bn_synchronized: bool = False) -> keras.Model:
  """The seed convnet with the alignment rules applied, to measure what they buy. The
  image's 3 channels are zero-padded to 8 (the first conv's input dimension is then a
  multiple of 8; the extra weights see zeros and stay out of the result), and the logits
  layer has 16 units of which the first `num_classes` are used."""
  inputs = keras.Input(input_shape, name="image")
  x = _seed_convs(PadChannels(8, name="pad_channels")(inputs),
                 _bn(bn_momentum, bn_synchronized))
  padded = -(-num_classes // 8) * 8
  x = keras.layers.Dense(padded, name="logits")(x)
  x = keras.layers.Lambda(lambda t: t[:, :num_classes], name="take_classes")(x)
  outputs = keras.layers.Activation("softmax", dtype="float32", name="probs")(x)
  return keras.Model(inputs, outputs, name="seed_convnet_aligned")


_RESNET_BLOCKS = {10: (1, 1, 1, 1), 18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}


@register
def resnet(input_shape, num_classes, *, depth: int = 18, width: int = 64,
           bn_momentum: float = 0.9, bn_synchronized: bool = False) -> keras.Model:
  """A small ResNet (basic blocks; depth 10, 18 or 34, stage widths width x 1/2/4/8):
  BatchNorm-heavy, the common CNN baseline for mixed precision."""
  if depth not in _RESNET_BLOCKS:
    from mpt.errors import UserError
    raise UserError(f"resnet depth={depth}: valid depths are "
                    f"{', '.join(map(str, _RESNET_BLOCKS))}")
  conv = lambda f, k, s, name: keras.layers.Conv2D(f, k, strides=s, padding="same",
                                                   use_bias=False, name=name)
  bn = _bn(bn_momentum, bn_synchronized)
  inputs = keras.Input(input_shape, name="image")
  x = keras.layers.ReLU()(bn(conv(width, 7, 2, "stem_conv")(inputs), "stem_bn"))
  x = keras.layers.MaxPooling2D(3, 2, padding="same", name="stem_pool")(x)
  for stage, blocks in enumerate(_RESNET_BLOCKS[depth]):
    filters = width * 2**stage
    for block in range(blocks):
      stride = 2 if stage and not block else 1
      name = f"s{stage + 1}b{block + 1}"
      shortcut = x
      y = keras.layers.ReLU()(bn(conv(filters, 3, stride, f"{name}_conv1")(x),
                                 f"{name}_bn1"))
      y = bn(conv(filters, 3, 1, f"{name}_conv2")(y), f"{name}_bn2")
      if stride != 1 or x.shape[-1] != filters:
        shortcut = bn(conv(filters, 1, stride, f"{name}_proj")(x), f"{name}_proj_bn")
      x = keras.layers.ReLU()(keras.layers.Add(name=f"{name}_add")([y, shortcut]))
  x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
  return keras.Model(inputs, classifier_head(x, num_classes), name=f"resnet{depth}")


@register
def mobilenet(input_shape, num_classes, *, alpha: float = 1.0,
              bn_momentum: float = 0.9, bn_synchronized: bool = False) -> keras.Model:
  """MobileNet v1: depthwise-separable convolutions (width multiplier `alpha`), a known
  weak spot for 16-bit kernels (depthwise convs have little arithmetic per byte)."""
  bn = _bn(bn_momentum, bn_synchronized)
  channels = lambda c: max(8, int(c * alpha) // 8 * 8)  # multiples of 8
  inputs = keras.Input(input_shape, name="image")
  x = keras.layers.Conv2D(channels(32), 3, strides=2, padding="same", use_bias=False,
                          name="stem_conv")(inputs)
  x = keras.layers.ReLU(6.0)(bn(x, "stem_bn"))
  plan = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + \
      [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
  for i, (filters, stride) in enumerate(plan, start=1):
    x = keras.layers.DepthwiseConv2D(3, strides=stride, padding="same", use_bias=False,
                                     name=f"dw{i}")(x)
    x = keras.layers.ReLU(6.0)(bn(x, f"dw{i}_bn"))
    x = keras.layers.Conv2D(channels(filters), 1, use_bias=False, name=f"pw{i}")(x)
    x = keras.layers.ReLU(6.0)(bn(x, f"pw{i}_bn"))
  x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
  return keras.Model(inputs, classifier_head(x, num_classes), name="mobilenet")
