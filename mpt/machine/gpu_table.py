"""The kernel table on a GPU: for each policy, the kernels this model's own training
step ran, as the profiler saw them (a capture read by mpt/machine/gpu_profile.py, its
kernel stats by gpu_kernels.py), per op family: ms per step, the share on Tensor Cores,
the time eligible kernels spent on CUDA cores and their layers, the busiest kernel,
and the time over float32's (records: mpt/records/gpu.py `GpuKernelTable`).

The CPU's table (mpt/machine/kernels.py) times representative shapes under oneDNN's
log; a GPU's kernels depend on the model's shapes (channels that are multiples of 8,
the first convolution's 3 input channels), so mpt/train/before_step1/cost.py profiles the model's
own step under each policy and builds this table from the captures. fastpath.py reads
both tables alike (`GpuKernelTable.as_table`).
"""

import collections
import re

from mpt import config
from mpt.machine import kernel_families
from mpt.records.gpu import FamilyRow, GpuKernelTable, GpuProfile

LAYERS = 3  # CUDA-core layers named per row.
# A 16-bit policy with this share of its eligible kernel time on CUDA cores is warned
# about before step 1 (fastpath.py); the diagnosis' MISSED_TENSOR_CORES is the same.
MISSED = 0.10


def _mangled(name: str, parts: int = 5) -> str:
  """The first names of an Itanium-mangled C++ name, each spelt after its length:
  "_ZN17cutlass__5x_cudnn6KernelINS_4conv..." -> "cutlass__5x_cudnn::Kernel::conv..."."""
  found, i = [], 0
  while i < len(name) and len(found) < parts:
    digits = re.match(r"\d+", name[i:])
    if digits and re.fullmatch(r"[A-Za-z_]\w*", name[i + len(digits[0]):][:int(digits[0])]):
      start = i + len(digits[0])
      found.append(name[start:start + int(digits[0])])
      i = start + int(digits[0])
    else:
      i += 1
  return "::".join(found) or name


def short(kernel: str, width: int = 60) -> str:
  """A kernel's name for a line: a C++ template's name without its arguments
  (demangled as far as its names go), cut to `width`."""
  name = _mangled(kernel) if kernel.startswith("_Z") else re.sub(r"^void ", "", kernel)
  name = name.split("<", 1)[0].split("(", 1)[0] or kernel
  return name if len(name) <= width else name[:width - 3] + "..."


def rows(profile: GpuProfile, dtype: str, steps: int) -> list[FamilyRow]:
  """One row per op family with kernel time in `profile` (`steps` profiled steps)."""
  by_family: dict[str, list] = collections.defaultdict(list)
  for k in profile.kernels:
    by_family[k.family].append(k)
  found = []
  for family, kernels in sorted(by_family.items(), key=lambda f: -sum(k.ms for k in f[1])):
    total = sum(k.ms for k in kernels)
    if not total:
      continue
    missed = [k for k in kernels if k.eligible and not k.tensor_core]
    layers = collections.Counter()
    for k in missed:
      layers[k.layer] += k.ms
    busiest = max(kernels, key=lambda k: k.ms)
    found.append(FamilyRow(
        family, dtype, round(total / steps, 4),
        round(sum(k.ms for k in kernels if k.tensor_core) / total, 4),
        round(sum(k.ms for k in missed) / steps, 4), short(busiest.kernel),
        [layer for layer, _ in layers.most_common(LAYERS)]))
  return found


def table(profiles: dict[str, GpuProfile], steps: int, device: str,
          notes: list[str] | None = None) -> GpuKernelTable:
  """The table from one capture per policy ({policy: profile}), with each family's
  ratio to float32's where float32 was profiled."""
  found = GpuKernelTable(device, steps, notes=list(notes or []))
  for policy, profile in profiles.items():
    found.rows += rows(profile, config.POLICY_DTYPE[policy], steps)
  base = {r.family: r.ms for r in found.rows if r.dtype == "float32"}
  for r in found.rows:
    r.ratio = round(r.ms / base[r.family], 4) if base.get(r.family) else None
  return found


def missed(table: dict, dtype: str) -> tuple[float, list[str]] | None:
  """(the share of `dtype`'s Tensor-Core-eligible kernel time on CUDA cores, their
  layers) from a GPU table (`GpuKernelTable.as_table`); None without such kernels."""
  eligible = [r for r in table.get("rows", []) if r["dtype"] == dtype
              and r["op"] in kernel_families.ELIGIBLE]
  total = sum(r["ms"] for r in eligible)
  if not total:
    return None
  layers = [layer for r in sorted(eligible, key=lambda r: -r["cuda_cores_ms"])
            for layer in r.get("layers", [])]
  return sum(r["cuda_cores_ms"] for r in eligible) / total, layers[:LAYERS]


def eligible_on_tensor_cores(table: GpuKernelTable, dtype: str) -> float | None:
  """The share of `dtype`'s Tensor-Core-eligible kernel time on Tensor Cores."""
  rows = [r for r in table.rows if r.dtype == dtype
          and r.family in kernel_families.ELIGIBLE]
  total = sum(r.ms for r in rows)
  return sum(r.ms * r.tensor_core for r in rows) / total if total else None


def one_line(table: GpuKernelTable) -> str:
  """`mpt: kernels on H200 (2 profiled steps per policy): convolutions and matmuls on
  Tensor Cores: float32 92%, mixed_float16 100%, mixed_bfloat16 86% (CUDA cores:
  conv1)`"""
  parts = []
  for policy, dtype in config.POLICY_DTYPE.items():
    share = eligible_on_tensor_cores(table, dtype)
    if share is None:
      continue
    found = missed(table.as_table(), dtype)
    where = (f" (CUDA cores: {', '.join(found[1])})"
             if found and found[0] >= MISSED and found[1] else "")
    parts.append(f"{policy} {share:.0%}{where}")
  said = ", ".join(parts) or "no convolution or matmul kernels"
  return (f"mpt: kernels on {table.device} ({table.steps} profiled steps per policy): "
          f"convolutions and matmuls on Tensor Cores: {said}")
