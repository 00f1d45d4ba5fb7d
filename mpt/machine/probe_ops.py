"""The ops the kernel table times, one table for its two timers: the probe's child
(mpt/machine/kernels.py, with oneDNN's log naming each kernel) and the weight-gradient
kernels timed in a training process where no table is cached
(mpt/measure/gradkernels.py). Each op a training step runs for a family of layers,
forward and backward, at small representative shapes, under one dtype.

`ops(tf, dtype)` takes TensorFlow as an argument: this floor imports no TensorFlow
(the probe's parent does not load it; its child and the training process have).
"""

from typing import Any, Callable

# Op families: a model's layer classes say which of them its training step runs.
FAMILIES = {
    "conv": ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter",
             "Conv2DBackpropFilterWithBias"),
    "depthwise": ("DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
                  "DepthwiseConv2dNativeBackpropFilter"),
    "matmul": ("MatMul", "MatMul/grad_input", "MatMul/grad_weights"),
    "batchnorm": ("FusedBatchNormV3", "FusedBatchNormGradV3"),
    "cast": ("Cast",),
}
# Each family's weight-gradient op: where a 16-bit policy loses most when a kernel is
# missing (oneDNN's reference float16 convolution gradient on a Sapphire Rapids).
WEIGHT_GRADIENTS = ("Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropFilter",
                    "MatMul/grad_weights")


def ops(tf, dtype: str) -> dict[str, Callable[[], Any]]:
  """{op: a function that runs it once} under `dtype`, every op of FAMILIES."""
  dt = getattr(tf, dtype)
  n = lambda *s: tf.cast(tf.random.stateless_normal(s, (1, 2)), dt)
  x, w, dy = n(8, 32, 32, 32), n(3, 3, 32, 64), n(8, 32, 32, 64)
  xs, ws, st = tf.constant([8, 32, 32, 32]), tf.constant([3, 3, 32, 64]), [1, 1, 1, 1]
  b, dw, ddy = n(64), n(3, 3, 32, 1), n(8, 32, 32, 32)
  a, k, g = n(256, 512), n(512, 512), n(256, 512)
  one, zero = tf.ones([32]), tf.zeros([32])
  raw = tf.raw_ops

  @tf.function
  def with_bias():
    with tf.GradientTape() as tape:
      tape.watch([w, b])
      y = tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b)
    return tape.gradient(y, [w, b], output_gradients=dy)

  bn = lambda: raw.FusedBatchNormV3(x=x, scale=one, offset=zero, mean=zero,
                                    variance=one, is_training=True)
  found = {
      "Conv2D": lambda: raw.Conv2D(input=x, filter=w, strides=st, padding="SAME"),
      "Conv2DBackpropInput": lambda: raw.Conv2DBackpropInput(
          input_sizes=xs, filter=w, out_backprop=dy, strides=st, padding="SAME"),
      "Conv2DBackpropFilter": lambda: raw.Conv2DBackpropFilter(
          input=x, filter_sizes=ws, out_backprop=dy, strides=st, padding="SAME"),
      "Conv2DBackpropFilterWithBias": with_bias,
      "DepthwiseConv2dNative": lambda: raw.DepthwiseConv2dNative(
          input=x, filter=dw, strides=st, padding="SAME"),
      "DepthwiseConv2dNativeBackpropInput": lambda: raw.DepthwiseConv2dNativeBackpropInput(
          input_sizes=xs, filter=dw, out_backprop=ddy, strides=st, padding="SAME"),
      "DepthwiseConv2dNativeBackpropFilter":
          lambda: raw.DepthwiseConv2dNativeBackpropFilter(
              input=x, filter_sizes=tf.constant([3, 3, 32, 1]), out_backprop=ddy,
              strides=st, padding="SAME"),
      "MatMul": lambda: tf.matmul(a, k),
      "MatMul/grad_input": lambda: tf.matmul(g, k, transpose_b=True),
      "MatMul/grad_weights": lambda: tf.matmul(a, g, transpose_a=True),
      "FusedBatchNormV3": bn,
  }
  saved = bn()
  found["FusedBatchNormGradV3"] = lambda: raw.FusedBatchNormGradV3(
      y_backprop=x, x=x, scale=one, reserve_space_1=saved[3], reserve_space_2=saved[4],
      reserve_space_3=saved[5], is_training=True)
  if dtype != "float32":
    x32 = tf.cast(x, tf.float32)
    found["Cast"] = lambda: tf.cast(x32, dt)
  return found
