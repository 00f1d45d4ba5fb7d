"""The per-layer cost record (mpt/records/layers.py): its sums, the cast at a dtype
boundary, the classes it names slower, and the plan it predicts fastest, on costs
written by hand (totals worked out below) and read back from a file."""

import json

import pytest

from mpt.records import layers
from mpt.records.layers import Edge, LayerCosts, LayerRow

F32, BF16, F16 = "float32", "mixed_bfloat16", "mixed_float16"


def _costs() -> LayerCosts:
  """A chain conv1 -> dw1 -> conv2 -> dw2: bfloat16 halves the convolutions and
  triples the depthwise ones; float16's depthwise are pathological."""
  rows = [LayerRow("Conv2D", ["conv1", "conv2"], 2, [[8, 8, 3]],
                   {F32: 10.0, BF16: 5.0, F16: 6.0}),
          LayerRow("DepthwiseConv2D", ["dw1", "dw2"], 2, [[8, 8, 16]],
                   {F32: 2.0, BF16: 6.0, F16: 100.0})]
  edges = [Edge(None, "conv1", 1000), Edge("conv1", "dw1", 1_000_000),
           Edge("dw1", "conv2", 1_000_000), Edge("conv2", "dw2", 1_000_000)]
  casts = {f"{a}>{b}": [0.1, 1.0] for a in ("float32", "bfloat16", "float16")
           for b in ("float32", "bfloat16", "float16") if a != b}
  return LayerCosts({"model": "m"}, 32, rows, edges, casts,
                    {F32: 3.0, F16: 4.0})


def test_uniform_policies_sum_layers_casts_and_the_optimizer():
  costs = _costs()
  assert costs.predict(F32) == {"layers": 24.0, "casts": 0.0, "optimizer": 3.0,
                                "total": 27.0}
  # bfloat16: layers 2*5 + 2*6 = 22; one cast, the float32 input into conv1:
  # 0.1 + 1.0 * 1000 / 1e6 = 0.101.
  assert costs.predict(BF16) == {"layers": 22.0, "casts": 0.101, "optimizer": 3.0,
                                 "total": 25.101}
  # float16 scales the loss: the optimizer's loss-scaled update.
  assert costs.predict(F16)["optimizer"] == 4.0


def test_a_class_kept_in_float32_pays_a_cast_at_each_new_boundary():
  # conv in bfloat16, depthwise in float32: 10 + 4 = 14 ms of layers; casts at the
  # input (0.101) and at the three 1M-element boundaries (1.1 each).
  found = _costs().predict(BF16, {"DepthwiseConv2D": F32})
  assert found["layers"] == 14.0
  assert found["casts"] == pytest.approx(0.101 + 3 * 1.1)
  assert found["total"] == pytest.approx(14.0 + 3.401 + 3.0)


def test_the_plan_keeps_the_losing_class_apart_and_beats_every_uniform_policy():
  plan = layers.best_plan(_costs())
  assert plan.policy == BF16
  assert plan.by_class == {"DepthwiseConv2D": F32}
  assert plan.layer_policy() == "DepthwiseConv2D=float32"
  assert plan.predicted_ms == pytest.approx(20.401)
  assert all(plan.predicted_ms < ms for ms in plan.uniform_ms.values())


def test_no_plan_moves_a_class_when_the_casts_eat_the_gain():
  costs = _costs()
  costs.casts = {k: [0.1, 5.0] for k in costs.casts}  # 5 ms per 1M elements.
  plan = layers.best_plan(costs)
  assert plan.by_class == {} and plan.policy == BF16  # 25.105 ms: the uniform best.


def test_the_slower_classes_are_named_with_their_share_and_ratio():
  costs = _costs()
  slow = layers.slow_classes(costs, BF16)
  assert [r["cls"] for r in slow] == ["DepthwiseConv2D"]
  assert slow[0]["ratio"] == pytest.approx(3.0)
  assert slow[0]["share"] == pytest.approx(12.0 / 25.101)
  assert layers.describe_slow(costs, BF16) == (
      "DepthwiseConv2D: 2 layers, 48% of the bfloat16 step, 3x their float32 time")
  assert layers.slow_classes(costs, F32) == []


def test_a_layer_timed_under_no_policy_is_left_out_and_a_missing_policy_is_none():
  costs = _costs()
  costs.rows.append(LayerRow("Custom", ["c"], 1, [[4]], {}))
  assert costs.predict(F32)["total"] == 27.0
  costs.rows[0].ms.pop(F16)
  assert costs.predict(F16) is None
  assert layers.best_plan(costs).uniform_ms.keys() == {F32, BF16}


def test_the_record_is_read_back_from_its_file_and_cached_by_key(tmp_path, monkeypatch):
  monkeypatch.setenv("MPT_CACHE", str(tmp_path))
  costs = _costs()
  path = layers.save(costs)
  assert json.loads(path.read_text())["rows"][1]["cls"] == "DepthwiseConv2D"
  back = layers.cached({"model": "m"})
  assert back.source.startswith("cache: ") and back.rows == costs.rows
  assert back.predict(BF16) == costs.predict(BF16)
  assert layers.cached({"model": "other"}) is None
  (tmp_path / "bad.json").write_text(json.dumps({"schema": 99}))
  with pytest.raises(ValueError):
    layers.read(tmp_path / "bad.json")
  # A whole record of another schema is not read as this one, nor from the cache.
  path.write_text(json.dumps({**costs.to_dict(), "schema": 99}))
  with pytest.raises(ValueError, match="not a per-layer cost record of schema 1"):
    layers.read(path)
  assert layers.cached({"model": "m"}) is None
