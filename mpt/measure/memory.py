"""A training step's peak memory: estimated before training, measured after.

The estimate is what the process will hold at its peak, per device (one replica's
share under a strategy), in bytes:

  baseline        the process as it stands before the first step: TensorFlow's
                  runtime, the built model, the cached data (measured: RSS now, on a
                  CPU; on a GPU, the device's memory in use)
  parameters      every variable, float32 (variables stay float32 under mixed policies)
  gradients       one float32 gradient per trainable variable
  optimizer       Adam's two slots per trainable variable (plus the loss-scale state)
  weight copies   under a mixed policy, the 16-bit copy of each weight a layer casts
  activations     each layer's output per example at its dtype, kept for the backward
                  pass, times ACTIVATION_FACTOR (the op intermediates a layer keeps
                  beside its output: pre-activation, normalised values, masks),
                  times the per-replica batch. Where the 16-bit ops are emulated
                  (`emulated_16bit`: a CPU on which TensorFlow's oneDNN rewrite is
                  off, so TF's Eigen kernels run them), a 16-bit output counts at
                  float32's 4 bytes: those kernels compute each 16-bit convolution in
                  float32 copies of its input, filter and output, and the copies of
                  the step's largest layers sit beside the stored 16-bit values
  input batches   the batch in flight and the prefetched ones (float32 images)

`fits()` compares it with what the device has (available host RAM via psutil on a CPU;
a GPU's free memory by NVML): the baseline is already in use, so the step's own
memory is compared with what is left. `largest_batch()` inverts it: everything but
the per-example terms is fixed, so the batch that fits is linear. Both take an
`Estimate` or the line a run recorded per policy (summary.json's `memory`: a sweep
predicts its next cells from it). The measured peak is the process's high-water mark
(getrusage on a CPU; TF's peak on a GPU).
ACTIVATION_FACTOR was calibrated against measured peaks, one fresh process per run
(experiments/bench_memory.py; the factor came out 0.95-1.5 for the seed convnet and a
ResNet10 at 32 px, batch 1024, float32 and bfloat16, AMD Zen 4, TF 2.21); how close
it comes is the host's (its allocator, oneDNN's scratch memory), so the diagnosis
flags a gap over 30% and tests/measure/test_memory.py only holds the step's part
within a factor of 2 of the measured one, on any host.
The emulated case was measured the same way with TF_ENABLE_ONEDNN_OPTS=0 on that Zen 4
(the state of an AVX2-only Zen 3 by default): the bfloat16 step took 0.87x (seed
convnet) and 0.75x (ResNet10) of float32's step memory, not the 0.5x that 2-byte
activations alone predict; counted at 4 bytes, the estimate's step part came within
1-7% of the measured one (it was 0.60-0.66x of it counted at 2).
"""

import os
import resource
import sys
from typing import Any

from mpt import config
from mpt.errors import UserError
from mpt.records.memory import Estimate, Line  # The records; the arithmetic is here.

MB = 2**20
BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4,
         "int64": 8, "uint8": 1}
ACTIVATION_FACTOR = 1.25
PREFETCH = 2  # Batches tf.data holds ahead of the step (AUTOTUNE settles near 1-2 here).


def estimate(report: dict[str, Any], policy: str, batch_size: int,
             baseline_mb: float, trainable_params: int,
             emulated_16bit: bool = False) -> Estimate:
  """The estimate for the model `report` (mpt/measure/dtypes.py: its layers' output
  sizes and dtypes under `policy`) at a per-replica `batch_size`; `emulated_16bit`:
  the 16-bit ops run on kernels that compute in float32 copies (a CPU without
  oneDNN's rewrite)."""
  params = report["params"]
  mixed = policy.startswith("mixed_")
  compute = config.POLICY_DTYPE.get(policy, "float32")
  working = "float32" if emulated_16bit else compute
  activations = sum(l.get("output_elements", 0) * _bytes(l, i, report, working)
                    for i, l in enumerate(report["layers"])) * ACTIVATION_FACTOR
  image = report["input_shape"]
  input_bytes = 4 * int(image[0]) * int(image[1]) * int(image[2]) * (1 + PREFETCH)
  return Estimate(
      policy=policy, batch_size=batch_size, baseline_mb=baseline_mb,
      parameters_mb=4 * params / MB, gradients_mb=4 * trainable_params / MB,
      optimizer_mb=2 * 4 * trainable_params / MB,
      weight_copies_mb=(BYTES[compute] * trainable_params / MB) if mixed else 0.0,
      activations_mb_per_example=activations / MB,
      input_mb_per_example=input_bytes / MB, emulated_16bit=emulated_16bit and mixed)


def _bytes(layer: dict[str, Any], index: int, report: dict[str, Any],
           compute: str) -> int:
  """Bytes per output element of a layer under a policy computing in `compute`: a
  layer forced to float32 keeps 4 bytes; any other follows the policy. Under a
  float32 report nothing tells forced layers apart but the model's output, which mpt
  forces to float32."""
  reason = layer.get("float32_reason") or ""
  forced = reason.startswith("dtype forced") or (
      report.get("policy") == "float32" and index == len(report["layers"]) - 1)
  if "output_dtype" in layer and report.get("policy") not in (None, "float32") and \
      not reason:
    forced = forced or layer["output_dtype"] == "float32"
  return 4 if forced else BYTES[compute]


def fits(est: Estimate | Line, batch_size: int, available_mb: float) -> bool:
  """Whether the step at a per-replica `batch_size` fits in what is left."""
  return est.fixed_mb + batch_size * est.per_example_mb - est.baseline_mb <= available_mb


def largest_batch(est: Estimate | Line, available_mb: float) -> int:
  """The largest per-replica batch whose estimate fits in `available_mb` (0: none):
  what is left plus the baseline, as `fits()` compares it."""
  room = available_mb - est.fixed_mb
  return max(0, int(room // est.per_example_mb)) if est.per_example_mb > 0 else 0


def rss_mb() -> float:
  import psutil
  return psutil.Process().memory_info().rss / MB


def available_mb(gpu: bool = False) -> tuple[float, str]:
  """(MB the next allocations can take, what that figure is): the first GPU's free
  memory by NVML when the step runs on a GPU, else this host's available RAM (also
  where NVML is missing, and said so). MPT_AVAILABLE_MB stands in for either."""
  stand_in = os.environ.get("MPT_AVAILABLE_MB")
  if stand_in:  # The test suite's: no outcome may depend on the host's RAM.
    try:
      mb = float(stand_in)
    except ValueError:
      mb = -1.0
    if not mb >= 0:  # NaN too.
      raise UserError(f"MPT_AVAILABLE_MB={stand_in!r}: expected a number of MiB >= 0")
    return mb, "available (MPT_AVAILABLE_MB stand-in)"
  note = ""
  if gpu:
    try:
      import pynvml as nvml  # nvidia-ml-py (the `gpu` extra).
      nvml.nvmlInit()
      info = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0))
      return info.free / MB, f"free on GPU 0 ({info.total / 2**30:.0f} GiB total, NVML)"
    except Exception:  # No NVML: TF itself knows no GPU's total.
      note = "; the GPU's memory is unknown without nvidia-ml-py"
  import psutil
  vm = psutil.virtual_memory()
  return vm.available / MB, f"available host RAM ({vm.total / 2**30:.0f} GiB total{note})"


def peak_rss_mb() -> float:
  """This process's RSS high-water mark since `reset_peak()` (Linux: VmHWM), or
  since it started (getrusage, where /proc is missing)."""
  try:
    for line in open("/proc/self/status"):
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) / 1024
  except OSError:
    pass
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak / (MB if sys.platform == "darwin" else 1024)


def reset_peak() -> None:
  """Restarts the high-water mark at the current RSS (Linux >= 4.0), so that runs
  sharing a process (tests, benchmarks) each measure their own peak."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
  except OSError:
    pass


def human(mb: float) -> str:
  return f"{mb / 1024:.1f} GiB" if mb >= 1024 else f"{mb:.0f} MiB"
