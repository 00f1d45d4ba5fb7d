"""What the machine is: CPU features and name, GPUs and their compute capability, and
the peak FLOP rate a run's achieved rate is compared against (MFU).

TensorFlow is imported only by the functions that ask it about devices, so that
`fast_path` (the rule for which hardware runs which 16-bit type fast) serves the
diagnosis without it. Everything here reads the machine without assuming a GPU: on a
CPU-only box the GPU functions return empty lists, and code paths that need NVML
degrade to "absent".
"""

import os

from mpt.machine import isa

SIXTEEN = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}


def cpu_flags() -> set[str]:
  """The CPU feature flags (Linux names; numpy's detection where /proc/cpuinfo is not)."""
  return isa.detect().flags


def cpu_name() -> str:
  return isa.detect().name


def fast_path(policy: str, flags: set[str], gpu_caps: list[tuple[int, int]],
              cpu_name: str = "this CPU") -> tuple[str, str] | None:
  """(why `policy` has no fast 16-bit path here, the policy to use) or None.

  On a GPU machine the GPU decides; otherwise the CPU's flags do. float16 is fast on
  GPUs with Tensor Cores (compute capability >= 7.0) and on CPUs with AVX512_FP16 or
  AMX-FP16; bfloat16 on GPUs >= 8.0 and on CPUs with AVX512_BF16 or AMX-BF16.
  """
  half = SIXTEEN.get(policy)
  if half is None:
    return None
  if gpu_caps:
    need = (7, 0) if half == "float16" else (8, 0)
    slow = [tuple(cc) for cc in gpu_caps if tuple(cc) < need]
    if not slow:
      return None
    cc = ".".join(map(str, slow[0]))
    better = "mixed_float16" if half == "bfloat16" and slow[0] >= (7, 0) else "float32"
    return (f"GPU compute capability {cc} has no Tensor Core {half} path (needs >= "
            f"{need[0]}.{need[1]}): expect no speed-up over float32", better)
  bf16_fast = bool(flags & {"avx512_bf16", "amx_bf16"})
  if half == "float16":
    if flags & {"avx512_fp16", "amx_fp16"}:
      return None
    return (f"{cpu_name} has no AVX512_FP16/AMX-FP16, so float16 math is emulated "
            f"(converted to float32 and back) and runs slower than float32",
            "mixed_bfloat16" if bf16_fast else "float32")
  if bf16_fast:
    return None
  return (f"{cpu_name} has no AVX512_BF16/AMX-BF16, so bfloat16 math is emulated "
          f"(converted to float32 and back) and is unlikely to beat float32", "float32")


def gpu_compute_capabilities() -> list[tuple[int, int]]:
  """(major, minor) of each visible GPU; empty on a CPU-only machine."""
  return [cc for _, cc in _gpu_details() if cc]


def gpu_names() -> list[str]:
  """The name of each visible GPU; empty on a CPU-only machine."""
  return [name for name, _ in _gpu_details()]


def facts() -> dict:
  """What a diagnosis needs to know about the machine a run used (summary.json)."""
  import tensorflow as tf
  cpu = isa.detect()
  return {
      "cpu": cpu.name, "cpu_count": os.cpu_count(),
      "cpu_flags": sorted(k for k, v in cpu.isa().items() if v),
      "gpus": [{"name": name, "compute_capability": list(cc) if cc else None}
               for name, cc in _gpu_details()],
      # TF32 matters only on compute capability >= 8.0; the switch is global.
      "tf32": bool(tf.config.experimental.tensor_float_32_execution_enabled()),
  }


def _gpu_details() -> list[tuple[str, tuple[int, int] | None]]:
  import tensorflow as tf
  out = []
  for gpu in tf.config.list_physical_devices("GPU"):
    details = tf.config.experimental.get_device_details(gpu)
    cc = details.get("compute_capability")
    out.append((details.get("device_name", gpu.name), tuple(cc) if cc else None))
  return out


def device_name() -> str:
  import tensorflow as tf
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
  import tensorflow as tf
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "")
    key = dtype
    if dtype == "float32" and not tf.config.experimental.tensor_float_32_execution_enabled():
      key = "float32_fp32"  # --notf32: the plain FP32 units (pre-Ampere: the same).
    for fragment, table in GPU_PEAK_TFLOPS.items():
      use = key if key in table else dtype
      if fragment in name and use in table:
        return table[use] * 1e3 * len(gpus), f"data sheet: {fragment} {use}"
    return None, f"no data-sheet figure for {name!r}"
  # The CPU's theoretical peak, with its assumptions (mpt/machine/isa.py).
  peak = isa.peak_gflops(isa.detect(), dtype)
  return peak["gflops"], f"estimate: {peak['assumptions']}"
