"""What a run learnt before its first step, one record for both entries: the command
line's (mpt/train/before_step1/measure.py fills it before step 1) and a script's
(mpt/train/script/inspect.py and stepcost.py fill it after the first step and each
fit's warm-up). summary.json takes its fields from `fields()`, whoever filled it.
"""

import dataclasses
from typing import Any

from mpt.records.cost import Cost, OnednnChoice
from mpt.records.layers import LayerCosts
from mpt.records.memory import MemoryPlan
from mpt.records.verdict import PolicyChoice, PolicyVerdict


@dataclasses.dataclass
class BeforeStep1:
  """Each fact once (summary.json's `onednn_choice`, `cost`, `policy_choice`,
  `policy_verdict`, `layer_costs`)."""
  # The command line's run as it trains (its Plan: the oneDNN state and auto's choice
  # settled); None for a script, whose program is its own.
  cfg: Any = None
  onednn: OnednnChoice | None = None  # TF's oneDNN rewrite, and why.
  cost: Cost | None = None  # This model's step per policy.
  choice: PolicyChoice | None = None  # --policy=auto's record.
  layer_costs: LayerCosts | None = None  # Its layers per policy.
  verdict: PolicyVerdict | None = None  # The run's policy against the cost.
  report: dict[str, Any] | None = None  # The run's model's dtype report (dtypes.json).
  memory: MemoryPlan | None = None  # The memory preflight's plan (the command line's).

  def fields(self) -> dict[str, Any]:
    """RunSummary's fields of what was learnt."""
    return dict(onednn_choice=self.onednn, cost=self.cost, policy_choice=self.choice,
                layer_costs=self.layer_costs, policy_verdict=self.verdict)
