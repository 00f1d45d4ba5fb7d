"""A diagnosis' finding, how findings are ranked, and the words several detectors share
(a ratio, the float32 comparison, where a step's time goes).

Each finding says what it rests on (`BASES`, most direct first), its threshold, its
numbers and a next step; mpt/diagnose/report.py prints them in `rank` order.
"""

import dataclasses

from mpt.diagnose.evidence import Evidence
from mpt.diagnose.thresholds import HIGH_LOSS, SLOWER_THAN_FLOAT32
from mpt.records.cost import times
from mpt.records.verdict import PolicyVerdict

SEVERITY = ("high", "medium", "low")
# What a finding rests on (`Finding.based_on`), most direct first.
BASES = ("sibling runs",        # a float32 run next to it / the sweep's other cells
         "step cost",           # the model's step timed per policy before step 1
                                # (summary.json cost, mpt/train/before_step1/cost.py)
         "layer cost",          # each layer timed per policy before step 1
                                # (summary.json layer_costs, mpt/measure/layercost.py)
         "probe",               # the kernel probe's measured table (the policy verdict)
         "trace",               # the profiler trace's op statistics (op_stats.json)
         "gpu trace",           # a GPU capture's kernels (mpt/machine/gpu_profile.py)
         "step timing",         # this run's step and data-wait times (summary.json)
         "utilisation",         # the CPU/GPU utilisation sampler
         "numerics",            # numerics.json: per-layer values against float16's
                                # range and bfloat16's error, on real batches
         "dtypes",              # dtypes.json: per-layer dtypes, dims and FLOPs
         "loss scale",          # the loss scale and skipped steps
         "memory",              # the memory estimate and the measured peak
         "microbenchmark",      # --mode=microbench's matmul rates
         "flags",               # the CPU's feature flags (no measurement)
         "compute capability")  # the GPU's compute capability and TF32 switch
# What a finding rests on when it measured nothing of this run's own step: the probe's
# representative shapes, a plan summed from per-layer times, the flags. Within a
# severity such a finding ranks after those that did (a guess never outranks a
# measurement).
PREDICTED = {"probe", "layer cost", "flags", "compute capability"}


@dataclasses.dataclass
class Finding:
  id: str
  severity: str     # high, medium, low
  impact: float     # rough share of step time at stake; ranks within a severity
  title: str
  threshold: str
  evidence: list[str]
  next_step: str
  based_on: list[str] = dataclasses.field(default_factory=list)  # names from BASES
  # The measured time over float32's this finding explains (a 16-bit run), or None;
  # HIGH_LOSS or more ranks it first.
  slowdown: float | None = None


def rank(findings: list[Finding]) -> list[Finding]:
  """By severity; a measured loss of HIGH_LOSS or more first; within a severity, a
  finding that rests only on predictions (PREDICTED) after one that measured; then
  by impact."""
  return sorted(findings, key=lambda f: (
      SEVERITY.index(f.severity), (f.slowdown or 0) < HIGH_LOSS,
      bool(f.based_on) and set(f.based_on) <= PREDICTED, -f.impact))


def loss_severity(loss: float | None) -> str:
  """Severity follows the measured loss against float32 (high when unmeasured)."""
  if loss is None or loss >= HIGH_LOSS:
    return "high"
  return "medium" if loss > SLOWER_THAN_FLOAT32 else "low"


# What a verdict's ratios rest on, in words, by its evidence: this model's own step,
# or the kernel probe's representative shapes (a guess about this model, never called
# its own).
RESTS_ON = {"cost": "this model's step, timed here per policy",
            "probe": "the kernel probe's representative shapes, not this model's step "
                     "(a guess)"}


def rests_on(k: PolicyVerdict) -> str:
  return RESTS_ON["cost" if k.basis == "step cost" else "probe"]


def ratios_line(evidence: str, source: str | None, ratios: dict[str, float]) -> str:
  """Each policy's measured time over float32's, fastest first, and what it rests on:
  a measured verdict's `evidence`, `source` and `policy_ratios` (or the same keys of
  diagnosis.json's `kernels`)."""
  ratios = sorted(ratios.items(), key=lambda i: i[1])
  return (f"{RESTS_ON[evidence]} ({source or 'probe'}): "
          + ", ".join(f"{p} {times(r)}" for p, r in ratios) + " float32's time")


def baseline_line(ev: Evidence) -> str:
  s, b = ev.summary, ev.baseline
  if not b:
    return ("no float32 run of this configuration next to this one: measure it with "
            "the same flags and --policy=float32")
  speedup = ev.speedup
  same_loop = "" if b.loop == s.loop else f" ({b.loop} loop)"
  return (f"{s.ms_per_step:.1f} ms/step vs {b.ms_per_step:.1f} under float32"
          f"{same_loop} in {b.run_dir}: {times(speedup)} the float32 speed"
          + (f" ({1 / speedup:.1f} times slower)" if speedup < 1 else ""))


def top_ops_line(ev: Evidence) -> str:
  return "most traced op time: " + ", ".join(
      f"{o['type']} {o['share']:.1%}" for o in ev.top_ops[:4])


def where_time_goes(ev: Evidence, advice: bool = True) -> str:
  """The next step when time is lost somewhere: the trace's top ops, or a trace; with
  the policy measured fastest in place of general advice."""
  k = ev.verdict
  fastest = k.fastest if k else None
  if ev.top_ops:
    where = "the trace puts the time in " + ", ".join(
        f"{o['type']} ({o['share']:.0%})" for o in ev.top_ops[:2])
    if k and advice and fastest and fastest != ev.summary.policy:
      return (f"{where}; the policy measured fastest for these ops here: "
              f"{ev.rerun(fastest)}")
    return where + (": speed those up or move them to a dtype/device with a fast "
                    "kernel" if advice and not k else "")
  return ("--profile_steps=A,B, then --mode=diagnose lists the op types that take "
          "the time")
