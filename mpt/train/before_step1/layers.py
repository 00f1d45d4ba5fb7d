"""A run's per-layer cost (mpt/measure/layercost.py, record mpt/records/layers.py):
when it is measured, where it is cached, and the line that says it before step 1.

It is measured only to explain something or to decide something, never as a second
answer to what the step's cost (mpt/train/before_step1/cost.py) already measured: where the run's
16-bit policy measured slower than float32 (which layers make it slow), for
`--mode=inspect` (its table), and for `--policy=auto` (the plan it predicts fastest).
A cached measurement of the same model signature here is always read. A run shorter
than the step cost's minimum measures nothing.
$MPT_LAYERS stands in for the measurement: `none`, or a recorded layers.json.
"""

from typing import Callable

import keras
import tensorflow as tf

from mpt import config
from mpt.machine import fastpath
from mpt.measure import layercost
from mpt.measure import observe
from mpt.records import cost as cost_lib
from mpt.records import keyed
from mpt.records import layers as layers_lib
from mpt.records.layers import LayerCosts
from mpt.train.before_step1 import cost as timing
from mpt.train.common import precision

ENV = "MPT_LAYERS"
SLOWER = 1.05  # A 16-bit policy measured this much slower than float32 is explained.


key = timing.cache_key


def measure(cfg: config.Config, model: keras.Model) -> LayerCosts:
  """Every layer of `model` (the run's) timed under each policy here, cached."""
  x = observe.sample_input(model, 2, cfg.seed)
  table = timing.kernel_table(families(model))
  found = layercost.measure(
      model, x, cost_lib.device_batch(cfg), key(cfg),
      lambda p: precision.make_optimizer(p, cfg.learning_rate, cfg.loss_scale),
      jit=cfg.jit_compile, table=table)
  layers_lib.save(found)
  return found


def families(model: keras.Model) -> list[str]:
  """The op families of `model`'s layers (the kernel table's rows it reads)."""
  return fastpath.families_of(precision.layer_classes(model))


def stand_in() -> tuple[bool, LayerCosts | None]:
  """(whether $MPT_LAYERS stands in, the record it names): records/keyed.py
  `stand_in`; a file it cannot read is said and stands in for none."""
  standing, found, note = keyed.stand_in(ENV, layers_lib.read)
  if note:
    print(f"mpt: note: {note}", flush=True)
  return standing, found


def read_or_measure(cfg: config.Config, model: keras.Model) -> LayerCosts | None:
  """For `--mode=inspect` and `--policy=auto`: the stand-in, the cache, or measured
  now."""
  standing, found = stand_in()
  return found if standing else (layers_lib.cached(key(cfg)) or measure(cfg, model))


def said(get: Callable[[], LayerCosts | None], policy: str,
         cost: cost_lib.Cost | None = None) -> LayerCosts | None:
  """What `get()` returns, said in one line (slower classes under `policy`, the gap
  to `cost`'s timed step); None, said, where it fails: the run goes on without it."""
  try:
    found = get()
  except (tf.errors.OpError, ValueError, TypeError) as e:
    print(f"mpt: note: the per-layer cost was not measured: {type(e).__name__}: "
          f"{(str(e).splitlines() or [''])[0][:200]}", flush=True)
    return None
  if found:
    print(one_line(found, policy, cost), flush=True)
  return found


def for_run(cfg: config.Config, model: keras.Model, cost: cost_lib.Cost | None,
            planned_steps: int) -> LayerCosts | None:
  """The run's per-layer cost: where it explains the run's policy measured slower
  than float32, or found cached; else None."""
  standing, found = stand_in()
  if standing:
    return found
  ratio = (cost.ratios() if cost else {}).get(cfg.policy)  # float32's own is 1.
  explains = ratio and ratio >= SLOWER and planned_steps >= cost_lib.MIN_RUN_STEPS
  return layers_lib.cached(key(cfg)) or (measure(cfg, model) if explains else None)


def one_line(found: LayerCosts, policy: str, cost: cost_lib.Cost | None = None) -> str:
  """`mpt: per layer here (measured in 12.3 s, summed): float32 ~57 ms (the step
  ~74, -23%), mixed_bfloat16 ~35 (...); slower under mixed_bfloat16: ...`."""
  sums = {p: found.predict(p) for p in config.POLICY_DTYPE}
  steps = {r.policy: r.ms_per_step for r in (cost.policies if cost else [])
           if r.ms_per_step and not r.predicted and not r.layer_policy}
  parts = [f"{p} ~{v['total']:,.0f} ms" + (
      f" (the step ~{steps[p]:,.0f}, {v['total'] / steps[p] - 1:+.0%})" if p in steps
      else "") for p, v in sums.items() if v]
  line = f"mpt: per layer here ({_how(found)}, summed): " + ", ".join(parts)
  slow = layers_lib.describe_slow(found, policy) if policy != "float32" else None
  return line + (f"; slower under {policy}: {slow}" if slow else "")


def format_table(found: LayerCosts, policy: str) -> str:
  """Per layer class: layers, calls, forward + backward ms per step under each policy
  and its ratio to float32; then the casts, the optimizer, the sums, the plan."""
  policies = list(config.POLICY_DTYPE)
  by = {p: found.by_class(p) for p in policies}
  lines = ["| layer class | layers | " + " | ".join(f"{p} ms" for p in policies) + " |"]
  for cls in found.classes():
    cells = []
    for p in policies:
      ms, base = by[p][cls]["ms"], by["float32"][cls]["ms"]
      ratio = (f" ({cost_lib.times(ms / base)})" if ms is not None and base
               and p != "float32" else "")
      cells.append("-" if ms is None else f"{ms:,.1f}{ratio}")
    lines.append(f"| {cls} | {by['float32'][cls]['layers']} | " + " | ".join(cells) + " |")
  sums = {p: found.predict(p) for p in policies}
  for part in ("casts", "optimizer", "total"):
    lines.append(f"| {part} | | " + " | ".join(
        f"{sums[p][part]:,.1f}" if sums[p] else "-" for p in policies) + " |")
  plan = layers_lib.best_plan(found)
  if plan:
    moved = plan.layer_policy() or "no layer moved"
    lines.append(f"predicted fastest: --policy={plan.policy}"
                 + (f" --layer_policy={moved}" if plan.by_class else f" ({moved})")
                 + f", ~{plan.predicted_ms:,.0f} ms/step")
  notes = sorted({f"{r.cls} {p}: {n}" for r in found.rows for p, n in r.notes.items()})
  lines += [f"note: {n}" for n in notes[:6]]
  if found.skipped:
    lines.append(f"not timed: {', '.join(found.skipped[:8])}")
  lines.append(f"per layer at batch {found.batch}, forward and backward ({_how(found)})")
  return "\n".join(lines)


def _how(found: LayerCosts) -> str:
  return (f"measured in {found.seconds:.1f} s" if found.source == "measured"
          else found.source)
