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

Each rule registers itself in its module (registry.py: `@detector(name, needs=...,
superseded_by=...)`). No detector calls another: when one finding explains what another
would report, the other is not run (`SUPERSEDED_BY`), and each detector runs once per
diagnosis. Pure functions over plain data: no TensorFlow here, so the detectors are
tested on recorded run folders and on their threshold edges (tests/diagnose/).
"""

import functools

# The modules in the order the diagnosis lists their checks; each registers its rules.
from mpt.diagnose.detectors import kernels, layers, precision, numerics  # noqa: F401
from mpt.diagnose.detectors import timing, shapes, speed, gpu  # noqa: F401
from mpt.diagnose.detectors.registry import DETECTORS, NEEDS, SUPERSEDED_BY
from mpt.diagnose.evidence import Evidence
from mpt.diagnose.findings import Finding
from mpt.records import spread

# The GPU rules, on a GPU run's capture (Evidence.gpu); a profile folder runs gpu.RULES.
for _name, _rule in gpu.RULES.items():
  DETECTORS[_name] = functools.wraps(_rule)(lambda ev, rule=_rule: rule(ev.gpu))
  NEEDS[_name] = "gpu trace"
# What each need of NEEDS asks of the evidence.
HAS = {"dtypes.json": lambda ev: ev.dtypes is not None,
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
    if name in NEEDS and not HAS[NEEDS[name]](ev):
      continue
    superseded = any(results.get(first) for first in SUPERSEDED_BY.get(name, ()))
    results[name] = None if superseded else DETECTORS[name](ev)
  found = [results[n] for n in DETECTORS if results.get(n)]
  clear = [n for n in DETECTORS if n in results and not results[n]]
  return found, clear
