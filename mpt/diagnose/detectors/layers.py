"""The detector that reads the run's per-layer cost (summary.json `layer_costs`,
mpt/measure/layercost.py): the layer classes that make a 16-bit policy slower here,
whether or not a profile was taken, and the per-layer plan that keeps them apart.
"""

from mpt.diagnose.detectors.registry import detector
from mpt.diagnose.evidence import Evidence
from mpt.diagnose.findings import Finding
from mpt.diagnose.thresholds import SLOWER_THAN_FLOAT32
from mpt.records import layers as layers_lib
from mpt.records.cost import times

AT_STAKE = 0.05  # The slow classes' extra time, as a share of the step, to say it.


@detector("slow_layers", needs="layer cost")
def slow_layers(ev: Evidence) -> Finding | None:
  """Layer classes measured slower under the run's 16-bit policy than under float32,
  holding at least AT_STAKE of the step; the next step is the plan the per-layer
  costs predict fastest."""
  s, policy = ev.summary, ev.summary.sixteen  # A --layer_policy's too.
  costs = s.layer_costs
  if not costs or not policy:
    return None
  mine = costs.predict(policy)
  slow = layers_lib.slow_classes(costs, policy)
  extra = sum(r["extra_ms"] for r in slow)
  if not mine or not slow or extra < AT_STAKE * mine["total"]:
    return None
  base = costs.predict("float32")
  evidence = [f"per layer before step 1 (forward and backward, batch {costs.batch}): "
              + layers_lib.describe_slow(costs, policy)]
  if base:
    evidence.append(f"summed per layer: {policy} ~{mine['total']:,.0f} ms/step "
                    f"(casts ~{mine['casts']:,.1f}), float32 ~{base['total']:,.0f}")
  plan = layers_lib.best_plan(costs)
  step = ev.rerun(plan.policy, plan.layer_policy()) if plan else ev.rerun("float32")
  if plan and plan.by_class:
    evidence.append(f"the per-layer costs predict --policy={plan.policy} with "
                    f"{plan.layer_policy()} at ~{plan.predicted_ms:,.0f} ms/step "
                    "(to be measured: --policy=auto times it)")
  loss = mine["total"] / base["total"] if base and base["total"] else None
  return Finding(
      "slow_layers", "medium" if loss and loss > SLOWER_THAN_FLOAT32 else "low",
      min(extra / mine["total"], 1.0),
      f"{', '.join(r['cls'] for r in slow[:3])} slower under {policy} here "
      f"({times(slow[0]['ratio'])} float32's time"
      + (f", {slow[0]['share']:.0%} of the step)" if slow[0]["share"] else ")"),
      f"layer classes slower than under float32 holding >= {AT_STAKE:.0%} of the "
      "16-bit step, in the per-layer cost measured before step 1",
      evidence, step, ["layer cost"], None)
