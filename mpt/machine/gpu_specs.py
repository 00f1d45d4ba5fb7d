"""Which GPU a profiler capture ran on, and what its data sheet lets mixed_float16
gain there: the ceiling the diagnosis' speed-up bound (mpt/diagnose/gpu_bound.py)
takes for Tensor-Core-eligible ops.

A capture's device plane names no model in TF <= 2.4 captures, only the compute
capability, the SM count and the clock; `identify` takes the model's name where the
capture has one (mpt/machine/hardware.py `gpu_model`), else matches those three
against `_BY_SHAPE`. The rates are hardware.py's data-sheet table (GPU_PEAK_TFLOPS).
"""

import dataclasses

from mpt.machine import hardware
from mpt.records.gpu import GpuDevice

# (compute capability, SMs) -> [(boost clock MHz, data-sheet key)]: the parts a
# capture without a model name is recognised by; the nearest clock decides between
# an SXM part and its PCIe card.
_BY_SHAPE = {
    ((7, 0), 80): [(1530, "V100"), (1380, "V100 PCIe")],
    ((7, 5), 40): [(1590, "T4")],
    ((6, 0), 56): [(1480, "P100"), (1329, "P100 PCIe")],
    ((6, 1), 20): [(1114, "P4")],
    ((6, 1), 30): [(1582, "TITAN Xp")],
    ((5, 2), 8): [(1036, "M2200")],
    ((8, 0), 108): [(1410, "A100")],
    ((8, 6), 72): [(1695, "A10")],
    ((8, 9), 58): [(2040, "L4")],
    ((9, 0), 132): [(1980, "H100")],
    ((9, 0), 114): [(1755, "H100 PCIe")],
}
# Parts that share a shape and clock with another and differ in memory: (the shape's
# key, more than this many GB) -> key. The H200 is an H100 SXM with 141 GB (the real
# H200 capture's device plane: cc 9.0, 132 SMs, 1980 MHz, 150.8e9 bytes, 4.8 TB/s).
_BY_MEMORY = {("H100", 100.0): "H200"}
# The table's GPUs without Tensor Cores (compute capability < 7.0).
_NO_TENSOR_CORES = {"P100", "P100 PCIe", "P4", "TITAN Xp", "M2200"}


@dataclasses.dataclass
class Ceiling:
  """What the data sheet says about mixed_float16 on one GPU."""
  gpu: str  # The data-sheet key ("V100"), else the capture's name for the device.
  tensor_cores: bool | None  # None: the capture gives no compute capability.
  float16_tflops: float | None  # Tensor Cores where it has them, else CUDA-core half.
  float32_tflops: float | None  # On CUDA cores (FP32 units, not TF32).
  tf32_tflops: float | None = None  # Ampere and newer: float32 on Tensor Cores.
  source: str = ""  # Where the rates came from, or why there are none.

  @property
  def ratio(self) -> float | None:
    """float16's peak over float32's on CUDA cores: the most an eligible op run on
    CUDA cores in float32 can gain; None without rates."""
    if self.float16_tflops and self.float32_tflops:
      return self.float16_tflops / self.float32_tflops
    return None

  @property
  def tf32_ratio(self) -> float | None:
    """float16's peak over TF32's: the most a float32 op already on Tensor Cores
    (TF32) can gain; None before Ampere or without rates."""
    if self.float16_tflops and self.tf32_tflops:
      return self.float16_tflops / self.tf32_tflops
    return None


def identify(device: GpuDevice) -> tuple[str | None, str]:
  """(the data-sheet key of the capture's GPU or None, how it was recognised)."""
  if device.model:
    key = hardware.gpu_model(device.model)
    return (key if key in hardware.GPU_PEAK_TFLOPS else None,
            f"named {device.model!r} in the capture")
  cc = tuple(device.compute_capability or ())
  parts = _BY_SHAPE.get((cc, device.sms))
  if not parts:
    return None, (f"compute capability {'.'.join(map(str, cc)) or '?'} with "
                  f"{device.sms or '?'} SMs matches no GPU in mpt's table")
  clock = device.clock_mhz or parts[0][0]
  key = min(parts, key=lambda p: abs(p[0] - clock))[1]
  how = (f"recognised by compute capability {'.'.join(map(str, cc))}, {device.sms} SMs "
         f"and its {clock:g} MHz clock")
  for (base, gb), bigger in _BY_MEMORY.items():
    if key == base and (device.memory_gb or 0) > gb:
      key, how = bigger, f"{how}, {device.memory_gb:.0f} GB"
  return key, how


def ceiling(device: GpuDevice) -> Ceiling:
  """The data-sheet rates behind the bound for the capture's GPU."""
  key, how = identify(device)
  if key is None:
    return Ceiling(device.model or device.name, device.tensor_cores, None, None,
                   source=f"no data-sheet rates: {how}")
  rates = hardware.GPU_PEAK_TFLOPS[key]
  fp32 = rates.get("float32_fp32", rates.get("float32"))
  tf32 = rates["float32"] if "float32_fp32" in rates else None
  cores = device.tensor_cores
  cores = key not in _NO_TENSOR_CORES if cores is None else cores
  return Ceiling(key, cores, rates.get("float16"), fp32, tf32,
                 f"{key} data sheet ({how})")
