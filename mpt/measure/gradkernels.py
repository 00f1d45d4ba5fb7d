"""A quick look, in this process, at the weight-gradient kernels of a model's op
families under each dtype: the one fact a fresh machine needs before it times a
16-bit step, and the only one it cannot afford to learn from the step itself.

On a Sapphire Rapids, oneDNN runs float16's convolution weight gradient on its
reference kernel: 696 ms against float32's 3 ms at the kernel probe's shape
(tests/data/kernels/intel_spr_amx_recorded.json), and 13-17 s for one mixed_float16
step of the seed convnet. The kernel table (mpt/machine/kernels.py) knows this, but
it is measured in a child process (~10 s) and only read from its cache before step 1.
Without it, the first call of that step would be spent to learn what one kernel call
says. So where no table is cached, each family's weight-gradient op (the op a 16-bit
policy loses most on where a kernel is missing) is timed here, at the probe's shapes,
once warm and once timed: about 0.1 s on a 2-core Zen 4, about 1.5 s where the
reference kernel runs. The rows have the kernel table's form (kernel names aside:
no ONEDNN_VERBOSE here), so that mpt/machine/fastpath.py reads them as it reads a
table.
"""

import time
from typing import Any, Callable

import tensorflow as tf

from mpt.machine import kernels

SOURCE = "the weight-gradient kernels timed in this process (no kernel table cached)"


def _ops(dtype: tf.DType) -> dict[str, Callable[[], Any]]:
  """Each family's weight-gradient op at the kernel probe's shapes (kernels.PROBE)."""
  n = lambda *s: tf.cast(tf.random.stateless_normal(s, (1, 2)), dtype)
  x, dy, ddy = n(8, 32, 32, 32), n(8, 32, 32, 64), n(8, 32, 32, 32)
  a, g = n(256, 512), n(256, 512)
  one = [1, 1, 1, 1]
  return {
      "Conv2DBackpropFilter": lambda: tf.raw_ops.Conv2DBackpropFilter(
          input=x, filter_sizes=tf.constant([3, 3, 32, 64]), out_backprop=dy,
          strides=one, padding="SAME"),
      "DepthwiseConv2dNativeBackpropFilter": lambda:
          tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
              input=x, filter_sizes=tf.constant([3, 3, 32, 1]), out_backprop=ddy,
              strides=one, padding="SAME"),
      "MatMul/grad_weights": lambda: tf.matmul(a, g, transpose_a=True),
  }


def _timed(fn: Callable[[], Any]) -> float:
  """ms of one call after a first (where oneDNN creates its primitive)."""
  fn().numpy()
  start = time.perf_counter()
  fn().numpy()
  return (time.perf_counter() - start) * 1e3


def table(families, dtypes=kernels.DTYPES) -> dict[str, Any]:
  """The kernel table's rows for the weight-gradient op of each of `families`
  (kernels.FAMILIES' names) under each of `dtypes`, with their ratios to float32's;
  an op that fails under a dtype is left out (a note says which)."""
  wanted = {op for f in families for op in kernels.FAMILIES.get(f, ())}
  rows, failed = [], []
  for dtype in dtypes:
    for op, fn in _ops(getattr(tf, dtype)).items():
      if op not in wanted:
        continue
      try:
        rows.append({"op": op, "dtype": dtype, "ms": round(_timed(fn), 4)})
      except (tf.errors.OpError, ValueError, TypeError) as e:
        failed.append(f"{op} {dtype}: {type(e).__name__}")
  found = {"schema": kernels.SCHEMA, "source": SOURCE, "rows": kernels.with_ratios(rows)}
  if failed:
    found["note"] = "not timed: " + ", ".join(failed)
  return found
