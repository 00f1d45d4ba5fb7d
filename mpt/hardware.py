"""What the machine is: CPU features and name, GPUs and their compute capability, and
the peak FLOP rate a run's achieved rate is compared against (MFU).

Everything here reads the machine without assuming a GPU: on a CPU-only box the GPU
functions return empty lists, and code paths that need NVML degrade to "absent".
"""

import os
import pathlib
import platform

import tensorflow as tf


def _cpuinfo() -> str:
  try:
    return pathlib.Path("/proc/cpuinfo").read_text()
  except OSError:
    return ""


def _cpuinfo_field(name: str) -> str | None:
  for line in _cpuinfo().splitlines():
    if line.startswith(name):
      return line.split(":", 1)[1].strip()
  return None


def cpu_flags() -> set[str]:
  """The CPU feature flags the kernel reports (empty where /proc/cpuinfo is absent)."""
  return set((_cpuinfo_field("flags") or "").split())


def cpu_name() -> str:
  return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def cpu_mhz() -> float | None:
  value = _cpuinfo_field("cpu MHz")
  return float(value) if value else None


def gpu_compute_capabilities() -> list[tuple[int, int]]:
  """(major, minor) of each visible GPU; empty on a CPU-only machine."""
  caps = []
  for gpu in tf.config.list_physical_devices("GPU"):
    cc = tf.config.experimental.get_device_details(gpu).get("compute_capability")
    if cc:
      caps.append(tuple(cc))
  return caps


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


def cpu_flops_per_cycle(flags: set[str], dtype: str) -> int:
  """FLOPs per cycle per core, assuming two FMA pipes of the widest vector unit.

  float32: 16 lanes with AVX-512, 8 with AVX2+FMA, 4 with SSE (no FMA: half). bfloat16
  with AVX512_BF16 (VDPBF16PS: a pair of products per float32 lane) doubles the
  float32 rate; without it, and for float16 without AVX512_FP16, 16-bit math runs at
  best at the float32 rate (it is converted).
  """
  if "avx512f" in flags:
    fp32 = 2 * 16 * 2
  elif {"avx2", "fma"} <= flags:
    fp32 = 2 * 8 * 2
  else:
    fp32 = 4 * 2
  if dtype == "bfloat16" and "avx512_bf16" in flags:
    return 2 * fp32
  if dtype == "float16" and "avx512_fp16" in flags:
    return 2 * fp32
  return fp32


def peak_gflops(dtype: str) -> tuple[float | None, str]:
  """(peak GFLOP/s for `dtype` on this machine's training device, where it came from)."""
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "")
    for fragment, table in GPU_PEAK_TFLOPS.items():
      if fragment in name and dtype in table:
        return table[dtype] * 1e3 * len(gpus), f"data sheet: {fragment} {dtype}"
    return None, f"no data-sheet figure for {name!r}"
  mhz, cores = cpu_mhz(), os.cpu_count() or 1
  if not mhz:
    return None, "CPU clock unknown"
  per_cycle = cpu_flops_per_cycle(cpu_flags(), dtype)
  return (cores * mhz * 1e-3 * per_cycle,
          f"estimate: {cores} cores x {mhz:.0f} MHz x {per_cycle} FLOP/cycle ({dtype})")
