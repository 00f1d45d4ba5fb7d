"""numerics.json: where a model's values sit against float16's and bfloat16's ranges,
layer by layer, on real batches; typed, with the shares every reader derives from it.

A `Numerics` holds samples (mpt/measure/numerics.py): one at a step after warm-up,
one at the end of training (or one of the model as built, for `--mode=inspect` and
`--policy=auto`). Each sample has, per layer, its output and the gradient flowing into
it (the loss's gradient with respect to that output, at loss scale 1), both computed
in float32 from the run's own weights and batches, as a histogram of the magnitudes'
binary exponents: `Values.share_below(2**-24, scale)` is then exact at any
power-of-two loss scale, so one record answers "what would float16 do" at scale 1, at
the run's scale and at any other, under any policy. And the relative error of the
layer's output recomputed in bfloat16 against float32, on the same inputs.

This module is the record's one reader and writer, and holds float16's limits.
"""

import dataclasses
import functools
import json
import re
import math
import pathlib

from mpt import files
from mpt.records import typed

SCHEMA = 1
FILE = "numerics.json"
F16_MAX = 65504.0  # float16's largest finite value.
F16_MIN_SUBNORMAL = 2.0**-24  # Below it float16 rounds to zero (half of it, exactly).
# The loss scale mixed_float16 starts at (Keras 3 LossScaleOptimizer, dynamic).
DYNAMIC_START = 2.0**15


@dataclasses.dataclass
class Values:
  """One tensor's magnitudes (several batches' summed): how many elements, how many
  exactly zero, non-finite, above 65504; the largest |value|, the smallest nonzero
  one; and `hist`: binary exponent e (floor(log2 |v|), as a string) -> how many
  finite nonzero elements have |v| in [2^e, 2^(e+1))."""
  count: int = 0
  zeros: int = 0
  nonfinite: int = 0
  overflow: int = 0  # |v| > 65504, infinities included (NaN not).
  max: float = 0.0
  min_nonzero: float | None = None
  hist: dict[str, int] = dataclasses.field(default_factory=dict)

  @property
  def nonzero(self) -> int:
    return sum(self.hist.values())

  def overflow_share(self) -> float:
    return self.overflow / self.count if self.count else 0.0

  def share_below(self, limit: float, scale: float = 1.0) -> float:
    """The share of the finite nonzero elements whose |v| * scale < limit (exact for
    power-of-two limits and scales; otherwise to the bin)."""
    if not self.nonzero:
      return 0.0
    top = math.floor(math.log2(limit) - math.log2(scale)) - 1  # Bins wholly below.
    return sum(n for e, n in self.hist.items() if int(e) <= top) / self.nonzero

  def mass_below(self, limit: float, scale: float = 1.0) -> float:
    """The share of the finite nonzero elements' summed magnitude (each bin at its
    middle, 1.5 * 2^e) in those `share_below` counts: what flushing them loses."""
    total = sum(n * 2.0 ** int(e) for e, n in self.hist.items())
    if not total:
      return 0.0
    top = math.floor(math.log2(limit) - math.log2(scale)) - 1
    return sum(n * 2.0 ** int(e) for e, n in self.hist.items() if int(e) <= top) / total

  def merge(self, other: "Values") -> "Values":
    hist = {e: self.hist.get(e, 0) + other.hist.get(e, 0)
            for e in {**self.hist, **other.hist}}
    mins = [m for m in (self.min_nonzero, other.min_nonzero) if m is not None]
    return Values(self.count + other.count, self.zeros + other.zeros,
                  self.nonfinite + other.nonfinite, self.overflow + other.overflow,
                  max(self.max, other.max), min(mins) if mins else None, hist)


@dataclasses.dataclass
class LayerNumerics:
  """One layer's output and incoming gradient in one sample."""
  name: str
  cls: str
  dtype: str  # The dtype it computes in, in the run.
  output: Values
  grad: Values | None = None  # dLoss/dOutput at loss scale 1 (None: not measured).
  # ||bfloat16 - float32|| / ||float32|| of its output on the same float32 inputs.
  bf16_error: float | None = None
  # Whether it is a reduction (softmax, normalisation statistics, a long sum) or its
  # output feeds one: where bfloat16's 8-bit mantissa moves what follows most.
  reduction: bool = False
  # Its policy is its own (Keras: a dtype= given), not the run's global one: a 16-bit
  # policy would leave it as it is.
  pinned: bool = False
  # The layers whose outputs it reads: a layer that reads an output above 65504
  # casts it to float16 on entry (inf) even where that layer is kept in float32.
  reads: list[str] = dataclasses.field(default_factory=list)
  # The range of the values its own ops made inside its call that float16 would hold
  # (count, non-finite, above 65504, largest; no histogram): attention scores before
  # their softmax, a custom layer's products, its output; and the type of the op that
  # made the largest. None: not watched.
  inside: Values | None = None
  inside_op: str | None = None
  # A factor the layer multiplies that op's output by after it, where known: Keras'
  # MultiHeadAttention without dropout forms q.k, then scales it by 1/sqrt(key_dim)
  # (its dot_product_attention path; with dropout it scales the query first).
  scaled_after: float | None = None


@dataclasses.dataclass
class Sample:
  """Every watched layer on a few batches at one step."""
  step: int  # Steps trained before it (0: the model as built).
  examples: int
  loss_scale: float | None  # The run's loss scale at that step (None: no scaling).
  loss: float | None
  layers: list[LayerNumerics] = dataclasses.field(default_factory=list)
  seconds: float = 0.0


@dataclasses.dataclass
class Overflow:
  """A skipped step replayed (mpt/train/common/overflow.py): the first op whose output
  went non-finite, in the forward or the backward pass, and the layer it belongs to;
  `op` None where the replay ran finite (the skip came from elsewhere: said)."""
  step: int  # The step that was skipped (1-based, as steps are counted).
  loss_scale: float | None  # The scale it ran at.
  op: str | None = None  # Its type (BatchMatMulV2, Softmax, ...).
  # Its output's dtype and shape (both passes run eagerly: tensors have no names).
  output: str | None = None
  layer: str | None = None  # The Keras layer path the op belongs to.
  backward: bool = False  # In the gradient (the loss scale matters) or the forward.
  kind: str | None = None  # "+Inf", "-Inf", "Inf" or "NaN".
  seconds: float = 0.0  # The replay's time.


@dataclasses.dataclass
class Numerics(typed.Record):
  """A run's numerics samples, and the skipped steps replayed."""
  policy: str
  loss_scale: str = "dynamic"  # The run's setting: dynamic, a number, or none.
  samples: list[Sample] = dataclasses.field(default_factory=list)
  overflows: list[Overflow] = dataclasses.field(default_factory=list)
  # Skipped steps past the bound on replays (overflow.MAX_REPLAYS): not replayed.
  skipped_not_replayed: int = 0
  not_measured: dict[str, str] = dataclasses.field(default_factory=dict)
  seconds: float = 0.0
  schema: int = SCHEMA

  def layers(self) -> dict[str, list[LayerNumerics]]:
    """Each layer's rows over the samples, in call order."""
    found: dict[str, list[LayerNumerics]] = {}
    for sample in self.samples:
      for row in sample.layers:
        found.setdefault(row.name, []).append(row)
    return found

  def scale(self) -> float | None:
    """The loss scale the gradients are judged at: the run's at its last sample;
    for a run without loss scaling, the scale mixed_float16 would start at (a fixed
    --loss_scale's own)."""
    scales = [s.loss_scale for s in self.samples if s.loss_scale]
    if scales:
      return scales[-1]
    try:
      return float(self.loss_scale)
    except ValueError:
      return DYNAMIC_START


def keep_scales(grad: Values) -> tuple[float, float] | None:
  """(the smallest power-of-two loss scale that lifts 99.9% of `grad`'s nonzero
  values to float16's subnormal range, the largest that keeps its largest value
  below 65504); None without nonzero values."""
  if not grad.nonzero or not grad.max or not math.isfinite(grad.max):
    return None
  low = 1.0
  while grad.share_below(F16_MIN_SUBNORMAL, low) > 0.001 and low < 2.0**64:
    low *= 2
  high = 2.0 ** math.floor(math.log2(F16_MAX / grad.max))
  return low, high


def write(run_dir: pathlib.Path, found: Numerics) -> None:
  files.write_json(run_dir / FILE, found.to_dict())


def overflows_of(run_dir: pathlib.Path) -> list[Overflow]:
  """The skipped steps replayed in a run folder (none: no numerics.json)."""
  found = read(run_dir)
  return found.overflows if found else []


def read(run_dir: pathlib.Path) -> Numerics | None:
  """The run folder's numerics.json, or None where it has none."""
  path = run_dir / FILE
  if not path.is_file():
    return None
  return Numerics.from_dict(json.loads(path.read_text()))


@dataclasses.dataclass
class Worst:
  """One layer over every sample: the largest of each figure."""
  name: str
  cls: str
  dtype: str
  out_max: float
  overflow: float  # Share of its outputs above 65504.
  grad_max: float | None
  under_1: float | None  # Share of its nonzero gradients below 2^-24 at scale 1.
  under_scaled: float | None  # ... at the loss scale judged (Numerics.scale()).
  lost_scaled: float | None  # Share of its gradients' magnitude below 2^-24 there.
  bf16_error: float | None
  reduction: bool
  keep: tuple[float, float] | None  # keep_scales of its gradients.
  pinned: bool
  reads: tuple[str, ...] = ()
  # Inside its call (LayerNumerics.inside): the largest |value| its own ops made, the
  # share of those values above 65504, the op that made the largest.
  in_max: float | None = None
  in_over: float = 0.0
  in_op: str | None = None
  in_scaled: float | None = None  # LayerNumerics.scaled_after.

  def order_is_the_issue(self) -> bool:
    """Whether only the order of its ops overflows: the value inside passes 65504,
    and scaled before it is formed (as the layer scales it after) it would not."""
    return bool(self.inside_only() and self.in_scaled and
                self.in_max * self.in_scaled <= F16_MAX)

  def overflows(self) -> bool:
    """Whether float16 could not hold what it computes: its output, or a value its
    own ops make inside its call (attention scores before their softmax)."""
    return self.overflow > 0 or self.in_over > 0

  def inside_only(self) -> bool:
    """Whether only the inside of its call passes float16's range, not its output."""
    return self.overflow == 0 and self.in_over > 0


def worst(found: Numerics) -> list[Worst]:
  """Each layer's worst figures over the samples, in call order."""
  scale = found.scale() or 1.0
  rows = []
  for name, seen in found.layers().items():
    grads = [r.grad for r in seen if r.grad is not None]
    grad = functools.reduce(Values.merge, grads) if grads else None
    errors = [r.bf16_error for r in seen if r.bf16_error is not None]
    inside = [r for r in seen if r.inside is not None]
    top = max(inside, key=lambda r: r.inside.max) if inside else None
    rows.append(Worst(
        name, seen[0].cls, seen[0].dtype, max(r.output.max for r in seen),
        max(r.output.overflow_share() for r in seen),
        grad.max if grad else None,
        max(g.share_below(F16_MIN_SUBNORMAL) for g in grads) if grads else None,
        max(g.share_below(F16_MIN_SUBNORMAL, scale) for g in grads) if grads else None,
        max(g.mass_below(F16_MIN_SUBNORMAL, scale) for g in grads) if grads else None,
        max(errors) if errors else None, any(r.reduction for r in seen),
        keep_scales(grad) if grad else None, seen[0].pinned, tuple(seen[0].reads),
        top.inside.max if top else None,
        max(r.inside.overflow_share() for r in inside) if inside else 0.0,
        top.inside_op if top else None, top.scaled_after if top else None))
  return rows


def overflow_keep(rows: list[Worst], most: int = 5) -> tuple[list[Worst], list[str]]:
  """(the rows whose outputs pass float16's largest value, the layers to keep in
  float32 for them): the first `most` of those and the layers of `rows` that read
  them, since a layer kept in float32 still hands its output to a float16 reader that
  casts it on entry (34a32f8: followed, that advice completed the run). The one rule
  of the f16_overflow finding and of --policy=auto's reason to drop float16."""
  over = [r for r in rows if r.overflows()]
  names = [r.name for r in over[:most]]
  names += [r.name for r in rows if r.name not in names and set(r.reads) & set(names)]
  return over, names


def layer_pattern(names: list[str]) -> str:
  """A --layer_policy pattern that names exactly these layers."""
  return "|".join(re.escape(n) for n in names)


def _pct(share: float | None) -> str:
  if share is None:
    return "-"
  return "0" if share == 0 else f"{share:.2%}" if share < 0.01 else f"{share:.1%}"


def _num(value: float | None) -> str:
  return "-" if value is None else f"{value:.3g}"


def describe(found: Numerics) -> str:
  """Its worst figures in one line: `largest output 1.2e+03 (conv2d); above float16's
  65504: none; gradients below 2^-24: ...; bfloat16 error up to ...`."""
  rows = worst(found)
  if not rows:
    return "no layer seen"
  top = max(rows, key=lambda r: r.out_max)
  over = [r.name + (f" (inside: {r.in_op} {r.in_max:.3g})" if r.inside_only() else "")
          for r in rows if r.overflows()]
  parts = [f"largest output {top.out_max:.3g} ({top.name})",
           "above float16's 65504: " + (", ".join(over[:3]) + (
               f" and {len(over) - 3} more" if len(over) > 3 else "") if over else "none")]
  graded = [r for r in rows if r.under_1 is not None]
  if graded:
    low = max(graded, key=lambda r: (r.under_scaled, r.under_1))
    parts.append(f"gradients below 2^-24: {_pct(low.under_scaled)} at scale "
                 f"{found.scale():g}, {_pct(low.under_1)} at 1 ({low.name})")
  errors = [r for r in rows if r.bf16_error is not None]
  if errors:
    bad = max(errors, key=lambda r: r.bf16_error)
    parts.append(f"bfloat16 error up to {bad.bf16_error:.2%} ({bad.name})")
  return "; ".join(parts)


def one_line(sample: Sample, policy: str) -> str:
  """`mpt: numerics at step 6 (64 examples, 0.8 s): ` and `describe`'s line."""
  return (f"mpt: numerics at step {sample.step} ({sample.examples} examples, "
          f"{sample.seconds:.1f} s): " + describe(Numerics(policy, samples=[sample])))


def format_table(found: Numerics, limit: int = 40) -> str:
  """Per layer (Markdown): its compute dtype, largest |output|, share above 65504,
  largest |value| its own ops made inside its call (with the op, where only that
  passes 65504), largest |gradient|, shares below 2^-24 at scale 1 and at the scale judged, and
  bfloat16's relative error."""
  scale = found.scale() or 1.0
  lines = ["| layer | class | dtype | max \\|out\\| | out > 65504 | max \\|inside\\| | "
           f"max \\|grad\\| | grad < 2^-24 at 1 | at {scale:g} | bf16 error |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  rows = worst(found)
  for r in rows[:limit]:
    inside = _num(r.in_max) + (f" ({r.in_op})" if r.in_op and r.inside_only() else "")
    lines.append(f"| {r.name} | {r.cls} | {r.dtype} | {_num(r.out_max)} | "
                 f"{_pct(r.overflow)} | {inside} | {_num(r.grad_max)} | {_pct(r.under_1)} | "
                 f"{_pct(r.under_scaled)} | {_pct(r.bf16_error)}"
                 f"{' (reduction)' if r.reduction and r.bf16_error else ''} |")
  if len(rows) > limit:
    lines.append(f"({len(rows) - limit} more layers in {FILE})")
  steps = ", ".join(str(s.step) for s in found.samples)
  lines.append(f"computed in float32 at step {steps}"
               f" ({found.seconds:.1f} s); gradients judged at loss scale {scale:g}")
  lines += [f"not measured: {k}: {v}" for k, v in found.not_measured.items()]
  return "\n".join(lines)
