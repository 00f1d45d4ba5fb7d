"""Detectors that read the run's per-layer numerics (numerics.json,
mpt/records/numerics.py) and its final metrics beside float32's seeds
(mpt/records/spread.py): does the 16-bit policy train the same model, and where not,
which layer.

Each names the layer. For the run's own 16-bit dtype the finding is about this run;
for the other (and in a float32 run) it is forward-looking, low: "under
mixed_float16, layer X's activations would overflow". A layer whose policy is its
own (a float32 softmax under a mixed policy) is judged in the dtype it computes in.
"""

from mpt import config
from mpt.diagnose.detectors.registry import detector
from mpt.diagnose.evidence import Evidence
from mpt.diagnose.findings import Finding
from mpt.diagnose.thresholds import (BF16_ERROR, SCALE_HEADROOM, SCALE_FALL,
                                     UNDERFLOW_SHARE)
from mpt.records import numerics as numerics_lib
from mpt.records import spread
from mpt.records.cost import times
from mpt.records.numerics import F16_MAX, Worst


def _rows(ev: Evidence) -> list[Worst]:
  return numerics_lib.worst(ev.numerics) if ev.numerics else []


def _under(ev: Evidence, dtype: str, rows: list[Worst]) -> tuple[list[Worst], bool]:
  """(the rows that compute, or would compute, in `dtype`; whether the run itself
  computes in it, its policy or its --layer_policy)."""
  own = config.POLICY_DTYPE.get(ev.summary.sixteen or "")  # A --layer_policy's too.
  if own == dtype:
    return [r for r in rows if r.dtype == dtype], True
  return [r for r in rows if not r.pinned or r.dtype == dtype], False


def _keep_float32(ev: Evidence, names: list[str]) -> str:
  """The next step that keeps `names` in float32."""
  if ev.summary.script:
    return (f"keep {', '.join(names)} in float32: give the layer dtype=\"float32\" "
            "(or set its dtype_policy before compile)")
  pattern = numerics_lib.layer_pattern(names)
  return (f"keep them in float32: python -m mpt.main --flagfile="
          f"{ev.run_dir / 'flags.txt' if ev.run_dir else 'flags.txt'} "
          f"--layer_policy='{pattern}=float32'")


def _named(rows: list[Worst], limit: int = 3) -> str:
  names = [r.name for r in rows[:limit]]
  more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
  return ", ".join(names) + more


@detector("f16_overflow", needs="numerics.json", superseded_by=("skip_cause",))
def f16_overflow(ev: Evidence) -> Finding | None:
  """Layers whose outputs, or the values their own ops make inside their call,
  exceed float16's largest value (65504): under float16 they become inf, and the loss
  NaN. Superseded by skip_cause, which says the same with the skipped steps' replay
  and takes this one's evidence."""
  rows, own = _under(ev, "float16", _rows(ev))
  over, names = numerics_lib.overflow_keep(rows)
  if not over:
    return None
  first = over[0]
  evidence = [_overflow_line(r) for r in over[:5]]
  evidence.append("bfloat16's range reaches 3.4e38: safe under bfloat16")
  when = "" if own else "under mixed_float16, "
  what = "values inside" if all(r.inside_only() for r in over) else "activations"
  return Finding(
      "f16_overflow", "high" if own else "low", max(first.overflow, first.in_over),
      f"{when}{_named(over)}'s {what} {'overflow' if own else 'would overflow'} "
      "float16", f"any output, or value a layer's own ops make inside its call, above "
      f"float16's {F16_MAX:g} (it becomes inf)",
      evidence, _keep_float32(ev, names) + _order_remedy(over[:5])
      + "; or --policy=mixed_bfloat16 (safe under bfloat16)", ["numerics"])


def _overflow_line(r: Worst) -> str:
  """What passes float16's range in layer `r`: its output, or inside its call (the op
  that made the largest value: an Einsum of attention scores before their softmax)."""
  line = (f"{r.name} ({r.cls}): largest |output| {r.out_max:.4g}, "
          f"{r.overflow:.2%} of its outputs above {F16_MAX:g}")
  if r.in_over:
    line += (f"; inside its call, {r.in_op}'s values up to {r.in_max:.4g}, "
             f"{r.in_over:.2%} of them above {F16_MAX:g}")
  if r.order_is_the_issue():
    line += (f"; that is the product before the layer scales it by {r.in_scaled:.3g}: "
             f"scaled first, it would peak at {r.in_max * r.in_scaled:.4g}, in float16's "
             "range (the order of the ops is the issue)")
  return line


def _order_remedy(rows: list[Worst]) -> str:
  """The remedy where only the order of a layer's ops overflows (MultiHeadAttention
  forms q.k before its 1/sqrt(key_dim) scale where it has no dropout)."""
  if not any(r.order_is_the_issue() for r in rows):
    return ""
  return ("; or have the layer scale before its product (Keras' MultiHeadAttention "
          "scales the query first when it has dropout)")


def _forward_overflows(ev: Evidence) -> list:
  """The replayed skipped steps (numerics.json `overflows`) whose forward pass went
  non-finite: an overflow no loss scale causes or cures."""
  found = ev.numerics.overflows if ev.numerics else []
  return [o for o in found if o.op and not o.backward]


@detector("skip_cause", needs="numerics.json")
def skip_cause(ev: Evidence) -> Finding | None:
  """Skipped steps whose replay (mpt/train/common/overflow.py) went non-finite in the
  forward pass: the op and its layer overflow float16 whatever the loss scale (an
  attention layer's scores before their softmax, a custom layer's own product), so
  the dynamic scale falls step after step without cure. (A backward overflow at a
  high scale is how dynamic loss scaling finds its scale: not a finding.)"""
  forward = _forward_overflows(ev)
  if not forward:
    return None
  first = forward[0]
  layers = sorted({o.layer for o in forward if o.layer})
  evidence = [f"step {o.step} (loss scale {o.loss_scale:g}) replayed: {o.op} in "
              f"{o.layer or 'an op outside any layer'} went {o.kind} in the forward "
              f"pass (its output, {o.output})" for o in forward[:3]]
  if ev.numerics.skipped_not_replayed:
    evidence.append(f"{ev.numerics.skipped_not_replayed} later skipped steps were not "
                    "replayed (a bounded number are)")
  evidence.append("every layer's output can be in range: the overflow is inside the "
                  "layer, in an op of its own")
  over, keep = numerics_lib.overflow_keep(_under(ev, "float16", _rows(ev))[0])
  evidence += [f"the numerics sample: {_overflow_line(r)}" for r in over[:3]]
  layers = sorted(set(layers) | set(keep))
  s = ev.summary
  if s.skipped_steps:
    evidence.append(f"{s.skipped_steps} of {s.steps} steps skipped; the loss scale "
                    f"fell to {s.loss_scale:g} without curing it")
  return Finding(
      "skip_cause", "high", 1.0,
      f"steps skipped: {first.op} inside {first.layer} overflows float16 in the "
      "forward pass", "a replayed skipped step whose forward pass goes non-finite "
      "(at any loss scale)", evidence,
      (_keep_float32(ev, layers) if layers else "find the op named above")
      + _order_remedy(over[:3]) + "; or --policy=mixed_bfloat16 (float32's range)",
      ["numerics"])


@detector("gradient_underflow", needs="numerics.json")
def gradient_underflow(ev: Evidence) -> Finding | None:
  """Layers where UNDERFLOW_SHARE or more of the nonzero gradients flowing in, and of
  their summed magnitude, fall below float16's smallest subnormal (2^-24) at the loss
  scale judged: they become zero, and what they carried is lost. (A softmax's
  gradient has many such elements, carrying next to nothing: not a finding.)"""
  rows, own = _under(ev, "float16", _rows(ev))
  scale = ev.numerics.scale() if ev.numerics else None
  low = [r for r in rows if (r.under_scaled or 0) >= UNDERFLOW_SHARE and
         (r.lost_scaled or 0) >= UNDERFLOW_SHARE]
  if not low or scale is None:
    return None
  evidence = [f"{r.name} ({r.cls}): {r.under_scaled:.1%} of its gradients, "
              f"{r.lost_scaled:.1%} of their magnitude, below 2^-24 at scale {scale:g} "
              f"({r.under_1:.1%} at scale 1); largest |gradient| {r.grad_max:.3g}"
              for r in low[:5]]
  cause = _forward_overflows(ev)
  if cause:  # A consequence: the scale fell because of a forward overflow.
    return Finding(
        "gradient_underflow", "low", 0.0,
        f"gradients underflow float16 at the collapsed loss scale {scale:g}: a "
        f"consequence of {cause[0].op} overflowing in {cause[0].layer} (see above)",
        f">= {UNDERFLOW_SHARE:.0%} of a layer's gradients below 2^-24", evidence,
        "fix the overflow first; the scale then stays where these gradients fit",
        ["numerics"])
  keeps = [r.keep for r in low if r.keep]
  lo, hi = (max(k[0] for k in keeps), min(k[1] for k in keeps)) if keeps else (0, 0)
  step = (f"a loss scale from {lo:g} to {hi:g} keeps them (the dynamic scale starts "
          f"at {numerics_lib.DYNAMIC_START:g}): --loss_scale=dynamic, or a fixed "
          f"--loss_scale={lo:g}" if lo and hi and lo <= hi else
          "no one loss scale keeps both their smallest and largest gradients in "
          "float16: " + _keep_float32(ev, [r.name for r in low[:5]]))
  when = "" if own else "under mixed_float16, "
  return Finding(
      "gradient_underflow", "medium" if own else "low", low[0].under_scaled,
      f"{when}{_named(low)}'s gradients {'underflow' if own else 'would underflow'} "
      f"float16 at loss scale {scale:g}",
      f">= {UNDERFLOW_SHARE:.0%} of a layer's nonzero gradients, and of their "
      "magnitude, below 2^-24 at the loss scale", evidence, step, ["numerics", "loss scale"])


@detector("loss_scale_room", needs="numerics.json", superseded_by=("skip_cause",))
def loss_scale_room(ev: Evidence) -> Finding | None:
  """A mixed_float16 run whose dynamic loss scale fell SCALE_FALL-fold or more after
  its first sample, or sits SCALE_HEADROOM-fold or more below the largest scale its
  gradients allow while some of them underflow at it."""
  s, n = ev.summary, ev.numerics
  if not config.scales_loss(s) or not n or n.loss_scale != "dynamic":
    return None  # A fixed scale's trouble is gradient_underflow's.
  scales = [x.loss_scale for x in n.samples if x.loss_scale]
  rows = _rows(ev)
  allowed = min((r.keep[1] for r in rows if r.keep), default=None)
  final = s.loss_scale or (scales[-1] if scales else None)
  if not scales or not final:
    return None
  fell = final * SCALE_FALL <= scales[0]
  lost = max((r.under_scaled or 0) for r in rows) if rows else 0
  far = allowed is not None and final * SCALE_HEADROOM <= allowed and lost > 0
  if not (fell or far):
    return None
  evidence = [f"loss scale {scales[0]:g} at step {n.samples[0].step}, {final:g} at "
              "the end"]
  if allowed:
    evidence.append(f"the gradients allow up to {allowed:g} (largest |gradient| "
                    f"below {F16_MAX:g} there); at {final:g}, up to {lost:.2%} of a "
                    "layer's gradients are below 2^-24")
  return Finding(
      "loss_scale_room", "medium", lost,
      "the loss scale " + ("kept falling" if fell else "sits far below what the "
                           "gradients allow"),
      f"the scale fell >= {times(SCALE_FALL)} after warm-up, or sits >= "
      f"{times(SCALE_HEADROOM)} below the largest the gradients allow while some underflow",
      evidence, "find the step whose gradients overflow (a layer in float16 whose "
      "gradients spike): keep it in float32; or a fixed --loss_scale within the "
      "range the gradients allow", ["numerics", "loss scale"])


@detector("bf16_error", needs="numerics.json")
def bf16_error(ev: Evidence) -> Finding | None:
  """Layers that are, or feed, a reduction (a softmax, normalisation statistics, a
  long sum) whose output bfloat16 moves by BF16_ERROR or more."""
  rows, own = _under(ev, "bfloat16", _rows(ev))
  bad = [r for r in rows if r.reduction and (r.bf16_error or 0) >= BF16_ERROR]
  if not bad:
    return None
  bad.sort(key=lambda r: -r.bf16_error)
  evidence = [f"{r.name} ({r.cls}): output moves {r.bf16_error:.2%} (relative, "
              "recomputed in bfloat16 on the same float32 inputs)" for r in bad[:5]]
  when = "" if own else "under mixed_bfloat16, "
  return Finding(
      "bf16_error", "medium" if own else "low", bad[0].bf16_error,
      f"{when}bfloat16 moves {_named(bad)} by up to {bad[0].bf16_error:.1%}",
      f"relative error >= {BF16_ERROR:.0%} in a layer that is or feeds a reduction",
      evidence, _keep_float32(ev, [r.name for r in bad[:5]]), ["numerics"])


@detector("metrics_spread", needs="float32 seeds")
def metrics_spread(ev: Evidence) -> Finding | None:
  """A 16-bit run's final metrics outside float32's own spread over seeds (float32
  runs of the same configuration next to it)."""
  s = ev.summary
  if s.policy == "float32" or not ev.float32_runs:
    return None
  judged = spread.judge(spread.metrics_of(s),
                        [spread.metrics_of(o) for o in spread.by_seed(ev.float32_runs)])
  out = [j for j in judged if not j.within]
  if not out:
    return None
  return Finding(
      "metrics_spread", "high" if any("accuracy" in j.metric for j in out) else
      "medium", 1.0, f"{s.policy}'s final {', '.join(j.metric for j in out)} outside "
      "float32's spread over seeds",
      "a final metric outside float32's min..max over seeds, widened by its width",
      [j.describe() for j in judged],
      "look at the numerics findings for the layer (--numerics=on), or keep the "
      "layers they name in float32", ["sibling runs"])
