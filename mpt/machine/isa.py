"""What the CPU can do: its SIMD/FMA/16-bit instruction sets, cores, clock, and the
theoretical peak FLOP rate they add up to.

Read from Linux's /proc/cpuinfo, or from the file `MPT_CPUINFO` names (a cpuinfo
recorded on another machine, so that everything mpt derives from the CPU can be
checked for a CPU one does not have); elsewhere (or when it cannot be read) from the
CPU features numpy detected at import, which covers x86 and ARM on every OS. The ISA map
uses Linux's flag names (`avx2`, `fma`, `avx512f`, `avx512_bf16`, `amx_bf16`, ...).
"""

import dataclasses
import os
import pathlib
import platform

# Linux /proc/cpuinfo flag names, in report order, and what each gives mixed precision.
ISA_FLAGS = {
    "sse4_2": "128-bit SIMD",
    "avx": "256-bit float SIMD",
    "avx2": "256-bit integer SIMD",
    "fma": "fused multiply-add (FMA3)",
    "f16c": "float16 <-> float32 conversion only (no float16 math)",
    "avx512f": "512-bit SIMD",
    "avx512bw": "512-bit 8/16-bit integer ops",
    "avx512vl": "AVX-512 ops on 128/256-bit registers",
    "avx512_vnni": "int8/int16 dot products",
    "avx512_bf16": "bfloat16 dot products (VDPBF16PS) and conversions",
    "avx512_fp16": "native float16 arithmetic",
    "amx_tile": "AMX tile registers",
    "amx_bf16": "AMX bfloat16 matrix multiply",
    "amx_fp16": "AMX float16 matrix multiply",
    "asimd": "ARM NEON (128-bit SIMD)",
    "asimdhp": "ARM NEON float16 arithmetic",
    "sve": "ARM scalable vectors",
    "bf16": "ARM bfloat16 dot products (BFDOT/BFMMLA)",
}

# numpy's names for the same features (numpy/_core/_multiarray_umath.__cpu_features__):
# Linux's in capitals without "_", but FMA3; numpy names neither AMX nor ARM's bf16.
_NUMPY_NAMES = {f: "FMA3" if f == "fma" else f.upper().replace("_", "")
                for f in ISA_FLAGS if not f.startswith("amx") and f != "bf16"}


@dataclasses.dataclass
class Cpu:
  name: str
  vendor: str  # AuthenticAMD, GenuineIntel, ARM implementer, or ""
  family: int | None
  flags: set[str]
  logical_cpus: int
  physical_cores: int | None  # None: unknown (then logical CPUs are used)
  mhz: float | None
  source: str  # where the facts came from

  def isa(self) -> dict[str, bool]:
    return {flag: flag in self.flags for flag in ISA_FLAGS}


def parse_cpuinfo(text: str) -> Cpu:
  """Parses a /proc/cpuinfo text (x86 or ARM)."""
  blocks = [b for b in text.strip().split("\n\n") if b.strip()]
  procs = []
  for block in blocks:
    fields = {}
    for line in block.splitlines():
      key, _, value = line.partition(":")
      fields[key.strip()] = value.strip()
    if "processor" in fields:
      procs.append(fields)
  first = procs[0] if procs else {}
  flags = set((first.get("flags") or first.get("Features") or "").split())
  cores = {(p.get("physical id", "0"), p["core id"]) for p in procs if "core id" in p}
  vendor = first.get("vendor_id") or (f"ARM implementer {first['CPU implementer']}"
                                      if "CPU implementer" in first else "")
  family = first.get("cpu family")
  mhz = first.get("cpu MHz")
  return Cpu(name=first.get("model name") or first.get("Model name") or vendor or "?",
             vendor=vendor, family=int(family) if family else None, flags=flags,
             logical_cpus=len(procs), physical_cores=len(cores) or None,
             mhz=float(mhz) if mhz else None, source="/proc/cpuinfo")


def numpy_features() -> set[str]:
  """The Linux names of the features numpy's runtime dispatch detected.

  numpy has no public API for them: `__cpu_features__` of its private
  `_multiarray_umath` is read, as numpy 2.4 has it under `numpy._core` (numpy 1.x
  under `numpy.core`). The one private numpy name mpt uses; tests/test_architecture.py
  keeps it here and checks it still exists.
  """
  try:
    from numpy._core._multiarray_umath import __cpu_features__ as found
  except ImportError:  # numpy < 2
    from numpy.core._multiarray_umath import __cpu_features__ as found
  return {linux for linux, name in _NUMPY_NAMES.items() if found.get(name)}


def detect(cpuinfo: str | None = None) -> Cpu:
  """This machine's CPU, read from `cpuinfo` (else $MPT_CPUINFO if set, else
  /proc/cpuinfo); falls back to numpy's feature detection, and says so."""
  cpuinfo = cpuinfo or os.environ.get("MPT_CPUINFO") or "/proc/cpuinfo"
  try:
    cpu = parse_cpuinfo(pathlib.Path(cpuinfo).read_text())
    if cpu.logical_cpus:
      return dataclasses.replace(cpu, source=cpuinfo)
    reason = f"{cpuinfo} lists no processors"
  except OSError as e:
    reason = f"{cpuinfo} not readable ({e.strerror or e})"
  return Cpu(name=platform.processor() or platform.machine(), vendor="", family=None,
             flags=numpy_features(), logical_cpus=os.cpu_count() or 1,
             physical_cores=None, mhz=None,
             source=f"numpy's CPU feature detection ({reason}); AMX and the clock "
                    "are unknown there")


def fp32_flops_per_cycle(cpu: Cpu) -> tuple[int, str]:
  """float32 FLOPs per cycle per core, and the assumption behind the figure."""
  f = cpu.flags
  if "avx512f" in f:
    if cpu.vendor == "AuthenticAMD" and cpu.family == 25:
      return 32, ("Zen 4 AVX-512: 2 FMA pipes x 8 float32 lanes x 2 (512-bit ops "
                  "double-pumped on 256-bit units)")
    return 64, "AVX-512: 2 FMA units x 16 float32 lanes x 2 (some parts have 1 unit)"
  if {"avx2", "fma"} <= f:
    return 32, "AVX2+FMA: 2 FMA units x 8 float32 lanes x 2"
  if "avx" in f:
    return 16, "AVX without FMA: 8-lane multiply + 8-lane add per cycle"
  if "asimd" in f:
    return 16, "NEON: 2 FMA pipes x 4 float32 lanes x 2 (SVE width not counted)"
  return 8, "SSE: 4-lane multiply + 4-lane add per cycle"


def flops_per_cycle(cpu: Cpu, dtype: str) -> tuple[int, str]:
  """FLOPs per cycle per core for `dtype` math, and the assumptions."""
  fp32, why = fp32_flops_per_cycle(cpu)
  f = cpu.flags
  if dtype == "bfloat16":
    if "amx_bf16" in f:
      return 2048, "AMX-BF16: 1024 bfloat16 multiply-adds per cycle per core (TMUL)"
    if "avx512_bf16" in f:
      return 2 * fp32, f"VDPBF16PS: 2 bfloat16 products per float32 lane; {why}"
    if "bf16" in f:
      return 2 * fp32, f"BFDOT: 2 bfloat16 products per float32 lane; {why}"
  if dtype == "float16":
    if "amx_fp16" in f:
      return 2048, "AMX-FP16: 1024 float16 multiply-adds per cycle per core (TMUL)"
    if "avx512_fp16" in f or "asimdhp" in f:
      return 2 * fp32, f"native float16 lanes: twice the float32 lanes; {why}"
  if dtype in ("bfloat16", "float16"):
    return fp32, f"no {dtype} math units: converted to float32, at best {why}"
  if dtype == "float64":
    return fp32 // 2, f"half the float32 lanes; {why}"
  return fp32, why


def peak_gflops(cpu: Cpu, dtype: str) -> dict:
  """The theoretical peak: physical cores x clock x FLOP/cycle, with its assumptions."""
  per_cycle, why = flops_per_cycle(cpu, dtype)
  cores = cpu.physical_cores or cpu.logical_cpus
  if not cpu.mhz:
    return {"dtype": dtype, "gflops": None, "flops_per_cycle": per_cycle,
            "assumptions": f"clock unknown; {why}"}
  smt = "" if cpu.physical_cores else " (logical CPUs: physical cores unknown)"
  return {"dtype": dtype, "gflops": cores * cpu.mhz * 1e-3 * per_cycle,
          "flops_per_cycle": per_cycle, "cores": cores, "mhz": cpu.mhz,
          "assumptions": f"{cores} cores{smt} x {cpu.mhz:.0f} MHz (the clock "
                         f"/proc/cpuinfo reports now, not the boost clock) x "
                         f"{per_cycle} FLOP/cycle: {why}"}
