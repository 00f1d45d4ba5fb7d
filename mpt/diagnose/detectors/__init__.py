"""The diagnosis' rules: each detector reads one kind of evidence about a run
(mpt/diagnose/evidence.py) and returns a `Finding` or None; this module says which
runs, in what order, and which finding supersedes which.

  kernels.py    the policy verdict before training (step cost, kernel probe) and,
                where nothing was measured, the CPU flags / compute capability
  layers.py     the per-layer cost: the layer classes a 16-bit policy makes slower
  speed.py      the measured speed against the runs next to it, the oneDNN setting
  timing.py     the run's own step timing and the utilisation sampler
  shapes.py     the model's layers (dtypes.json) beside the trace
  precision.py  the loss scale (and a script's loss never scaled), the memory
                estimate
  numerics.py   the per-layer numerics (float16's range, bfloat16's error) and the
                final metrics beside float32's seeds
  gpu.py        a GPU capture's kernels: Tensor Cores used or not, the bound on
                mixed_float16's gain, memory-bound ops, a GPU waiting on the host

No detector calls another: when one finding explains what another would report, the
other is not run (`SUPERSEDED_BY`), and each detector runs once per diagnosis. Pure
functions over plain data: no TensorFlow here, so the detectors are tested on
recorded run folders and on their threshold edges (tests/diagnose/).
"""

import functools
from typing import Callable

from mpt.diagnose.detectors import gpu, kernels, layers, precision, shapes, speed
from mpt.diagnose.detectors import numerics, timing
from mpt.diagnose.evidence import Evidence
from mpt.diagnose.findings import Finding
from mpt.diagnose.gpu_evidence import GpuEvidence
from mpt.records import spread


def _on_gpu(rule: Callable[[GpuEvidence], Finding | None]):
  """A GPU rule as a detector of the run's evidence: it reads the run's capture."""
  @functools.wraps(rule)
  def detect(ev: Evidence) -> Finding | None:
    return rule(ev.gpu)
  return detect


# In the order the diagnosis lists what it checked.
DETECTORS: dict[str, Callable[[Evidence], Finding | None]] = {
    "slow_kernel": kernels.slow_kernel, "hardware": kernels.hardware,
    "opportunity": kernels.opportunity, "slow_layers": layers.slow_layers,
    "loss_scale": precision.loss_scale,
    "loss_never_scaled": precision.loss_never_scaled,
    "f16_overflow": numerics.f16_overflow,
    "gradient_underflow": numerics.gradient_underflow,
    "loss_scale_room": numerics.loss_scale_room, "bf16_error": numerics.bf16_error,
    "metrics_spread": numerics.metrics_spread,
    "input_bound": timing.input_bound, "low_utilisation": timing.low_utilisation,
    "shared_machine": timing.shared_machine, "misaligned": shapes.misaligned,
    "float32_work": shapes.float32_work, "batchnorm_cost": shapes.batchnorm_cost,
    "no_speedup": speed.no_speedup, "achieved_rate": timing.achieved_rate,
    "tf32": kernels.tf32, "memory_estimate": precision.memory_estimate,
    "onednn": speed.onednn, "xla": speed.xla,
    # A GPU run's capture (Evidence.gpu); a profile folder runs gpu.RULES itself.
    **{name: _on_gpu(rule) for name, rule in gpu.RULES.items()},
}
# A detector is not run when one of these found something: that finding already
# explains the run (the slow kernel gives the faster policy's advice; a 16-bit run
# slower than float32 is explained by its kernels or the device).
SUPERSEDED_BY = {
    "opportunity": ("slow_kernel",),
    "no_speedup": ("hardware", "slow_kernel", "opportunity"),
    # The capture's kernels say what the compute capability and the sampler guess.
    "hardware": ("no_tensor_cores", "tensor_cores_missed"),
    "low_utilisation": ("gpu_idle",),
}
# Detectors that need a file the run may lack (a --noinstrument run has no dtypes, a
# CPU run no GPU capture).
NEEDS = {"slow_layers": "layer cost", "xla": "xla measured", "misaligned": "dtypes.json", "float32_work": "dtypes.json",
         "batchnorm_cost": "dtypes.json", "loss_never_scaled": "program",
         **{name: "numerics.json" for name in ("f16_overflow", "gradient_underflow",
                                               "loss_scale_room", "bf16_error")},
         "metrics_spread": "float32 seeds",
         **{name: "gpu trace" for name in gpu.RULES}}
_HAS = {"dtypes.json": lambda ev: ev.dtypes is not None,
        "layer cost": lambda ev: ev.summary.layer_costs is not None,
        "xla measured": lambda ev: speed.xla_steps(ev) is not None,
        "program": lambda ev: ev.summary.program is not None,
        "numerics.json": lambda ev: ev.numerics is not None,
        "float32 seeds": lambda ev: (ev.summary.policy != "float32" and
                                     len(spread.by_seed(ev.float32_runs)) >=
                                     spread.MIN_SEEDS),
        "gpu trace": lambda ev: ev.gpu is not None}


def _order() -> list[str]:
  """DETECTORS with every superseding detector before those it supersedes."""
  done: list[str] = []

  def visit(name: str) -> None:
    for first in SUPERSEDED_BY.get(name, ()):
      visit(first)
    if name not in done:
      done.append(name)

  for name in DETECTORS:
    visit(name)
  return done


def run(ev: Evidence) -> tuple[list[Finding], list[str]]:
  """(the findings, the checks that found nothing), each in DETECTORS' order; a
  superseded check counts as clear, a check without its file is left out."""
  results: dict[str, Finding | None] = {}
  for name in _order():
    if name in NEEDS and not _HAS[NEEDS[name]](ev):
      continue
    superseded = any(results.get(first) for first in SUPERSEDED_BY.get(name, ()))
    results[name] = None if superseded else DETECTORS[name](ev)
  found = [results[n] for n in DETECTORS if results.get(n)]
  clear = [n for n in DETECTORS if n in results and not results[n]]
  return found, clear
