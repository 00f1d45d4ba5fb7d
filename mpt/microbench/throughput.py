"""Throughput: elementwise SIMD width per dtype, and matmul/conv2d GFLOP/s.

Timing: each op runs once untimed (kernel selection, allocation), then repeatedly
until `min_time` seconds have passed (at least `min_reps` times); the figure is the
median repetition. Each TensorFlow call ends with `sync_devices()`, so an asynchronous
device cannot make an op look free; results are not copied to the host (a copy would
be timed too). Both libraries allocate their output, as a training step does.
"""

import statistics
import time
from typing import Callable

import numpy as np
import tensorflow as tf

SIMD_DTYPES = ("int64", "int32", "int16", "int8", "float64", "float32", "float16",
               "bfloat16")
GEMM_DTYPES = ("float32", "bfloat16", "float16")
# One conv2d: batch 8, 56x56x64 -> 64 channels, 3x3, stride 1 (a ResNet stage-1 conv).
CONV_SHAPE = {"batch": 8, "hw": 56, "cin": 64, "cout": 64, "k": 3}
# Waits for every device's queued work (a no-op on the CPU, whose eager ops block).
_sync = getattr(tf.test.experimental, "sync_devices", lambda: None)


def time_op(fn: Callable[[], object], min_time: float = 0.3,
            min_reps: int = 3) -> float:
  """Median seconds of one call of `fn` (after one untimed call)."""
  fn()
  times, start = [], time.perf_counter()
  while len(times) < min_reps or time.perf_counter() - start < min_time:
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def simd(n: int, dtypes=SIMD_DTYPES, min_time: float = 0.2) -> list[dict]:
  """a+b and a*b over n-element arrays, per dtype, in TensorFlow and numpy. elements/s
  shows the lanes a SIMD register holds (narrower types: more lanes); bytes/s (two
  inputs read, one output written) shows where memory bandwidth caps it."""
  rows = []
  rng = np.random.default_rng(0)
  for name in dtypes:
    base = rng.integers(1, 100, n) if name.startswith("int") else rng.uniform(1, 2, n)
    a = base.astype(tf.as_dtype(name).as_numpy_dtype)  # bfloat16: ml_dtypes' (TF's).
    b = a[::-1].copy()
    ta, tb = tf.constant(a), tf.constant(b)
    for op, tf_op, np_op in (("add", tf.add, np.add), ("mul", tf.multiply, np.multiply)):
      cases = {"tensorflow": lambda: (tf_op(ta, tb), _sync()),
               "numpy": lambda: np_op(a, b)}
      for lib, fn in cases.items():
        seconds = time_op(fn, min_time)
        rows.append({"op": f"elementwise_{op}", "lib": lib, "dtype": name, "size": n,
                     "seconds": seconds, "elements_per_s": n / seconds,
                     "bytes_per_s": 3 * n * a.itemsize / seconds})
  return rows


def matmul(sizes, dtypes=GEMM_DTYPES, min_time: float = 0.3,
           slow_s: float = 2.0) -> list[dict]:
  """n x n @ n x n GFLOP/s per dtype in TensorFlow (numpy float32 as a second opinion).
  A dtype whose call takes over `slow_s` seconds skips its larger sizes (they are listed
  with `skipped`), so that emulated 16-bit math cannot stall the run."""
  rows = []
  cases = [("tensorflow", d) for d in dtypes] + [("numpy", "float32")]
  for lib, name in cases:
    too_slow = None
    for n in sizes:
      row = {"op": "matmul", "lib": lib, "dtype": name, "size": n,
             "flops": 2 * n**3}
      if too_slow:
        rows.append({**row, "gflops": None, "skipped": too_slow})
        continue
      if lib == "tensorflow":
        x = tf.cast(tf.random.stateless_uniform((n, n), seed=(1, n)), name)
        fn = lambda: (tf.linalg.matmul(x, x), _sync())
      else:
        x = np.random.default_rng(n).random((n, n), dtype=np.float32)
        fn = lambda: x @ x
      seconds = time_op(fn, min_time, min_reps=2)
      rows.append({**row, "seconds": seconds, "gflops": 2 * n**3 / seconds / 1e9})
      if seconds > slow_s:
        too_slow = f"{name} {n}x{n} took {seconds:.1f} s"
  return rows


def conv2d(dtypes=GEMM_DTYPES, min_time: float = 0.3, shape=CONV_SHAPE) -> list[dict]:
  """One NHWC conv2d's GFLOP/s per dtype in TensorFlow."""
  b, hw, cin, cout, k = (shape[key] for key in ("batch", "hw", "cin", "cout", "k"))
  flops = 2 * b * hw * hw * cout * k * k * cin
  rows = []
  for name in dtypes:
    x = tf.cast(tf.random.stateless_uniform((b, hw, hw, cin), seed=(2, 0)), name)
    w = tf.cast(tf.random.stateless_uniform((k, k, cin, cout), seed=(3, 0)), name)
    seconds = time_op(lambda: (tf.nn.conv2d(x, w, 1, "SAME"), _sync()), min_time, 2)
    rows.append({"op": "conv2d", "lib": "tensorflow", "dtype": name,
                 "size": f"{b}x{hw}x{hw}x{cin}->{cout} k{k}", "flops": flops,
                 "seconds": seconds, "gflops": flops / seconds / 1e9})
  return rows
