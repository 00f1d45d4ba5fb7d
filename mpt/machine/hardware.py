"""What the machine is: CPU features and name, GPUs and their compute capability, and
the peak FLOP rate a run's achieved rate is compared against (MFU): for a GPU, NVIDIA's
data-sheet figure for its exact model (`gpu_model`), for a CPU the estimate of isa.py;
and `environment()`, what a sweep's numbers were measured on.

TensorFlow is imported only by the functions that ask it about devices, so that
`fast_path` (the rule for which hardware runs which 16-bit type fast) serves the
diagnosis without it. Everything here reads the machine without assuming a GPU: on a
CPU-only box the GPU functions return empty lists, and code paths that need NVML
degrade to "absent".
"""

import os
import re

from mpt import config
from mpt import files
from mpt.machine import cores
from mpt.machine import isa
from mpt.records.machine import Gpu, Hardware


def cpu_flags() -> set[str]:
  """The CPU feature flags (Linux names; numpy's detection where /proc/cpuinfo is not)."""
  return isa.detect().flags


def cpu_name() -> str:
  return isa.detect().name


def environment() -> dict[str, str]:
  """What the numbers were measured on (without importing TensorFlow): sweep.csv's
  tf_version, cpu and cpu_isa columns."""
  cpu = isa.detect()
  return {"tf_version": files.tf_version(), "cpu": cpu.name,
          "cpu_isa": " ".join(k for k, v in cpu.isa().items() if v)}


def fast_path(policy: str, flags: set[str], gpu_caps: list[tuple[int, int]],
              cpu_name: str = "this CPU") -> tuple[str, str] | None:
  """(why `policy` has no fast 16-bit path here, the policy to use) or None.

  On a GPU machine the GPU decides; otherwise the CPU's flags do. float16 is fast on
  GPUs with Tensor Cores (compute capability >= 7.0) and on CPUs with AVX512_FP16 or
  AMX-FP16; bfloat16 on GPUs >= 8.0 and on CPUs with AVX512_BF16 or AMX-BF16.
  """
  half = config.SIXTEEN.get(policy)
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


# TF 2.21's rule for its oneDNN rewrite on Linux x86 when TF_ENABLE_ONEDNN_OPTS is
# unset (DefaultOneDnnPolicy in tensorflow/core/util/port.cc): CPUs with these features.
# tests/train/common/test_keras_fit.py checks it against TF's own answer on the host.
ONEDNN_DEFAULT_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8",
                        "amx_bf16")


def onednn_default(flags: set[str]) -> tuple[bool | None, str]:
  """(whether TensorFlow turns its oneDNN rewrite on by default on a CPU with `flags`
  (None: not an x86 CPU, where TF decides by the core, e.g. on for Neoverse V1), why,
  in words)."""
  if "sse2" not in flags:
    return None, "TF decides by the core on this (not x86) CPU"
  found = [f for f in ONEDNN_DEFAULT_FLAGS if f in flags]
  if found:
    return True, f"TF turns it on for CPUs with {found[0].upper()}"
  return False, ("TF leaves it off on CPUs without AVX512_VNNI, AVX512_BF16, AVX_VNNI "
                 "or AMX")


def gpu_compute_capabilities() -> list[tuple[int, int]]:
  """(major, minor) of each visible GPU; empty on a CPU-only machine."""
  return [cc for _, cc in _gpu_details() if cc]


def gpu_names() -> list[str]:
  """The name of each visible GPU; empty on a CPU-only machine."""
  return [name for name, _ in _gpu_details()]


def facts() -> Hardware:
  """What a diagnosis needs to know about the machine a run used (summary.json)."""
  import tensorflow as tf
  cpu = isa.detect()
  return Hardware(
      cpu.name, cores.usable_cores(), sorted(k for k, v in cpu.isa().items() if v),
      [Gpu(name, list(cc) if cc else None) for name, cc in _gpu_details()],
      bool(tf.config.experimental.tensor_float_32_execution_enabled()),
      host_cpu_count=os.cpu_count(), affinity_cpus=len(cores.affinity()),
      cpu_quota=cores.cpu_quota())


def _gpu_details() -> list[tuple[str, tuple[int, int] | None]]:
  import tensorflow as tf
  out = []
  for gpu in tf.config.list_physical_devices("GPU"):
    details = tf.config.experimental.get_device_details(gpu)
    cc = details.get("compute_capability")
    out.append((details.get("device_name", gpu.name), tuple(cc) if cc else None))
  return out


def device_name() -> str:
  gpus = _gpu_details()
  if gpus:
    return f"GPU: {gpus[0][0]} (x{len(gpus)})"
  usable, host = cores.usable_cores(), os.cpu_count()
  count = f"{host} logical cores" if usable == host else \
      f"{usable} of {host} logical cores usable"
  return f"CPU: {cpu_name()} ({count})"


# Dense (no 2:4 sparsity) peak TFLOP/s per GPU from NVIDIA's data sheets, by model key
# (`gpu_model`) and dtype. NVIDIA prints the Ampere-and-newer Tensor Core rates "with
# sparsity"; the figures here are half of those. float32 on Ampere and newer is the TF32
# Tensor Core rate, used only while TF32 is enabled (TensorFlow's default); the plain
# FP32 rate is "float32_fp32" (pre-Ampere parts have one float32 rate). A model without
# a form factor is the SXM part (or the only one); "<model> PCIe" is the PCIe card.
_A100 = {"float16": 312.0, "bfloat16": 312.0, "float32": 156.0, "float32_fp32": 19.5}
_H100_SXM = {"float16": 989.5, "bfloat16": 989.5, "float32": 494.5, "float32_fp32": 67.0}
GPU_PEAK_TFLOPS = {
    # V100 data sheet: SXM2 125 Tensor / 15.7 FP32; PCIe 112 / 14. No bfloat16 units.
    "V100": {"float16": 125.0, "float32": 15.7},
    "V100 PCIe": {"float16": 112.0, "float32": 14.0},
    # T4 data sheet: 65 mixed-precision (FP16/FP32) Tensor, 8.1 FP32. No bfloat16.
    "T4": {"float16": 65.0, "float32": 8.1},
    # A100 data sheet: the 40 GB and 80 GB, SXM4 and PCIe parts list the same peaks.
    "A100": _A100, "A100 PCIe": _A100,
    # A10 data sheet: 125 (250 sparse) BF16/FP16, 62.5 (125) TF32, 31.2 FP32.
    "A10": {"float16": 125.0, "bfloat16": 125.0, "float32": 62.5, "float32_fp32": 31.2},
    # A10G is AWS's variant, with no NVIDIA data sheet. Unsure: figures as third parties
    # report them (e.g. Baseten's "A10 vs A10G": fewer Tensor FLOPs than the A10, more
    # FP32); treat as approximate.
    "A10G": {"float16": 70.0, "bfloat16": 70.0, "float32": 35.0, "float32_fp32": 35.0},
    # L4 data sheet: 242 BF16/FP16 and 120 TF32 with sparsity, 30.3 FP32.
    "L4": {"float16": 121.0, "bfloat16": 121.0, "float32": 60.0, "float32_fp32": 30.3},
    # L40 / L40S data sheets: L40 181.05 BF16/FP16, 90.5 TF32, 90.5 FP32; L40S 362.05,
    # 183, 91.6 (dense; 362.1* / 733* with sparsity).
    "L40": {"float16": 181.05, "bfloat16": 181.05, "float32": 90.5,
            "float32_fp32": 90.5},
    "L40S": {"float16": 362.05, "bfloat16": 362.05, "float32": 183.0,
             "float32_fp32": 91.6},
    # H100 data sheet: SXM 1,979* BF16/FP16, 989* TF32, 67 FP32; PCIe 1,513*, 756*, 51.
    "H100": _H100_SXM,
    "H100 PCIe": {"float16": 756.5, "bfloat16": 756.5, "float32": 378.0,
                  "float32_fp32": 51.0},
    # H200 data sheet: the SXM part has the H100 SXM's compute (same GH100 die and
    # clocks); only the memory differs. The H200 NVL's lower figures are not listed here.
    "H200": _H100_SXM,
    # HGX B200 specification, per GPU (1,000 W): 4.5 PF* BF16/FP16, 2.2 PF* TF32, 75
    # FP32. Unsure: third-party tables give 1.125 PF dense TF32 and up to 80 FP32.
    "B200": {"float16": 2250.0, "bfloat16": 2250.0, "float32": 1100.0,
             "float32_fp32": 75.0},
    # P100 data sheet: SXM2 21.2 FP16 / 10.6 FP32, PCIe 18.7 / 9.3 (paired half on
    # CUDA cores: GP100 has no Tensor Cores).
    "P100": {"float16": 21.2, "float32": 10.6},
    "P100 PCIe": {"float16": 18.7, "float32": 9.3},
    # P4 data sheet: 5.5 FP32, 22 INT8 TOPS; GP104's float16 runs at 1/64 of FP32.
    "P4": {"float16": 0.086, "float32": 5.5},
    # Pascal/Maxwell: float16 arithmetic at 1/64 of float32, no Tensor Cores.
    "TITAN Xp": {"float16": 0.19, "float32": 12.1},
    "M2200": {"float16": 0.03, "float32": 2.2},
}

# Entries whose figures are not straight from an NVIDIA data sheet: the source says so.
_UNSURE = {"A10G": "approximate: AWS's part has no NVIDIA data sheet",
           "B200": "HGX B200 table; third parties differ on TF32 and FP32"}

# Words in a CUDA device name that are not the model: vendor and product lines.
_BRANDS = {"NVIDIA", "TESLA", "QUADRO", "GEFORCE"}
# Series words that name a model only together with the next word ("RTX 4090").
_SERIES = {"RTX", "GTX", "TITAN"}
# Form factors whose peaks differ; the SXM part is the table's unqualified entry.
_FORMS = {"PCIE": "PCIe", "NVL": "NVL", "SXM": None, "SXM2": None, "SXM4": None,
          "SXM5": None}


def gpu_model(name: str) -> str:
  """The data-sheet key of a CUDA device name: "NVIDIA A100-SXM4-80GB" -> "A100",
  "Tesla V100-PCIE-16GB" -> "V100 PCIe", "NVIDIA GeForce RTX 4090" -> "RTX 4090".

  Whole words only, so that "L40S" is never taken for "L4" nor "A100X" for "A100".
  """
  words = [w for w in re.split(r"[\s\-_]+", name.strip()) if w]
  while words and words[0].upper() in _BRANDS:
    words = words[1:]
  if not words:
    return ""
  take = 2 if words[0].upper() in _SERIES and len(words) > 1 else 1
  model, rest = " ".join(words[:take]), words[take:]
  form = next((_FORMS[w.upper()] for w in rest if w.upper() in _FORMS), None)
  return f"{model} {form}" if form else model


def gpu_peak_tflops(name: str, dtype: str, tf32: bool = True) -> tuple[float | None, str]:
  """(dense data-sheet TFLOP/s of one GPU named `name` for `dtype`, where it came from).

  None, with the reason, for a model the table does not hold or a dtype its data sheet
  does not list (bfloat16 before Ampere). `tf32=False` (--notf32): the FP32 units.
  """
  key = gpu_model(name)
  table = {k.upper(): k for k in GPU_PEAK_TFLOPS}.get(key.upper())
  if table is None:
    return None, f"no data-sheet figure for {name!r} (model {key!r} is not in the table)"
  rates = GPU_PEAK_TFLOPS[table]
  fp32_units = dtype == "float32" and not tf32 and "float32_fp32" in rates
  use = "float32_fp32" if fp32_units else dtype
  if use not in rates:
    return None, f"no data-sheet figure for {dtype} on {name!r} ({table} lists none)"
  caveat = f" ({_UNSURE[table]})" if table in _UNSURE else ""
  return rates[use], f"data sheet: {table} {use}{caveat}"


def peak_gflops(dtype: str) -> tuple[float | None, str]:
  """(peak GFLOP/s for `dtype` on this machine's training device, where it came from)."""
  import tensorflow as tf
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "")
    tflops, source = gpu_peak_tflops(
        name, dtype, tf.config.experimental.tensor_float_32_execution_enabled())
    return (tflops * 1e3 * len(gpus) if tflops else None), source
  # The CPU's theoretical peak, with its assumptions (mpt/machine/isa.py).
  peak = isa.peak_gflops(isa.detect(), dtype)
  return peak["gflops"], f"estimate: {peak['assumptions']}"
