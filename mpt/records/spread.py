"""Accuracy beside speed: a run's final metrics against float32's own spread over seeds.

One rule for the single run's diagnosis, `--mode=compare` and a sweep: float32 runs
of the same configuration with different seeds give, per metric, the lowest and the
highest value; a run's metric (over several seeds of a policy: their mean) is within
float32's spread when it lies in that range widened by its width on each side (three
runs' range covers about the middle half of their distribution; widened, a fourth
draw of the same falls outside rarely). Fewer than MIN_SEEDS float32 seeds judge
nothing: one run has no spread.
"""

import dataclasses
from typing import Any

METRICS = ("train_loss", "train_accuracy", "val_loss", "val_accuracy")
MIN_SEEDS = 2
EDGE = 1e-9  # A value on the window's edge is within it, float arithmetic aside.


@dataclasses.dataclass
class Judged:
  """One metric of one run beside float32's seeds."""
  metric: str
  value: float
  low: float  # float32's lowest and highest over its seeds.
  high: float
  seeds: int
  within: bool

  def describe(self) -> str:
    where = "within" if self.within else "outside"
    return (f"{self.metric} {self.value:.4g} {where} float32's {self.low:.4g}.."
            f"{self.high:.4g} ({self.seeds} seeds)")


def metrics_of(run: Any) -> dict[str, float | None]:
  """The final metrics of a RunSummary or a sweep Cell."""
  return {m: getattr(run, m, None) for m in METRICS}


def judge(values: dict[str, float | None],
          float32: list[dict[str, float | None]]) -> list[Judged]:
  """Each metric of `values` that float32's runs (one per seed) give MIN_SEEDS or more
  figures for, judged against their spread."""
  found = []
  for metric in METRICS:
    value = values.get(metric)
    base = [b[metric] for b in float32 if b.get(metric) is not None]
    if value is None or len(base) < MIN_SEEDS:
      continue
    low, high = min(base), max(base)
    width = high - low  # The window: float32's range widened by its width each side.
    found.append(Judged(metric, value, low, high, len(base),
                        low - width - EDGE <= value <= high + width + EDGE))
  return found


def by_seed(runs: list[Any]) -> list[Any]:
  """One run per seed (the last given of each): repeats of a seed are not spread."""
  return list({getattr(run, "seed", None): run for run in runs}.values())


@dataclasses.dataclass
class PolicySeeds:
  """One policy's runs of one configuration over seeds, beside float32's."""
  key: tuple  # The configuration, policy and seed aside.
  policy: str
  seeds: int
  values: dict[str, list[float]]  # Metric -> its value per seed.
  # Its metrics' means over its seeds against float32's spread ([]: float32).
  judged: list[Judged]

  @property
  def within(self) -> bool | None:
    """Whether its metrics (means over its seeds) stayed within float32's spread;
    None where none was judged (float32 itself, or fewer than MIN_SEEDS float32
    seeds)."""
    return all(j.within for j in self.judged) if self.judged else None

  def describe(self) -> str:
    """`val_accuracy 0.31 (0.29..0.33 over 3 seeds)`, per metric."""
    parts = []
    for metric, values in self.values.items():
      mean = sum(values) / len(values)
      parts.append(f"{metric} {mean:.4g}" + (
          f" ({min(values):.4g}..{max(values):.4g} over {len(values)} seeds)"
          if len(values) > 1 else ""))
    return ", ".join(parts)


def across_seeds(runs: list[Any], key) -> list[PolicySeeds]:
  """Per configuration (`key(run)`, policy and seed left out) and policy, in order of
  first appearance: the finished runs' metrics over seeds, their means judged against
  the float32 runs of the same configuration. (The mean over a policy's seeds, not
  each seed: four metrics of three seeds each judged alone would put some seed
  outside a spread of three float32 seeds for no reason but chance.)"""
  groups: dict[tuple, dict[str, list[Any]]] = {}
  for run in runs:
    groups.setdefault(key(run), {}).setdefault(run.policy, []).append(run)
  found = []
  for k, by_policy in groups.items():
    base = [metrics_of(r) for r in by_seed(by_policy.get("float32", []))]
    for policy, members in by_policy.items():
      members = by_seed(members)
      values = {m: [v for r in members if (v := getattr(r, m, None)) is not None]
                for m in METRICS}
      means = {m: sum(v) / len(v) for m, v in values.items() if v}
      judged = [] if policy == "float32" else judge(means, base)
      found.append(PolicySeeds(k, policy, len(members),
                               {m: v for m, v in values.items() if v}, judged))
  return found
