"""layers.json: what each layer of one model costs here under each policy, typed, with
what a per-layer precision plan predicts from it and the plan it predicts fastest.

`LayerCosts` is one measurement (mpt/measure/layercost.py): per layer signature (a
layer class, its settings and input shapes; layers alike are timed once), its forward
and backward ms per call at the run's batch under each policy; the rate of a cast
between two dtypes (an intercept and a per-element slope, timed at two sizes), applied
at every edge whose two layers compute in different dtypes; the optimizer's update per
policy. `predict` adds them up for any assignment of policies to layers, so the uniform
policies and any plan are priced by the same sum; `best_plan` searches the per-class
plans. Cached per model signature like the step's cost (mpt/records/cost.py); this
module is the record's one reader and writer.
"""

import dataclasses
import pathlib
from typing import Any

from mpt import config
from mpt.records import keyed
from mpt.records.cost import times
from mpt.records import typed

SCHEMA = 1
MIN_GAIN = 0.01  # A class moves in the plan search only where it saves this share.


@dataclasses.dataclass
class LayerRow:
  """Layers of one signature: their forward + backward ms per call, per policy."""
  cls: str
  names: list[str]  # The layers (leaf layers of one call of the model), in call order.
  calls: int  # Their calls in one step (a shared layer counts each call).
  input_shapes: list[list[int]]  # Per example, of each tensor of the first argument.
  ms: dict[str, float | None] = dataclasses.field(default_factory=dict)
  # Policy -> why its ms is an estimate or missing ("predicted from the kernel table:
  # float16 conv 40x float32", "first call > 5x float32's: one call timed", "failed").
  notes: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Edge:
  """A tensor one layer hands another: a cast where their compute dtypes differ."""
  producer: str | None  # The layer that made it; None: the model's (float32) input.
  consumer: str
  elements: int  # At the run's batch.


@dataclasses.dataclass
class LayerCosts(typed.Record):
  """One measurement of a model's layers under each policy at one batch."""
  key: dict[str, Any]
  batch: int
  rows: list[LayerRow] = dataclasses.field(default_factory=list)
  edges: list[Edge] = dataclasses.field(default_factory=list)
  # "float32>bfloat16" -> [intercept ms, ms per million elements] of a forward cast
  # and the backward cast of its gradient.
  casts: dict[str, list[float]] = dataclasses.field(default_factory=dict)
  optimizer_ms: dict[str, float] = dataclasses.field(default_factory=dict)
  overhead_ms: float = 0.0  # One tf.function call's dispatch, taken off each row.
  skipped: list[str] = dataclasses.field(default_factory=list)  # Layers not timed, why.
  seconds: float = 0.0
  source: str = "measured"
  schema: int = SCHEMA

  def classes(self) -> list[str]:
    return list(dict.fromkeys(r.cls for r in self.rows))

  def cast_ms(self, src: str, dst: str, elements: int) -> float:
    if src == dst:
      return 0.0
    intercept, per_million = self.casts.get(f"{src}>{dst}", (0.0, 0.0))
    return intercept + per_million * elements / 1e6

  def predict(self, policy: str, by_class: dict[str, str] | None = None
              ) -> dict[str, float] | None:
    """{layers, casts, optimizer, total} ms of one step with `policy` for every layer
    but the classes `by_class` moves; None where a layer's time is missing."""
    by_class = by_class or {}
    layer_policy = {n: by_class.get(r.cls, policy) for r in self.rows for n in r.names}
    layers = 0.0
    for r in self.rows:
      if not r.ms:  # Not timed under any policy (said in `skipped`).
        continue
      for name in r.names:
        ms = r.ms.get(layer_policy[name])
        if ms is None:
          return None
        layers += ms * r.calls / len(r.names)
    casts = 0.0
    for e in self.edges:
      src = (config.POLICY_DTYPE[layer_policy.get(e.producer, "float32")]
             if e.producer else "float32")
      casts += self.cast_ms(src, config.POLICY_DTYPE[layer_policy[e.consumer]], e.elements)
    scaled = config.scales(policy, *layer_policy.values())
    opt = self.optimizer_ms.get("mixed_float16" if scaled else "float32", 0.0)
    return {"layers": round(layers, 3), "casts": round(casts, 3),
            "optimizer": round(opt, 3), "total": round(layers + casts + opt, 3)}

  def by_class(self, policy: str) -> dict[str, dict[str, float]]:
    """{class: {layers, calls, ms}} under `policy` (ms: None where not measured)."""
    found: dict[str, dict[str, Any]] = {}
    for r in self.rows:
      row = found.setdefault(r.cls, {"layers": 0, "calls": 0, "ms": 0.0})
      row["layers"] += len(r.names)
      row["calls"] += r.calls
      ms = r.ms.get(policy)
      row["ms"] = None if ms is None or row["ms"] is None else row["ms"] + ms * r.calls
    return found


@dataclasses.dataclass
class Plan:
  """A policy for the model and the classes kept in another, with its predicted ms."""
  policy: str
  by_class: dict[str, str]
  predicted_ms: float
  uniform_ms: dict[str, float]  # Each uniform policy's predicted ms.

  def layer_policy(self) -> str:
    """As --layer_policy's value (empty: the uniform policy)."""
    return ",".join(f"{c}={p}" for c, p in self.by_class.items())


def best_plan(costs: LayerCosts, start: str | None = None) -> Plan | None:
  """The per-class plan the costs predict fastest over `start` (default: the uniform
  policy they predict fastest; `--policy=auto` gives the one the whole step measured
  fastest): the one move of a class to another policy (casts at its new boundaries
  included) that saves most, repeated while one saves more than MIN_GAIN of the step.
  None where `start` could not be priced."""
  uniform = {p: costs.predict(p) for p in config.POLICY_DTYPE}
  uniform = {p: v["total"] for p, v in uniform.items() if v}
  if not uniform or (start and start not in uniform):
    return None
  policy = start or min(uniform, key=uniform.get)
  moved: dict[str, str] = {}
  best = uniform[policy]
  while True:
    trials = []
    for cls in costs.classes():
      for other in config.POLICY_DTYPE:
        if other == moved.get(cls, policy):
          continue
        trial = {**moved, cls: other}
        trial = {c: p for c, p in trial.items() if p != policy}
        found = costs.predict(policy, trial)
        if found:
          trials.append((found["total"], trial))
    if not trials:
      break
    total, trial = min(trials, key=lambda t: t[0])
    if total > best * (1 - MIN_GAIN):
      break
    best, moved = total, trial
  return Plan(policy, moved, round(best, 3), uniform)


def read(path: pathlib.Path) -> LayerCosts:
  """A layers.json; ValueError/OSError if it is not one of this schema."""
  return keyed.read(path, SCHEMA, "per-layer cost", LayerCosts.from_dict)


def cached(key: dict[str, Any]) -> LayerCosts | None:
  return keyed.cached("layers", key, read)


def save(costs: LayerCosts) -> pathlib.Path:
  return keyed.save("layers", costs)


def slow_classes(costs: LayerCosts, policy: str, at_least: float = 1.1
                 ) -> list[dict[str, Any]]:
  """The layer classes slower under `policy` than under float32 by `at_least`, most
  extra time first: {cls, layers, share (of the policy's predicted step), ratio}."""
  base, mine = costs.by_class("float32"), costs.by_class(policy)
  total = (costs.predict(policy) or {}).get("total")
  found = []
  for cls, row in mine.items():
    f32 = base[cls]["ms"]
    if row["ms"] and f32 and row["ms"] >= at_least * f32:
      found.append({"cls": cls, "layers": row["layers"], "ms": row["ms"],
                    "share": row["ms"] / total if total else None,
                    "ratio": row["ms"] / f32, "extra_ms": row["ms"] - f32})
  return sorted(found, key=lambda r: -r["extra_ms"])


def describe_slow(costs: LayerCosts, policy: str, most: int = 3) -> str | None:
  """`DepthwiseConv2D: 17 layers, 41% of the bfloat16 step, 2.6x their float32 time;
  ...` for the classes that make `policy` slower, or None."""
  dtype = config.POLICY_DTYPE[policy]
  parts = [f"{r['cls']}: {r['layers']} layer{'s' * (r['layers'] != 1)}, "
           + (f"{r['share']:.0%} of the {dtype} step, " if r["share"] else "")
           + f"{times(r['ratio'])} their float32 time"
           for r in slow_classes(costs, policy)[:most]]
  return "; ".join(parts) or None
