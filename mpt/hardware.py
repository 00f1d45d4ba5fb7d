"""What the machine is: CPU features and name, GPUs and their compute capability, and
the peak FLOP rate a run's achieved rate is compared against (MFU).

Everything here reads the machine without assuming a GPU: on a CPU-only box the GPU
functions return empty lists, and code paths that need NVML degrade to "absent".
"""

import os

import tensorflow as tf

from mpt.microbench import isa


def cpu_flags() -> set[str]:
  """The CPU feature flags (Linux names; numpy's detection where /proc/cpuinfo is not)."""
  return isa.detect().flags


def cpu_name() -> str:
  return isa.detect().name


def gpu_compute_capabilities() -> list[tuple[int, int]]:
  """(major, minor) of each visible GPU; empty on a CPU-only machine."""
  caps = []
  for gpu in tf.config.list_physical_devices("GPU"):
    cc = tf.config.experimental.get_device_details(gpu).get("compute_capability")
    if cc:
      caps.append(tuple(cc))
  return caps


def gpu_names() -> list[str]:
  """The name of each visible GPU; empty on a CPU-only machine."""
  return [tf.config.experimental.get_device_details(gpu).get("device_name", gpu.name)
          for gpu in tf.config.list_physical_devices("GPU")]


def device_name() -> str:
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    details = tf.config.experimental.get_device_details(gpus[0])
    return f"GPU: {details.get('device_name', gpus[0].name)} (x{len(gpus)})"
  return f"CPU: {cpu_name()} ({os.cpu_count()} logical cores)"


# Dense peak TFLOP/s from the vendors' data sheets, by (name fragment, dtype). float32
# on Ampere and newer is the TF32 Tensor Core figure only when TF32 is enabled, which
# is TensorFlow's default; the plain FP32 figure is listed as "float32_fp32".
GPU_PEAK_TFLOPS = {
    "V100": {"float16": 125.0, "float32": 15.7},
    "T4": {"float16": 65.0, "float32": 8.1},
    "A100": {"float16": 312.0, "bfloat16": 312.0, "float32": 156.0, "float32_fp32": 19.5},
    "A10G": {"float16": 125.0, "bfloat16": 125.0, "float32": 62.5, "float32_fp32": 31.2},
    "L4": {"float16": 121.0, "bfloat16": 121.0, "float32": 60.0, "float32_fp32": 30.3},
    "H100": {"float16": 989.0, "bfloat16": 989.0, "float32": 495.0, "float32_fp32": 67.0},
    "TITAN Xp": {"float16": 0.19, "float32": 12.1},
    "M2200": {"float16": 0.03, "float32": 2.2},
}


def peak_gflops(dtype: str) -> tuple[float | None, str]:
  """(peak GFLOP/s for `dtype` on this machine's training device, where it came from)."""
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "")
    for fragment, table in GPU_PEAK_TFLOPS.items():
      if fragment in name and dtype in table:
        return table[dtype] * 1e3 * len(gpus), f"data sheet: {fragment} {dtype}"
    return None, f"no data-sheet figure for {name!r}"
  # The CPU's theoretical peak, with its assumptions (mpt/microbench/isa.py).
  peak = isa.peak_gflops(isa.detect(), dtype)
  return peak["gflops"], f"estimate: {peak['assumptions']}"
