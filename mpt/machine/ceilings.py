"""Practical ceilings: the best FLOP rate the microbenchmark measured per dtype and op
type, set beside the theoretical estimate, with a verdict on that estimate.

The estimate is arithmetic on assumptions (isa.py: cores x the clock /proc/cpuinfo
reports x FLOP/cycle; for a GPU, its data sheet: hardware.py), and on a real machine
it can be wrong both ways: a 2-core Sapphire Rapids measured 102-105% of its float32
"peak" (its clock is the one /proc/cpuinfo reports, likely not the turbo clock) and
14-17% of its AMX bfloat16 "peak" (1024 multiply-adds per cycle per core, which
TensorFlow's kernels come nowhere near there). A share of such an estimate says more
about the estimate than about the run, so each dtype gets a verdict: "unreliable
estimate" when a measurement beats it or misses it by more than 4x, else "plausible"
("no estimate" / "not measured" when one side is missing). The measured best is
what a run can be held to instead.

Input: a microbench results dict (mpt/microbench/run.py `measure`, microbench.json).
"""

from typing import Any

from mpt.machine import hardware
from mpt.machine import rates
from mpt.records.cost import times

# Beyond these shares of the estimate the estimate, not the kernels, is in question:
# above 1 it is beaten outright; below 1/4 the gap is too large for kernel overheads,
# so the estimate counts units or clocks TensorFlow does not reach.
BEATEN, MISSED = 1.0, 0.25


def device_estimate(results: dict[str, Any], dtype: str) -> tuple[float | None, str]:
  """(GFLOP/s the estimate promises TensorFlow's ops for `dtype`, where it came from).

  TensorFlow runs the microbenchmark's ops on the first GPU when there is one, so the
  GPU's data sheet is the estimate there (TF32 assumed on, TensorFlow's default);
  otherwise the CPU estimate the results carry.
  """
  gpus = results.get("gpus") or []
  if gpus:
    tflops, source = hardware.gpu_peak_tflops(gpus[0].get("name", ""), dtype)
    return (tflops * 1e3 if tflops else None), source
  peak = (results.get("peak") or {}).get(dtype) or {}
  return peak.get("gflops"), peak.get("assumptions") or "no estimate recorded"


def verdict(estimate: float | None, measured: float | None,
            op: str | None) -> tuple[str, str]:
  """(verdict, why in words) for one dtype's estimate against its best measurement."""
  if not measured:
    return "not measured", "no TensorFlow rate was measured for it"
  if not estimate:
    return "no estimate", f"measured {op} {measured:.0f} GFLOP/s is the only ceiling"
  share = measured / estimate
  if share > BEATEN:
    return "unreliable estimate", (f"measured {op} {measured:.0f} GFLOP/s beats it "
                                   f"({share:.0%})")
  if share < MISSED:
    return "unreliable estimate", (f"measured {op} {measured:.0f} GFLOP/s misses it by "
                                   f"{times(1 / share)} ({share:.0%})")
  return "plausible", f"measured {op} {measured:.0f} GFLOP/s is {share:.0%} of it"


def ceilings(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
  """Per dtype: the best measured rate per op and overall, the estimate, the verdict."""
  dtypes = list((results.get("peak") or {}).keys())
  dtypes += sorted({r.get("dtype") for r in results.get("throughput") or []
                    if r.get("lib") == "tensorflow" and r.get("dtype")} - set(dtypes))
  out = {}
  for dtype in dtypes:
    by_op = rates.best_by_op(results, dtype)
    op = max(by_op, key=lambda o: by_op[o]["gflops"]) if by_op else None
    measured = by_op[op]["gflops"] if op else None
    estimate, source = device_estimate(results, dtype)
    word, why = verdict(estimate, measured, op)
    out[dtype] = {
        "device": "gpu" if results.get("gpus") else "cpu",
        "practical_gflops": measured, "practical_op": op, "by_op": by_op,
        "estimate_gflops": estimate, "estimate_source": source,
        "measured_share": measured / estimate if measured and estimate else None,
        "verdict": word, "why": why,
    }
  return out
