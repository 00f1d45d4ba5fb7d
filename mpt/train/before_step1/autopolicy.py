"""`--policy=auto`: the policy, and the per-layer plan over it, that trains this model
fastest here, read from the one measurement before step 1.

The step's cost (mpt/train/before_step1/cost.py) has timed the model's step under each uniform
policy (a policy the kernel table marks pathological predicted, not run); the fastest
with a finite loss is the best uniform policy, unless the model's numerics on a real
batch (mpt/train/common/numerics.py) say a layer's outputs would overflow float16: then
mixed_float16 is dropped, and the table says which layer and why. Where the per-layer costs
(mpt/train/before_step1/layers.py) predict a plan over it faster (mpt/records/layers.py
`best_plan`: layer classes kept in another policy, casts included), the plan and the
best uniform policy are timed side by side as whole steps, and the plan is adopted
only when measured at least PLAN_MARGIN faster (mpt/records/cost.py): the per-layer
sums guide, the whole step decides. Without a measurement (a stand-in of `none`)
nothing is timed here: float32 is kept, and the record says it is a guess.
The run then trains from scratch with the choice, recorded as that policy (and
--layer_policy) in flags.txt, so that --resume and a replayed flags.txt continue it.
On a GPU the kernel table (mpt/machine/gpu_table.py, from the same measurement) adds
each candidate's Tensor Core share, and the layers a 16-bit candidate left on CUDA
cores.
"""

from typing import Callable

from mpt.config import POLICY_DTYPE, Config
from mpt.machine import gpu_table
from mpt.records.cost import Cost, PolicyCost
from mpt.records.gpu import GpuKernelTable
from mpt.records.layers import Plan
from mpt.records.verdict import BESIDE, Candidate, PolicyChoice
from mpt.records import cost as cost_records
from mpt.train.before_step1 import cost as cost_lib

# Times a plan beside a uniform policy as whole steps: (plan's row, policy's row).
PlanTimer = Callable[[Plan], tuple[PolicyCost | None, PolicyCost | None]]


def _candidate(row: PolicyCost, base_ms: float | None) -> Candidate:
  """A row as a candidate: one without a figure (a bound, a prediction, a failure)
  is dropped, with why; a figure whose calls did not settle stands, its note said."""
  figure = row.ms_per_step and not row.bound and not row.predicted
  return Candidate(row.policy, dropped=None if figure else row.stopped,
                   layer_policy=row.layer_policy).timed_by(row, base_ms)


def _faster_bound(best: Candidate, rows: list[Candidate], cost: Cost,
                  unsafe: dict[str, str]) -> Candidate:
  """`best`, or a candidate whose timing stopped at most below `best`'s figure: it is
  faster whatever its steady step (the one bound that decides the choice)."""
  faster = [r for r in rows if cost.of(r.policy) and r.policy not in unsafe
            and cost.of(r.policy).bound == cost_records.AT_MOST and r.finite
            and r.ms_per_step and r.ms_per_step < best.ms_per_step]
  if not faster:
    return best
  chosen = min(faster, key=lambda r: r.ms_per_step)
  chosen.dropped = None
  return chosen


def _kernels(rows: list[Candidate], kernels: GpuKernelTable | None) -> None:
  """Each candidate's Tensor Core share and CUDA-core layers, from the GPU's table."""
  if kernels is None:
    return
  table = kernels.as_table()
  for r in rows:
    dtype = POLICY_DTYPE[r.policy]
    r.tensor_cores = gpu_table.eligible_on_tensor_cores(kernels, dtype)
    missed = gpu_table.missed(table, dtype)
    if missed and missed[0] >= gpu_table.MISSED:
      r.cuda_cores_layers = missed[1]


def _plan(best: Candidate, plan: Plan | None, time_plan: PlanTimer | None,
          base_ms: float | None) -> tuple[list[Candidate], str, str]:
  """(the plan's rows, the plan adopted or "", why) against the best uniform policy."""
  if plan is None or time_plan is None:
    return [], "", "no per-layer cost here: no plan considered"
  assert plan.policy == best.policy, (plan.policy, best.policy)
  if not plan.by_class:
    return [], "", (f"the per-layer costs predict no plan faster than --policy="
                    f"{plan.policy}")
  mine, theirs = time_plan(plan)
  if not mine or not mine.ms_per_step or not theirs or not theirs.ms_per_step:
    why = (mine.stopped if mine else None) or "not timed"
    return ([_candidate(mine, base_ms)] if mine else [], "",
            f"the plan could not be timed: {why}")
  rows = [_candidate(theirs, base_ms), _candidate(mine, base_ms)]
  rows[0].dropped = BESIDE
  gain = 1 - mine.ms_per_step / theirs.ms_per_step
  said = (f"{plan.layer_policy()} over {plan.policy} measured {gain:+.0%} against "
          f"{theirs.policy} ({mine.ms_per_step:,.1f} vs {theirs.ms_per_step:,.1f} ms, "
          f"side by side)")
  if gain >= cost_records.PLAN_MARGIN and mine.finite:
    return rows, plan.layer_policy(), f"adopted: {said}"
  return rows, "", f"not adopted (needs {cost_records.PLAN_MARGIN:.0%}): {said}"


def choose(cost: Cost | None, plan_for: Callable[[str], Plan | None] | None = None,
           time_plan: PlanTimer | None = None, seconds: float | None = None,
           unsafe: dict[str, str] | None = None) -> tuple[str, str, PolicyChoice]:
  """(the chosen policy, the per-layer plan over it or "", the record of the choice)
  from the step's cost per policy; `plan_for(policy)`: the per-layer costs' fastest
  plan over the best uniform policy, timed by `time_plan` beside it; `seconds`: what
  choosing cost (default: what measuring cost); `unsafe`: policy -> why its numerics
  rule it out (mpt/train/common/numerics.py), however fast it is."""
  seconds = seconds if seconds is not None else cost.seconds if cost else 0.0
  if cost is None:
    return "float32", "", PolicyChoice(
        "auto", "float32", 0, [], seconds,
        note="nothing measured here: float32 kept, a guess, not a measurement")
  base = cost.predicted().get("float32")
  rows = [_candidate(cost.of(p), base) for p in POLICY_DTYPE if cost.of(p)]
  for r in rows:
    r.dropped = r.dropped or (unsafe or {}).get(r.policy)
  usable = [r for r in rows if r.ms_per_step and r.finite and not r.dropped]
  if not usable:
    return "float32", "", PolicyChoice("auto", "float32", 0, rows, seconds,
                                       note="no policy's step could be timed: float32 kept")
  best = _faster_bound(min(usable, key=lambda r: r.ms_per_step), rows, cost, unsafe or {})
  extra, layer_policy, note = _plan(best, plan_for(best.policy) if plan_for else None,
                                    time_plan, base)
  rows += extra
  _kernels(rows, cost.gpu_kernels)
  timed = max((cost.of(p).steps_timed for p in POLICY_DTYPE if cost.of(p)), default=0)
  return best.policy, layer_policy, PolicyChoice(
      "auto", best.policy, timed, rows, round(seconds, 2), layer_policy, note)


def time_plan(cfg: Config, build: Callable, plan: Plan
              ) -> tuple[PolicyCost | None, PolicyCost | None]:
  """(the per-layer plan's row, its policy's row), timed side by side in one
  measurement of the step (mpt/train/before_step1/cost.py), float32 first as always."""
  found = cost_lib.measure(cfg, build, [plan.policy],
                           plans=((plan.policy, plan.layer_policy()),))
  return found.of(plan.policy, plan.layer_policy()), found.of(plan.policy)


def format_table(choice: PolicyChoice, markdown: bool = False) -> str:
  """The candidates as a table: ms/step, time over float32's (the cost line's
  convention), first step, why dropped."""
  gpu = any(r.tensor_cores is not None for r in choice.candidates)
  head = ("| policy | ms/step | time vs float32 | first step ms |"
          + (" on Tensor Cores |" if gpu else "") + " note |")
  lines = [head, "|---|---|---|---|" + ("---|" if gpu else "") + "---|"] if markdown \
      else [head]
  for r in choice.candidates:
    ms = f"{r.ms_per_step:.1f}" if r.ms_per_step else "-"
    vs = cost_records.times(r.time_vs_float32) if r.time_vs_float32 else "-"
    chosen = r.policy == choice.chosen and r.layer_policy == choice.layer_policy and (
        r.dropped is None)
    note = r.dropped or ("non-finite loss" if not r.finite else
                         "chosen" if chosen else "")
    first = f"{r.first_ms:.0f}" if r.first_ms is not None else "-"
    if r.cuda_cores_layers:
      note = "; ".join(filter(None, [note, "CUDA cores: " + ", ".join(r.cuda_cores_layers)]))
    cores = (f" {r.tensor_cores:.0%} |" if r.tensor_cores is not None else " - |") if gpu else ""
    name = r.policy + (f" with {r.layer_policy}" if r.layer_policy else "")
    lines.append(f"| {name} | {ms} | {vs} | {first} |{cores} {note} |")
  if choice.note:
    lines.append(f"plan: {choice.note}" if "plan" in choice.note or "adopted" in
                 choice.note else choice.note)
  lines.append(f"choosing took {choice.seconds:.1f} s (the step's cost before step 1 "
               "included)")
  return "\n".join(lines)
