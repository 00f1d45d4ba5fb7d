"""When a run measures its per-layer cost (mpt/train/before_step1/layers.py): to explain a 16-bit
policy measured slower than float32, never for a float32 run or a short one, once per
model signature (then the cache), and a recorded stand-in; the lines that say it."""

import pytest
import tensorflow as tf

from mpt import config
from mpt.records import layers as records
from mpt.records.cost import Cost, PolicyCost
from mpt.records.layers import Edge, LayerCosts, LayerRow
from mpt.train.before_step1 import layers

BF16 = "mixed_bfloat16"


def _costs(key=None) -> LayerCosts:
  rows = [LayerRow("Conv2D", ["conv1", "conv2"], 2, [[8, 8, 3]],
                   {"float32": 10.0, BF16: 5.0, "mixed_float16": 6.0}),
          LayerRow("DepthwiseConv2D", ["dw1", "dw2"], 2, [[8, 8, 16]],
                   {"float32": 2.0, BF16: 6.0, "mixed_float16": 100.0})]
  edges = [Edge(None, "conv1", 1000), Edge("conv1", "dw1", 1_000_000),
           Edge("dw1", "conv2", 1_000_000), Edge("conv2", "dw2", 1_000_000)]
  casts = {f"{a}>{b}": [0.1, 1.0] for a in ("float32", "bfloat16", "float16")
           for b in ("float32", "bfloat16", "float16") if a != b}
  return LayerCosts(key or {"model": "m"}, 32, rows, edges, casts,
                    {"float32": 3.0, "mixed_float16": 4.0}, seconds=1.5)


def _step(bf16_ms: float) -> Cost:
  return Cost({}, True, 32, [PolicyCost("float32", ms_per_step=30.0),
                             PolicyCost(BF16, ms_per_step=bf16_ms)])


@pytest.fixture
def measured(monkeypatch, tmp_path):
  """layers.measure counted (it returns hand-made costs), with an empty cache."""
  monkeypatch.delenv("MPT_LAYERS")
  monkeypatch.setenv("MPT_CACHE", str(tmp_path))
  calls = []

  def measure(cfg, model):
    calls.append(cfg.policy)
    found = _costs(layers.key(cfg))
    records.save(found)
    return found

  monkeypatch.setattr(layers, "measure", measure)
  return calls


def test_a_slower_16_bit_policy_is_explained_once_then_read_from_the_cache(measured):
  cfg = config.Config(policy=BF16, image_size=21)
  found = layers.for_run(cfg, None, _step(33.0), 100)  # 1.1x float32's step.
  assert measured == [BF16] and found.rows[1].cls == "DepthwiseConv2D"
  again = layers.for_run(cfg, None, _step(33.0), 100)
  assert measured == [BF16] and again.source.startswith("cache: ")
  # Read from the cache even where nothing would be measured (a float32 run).
  assert layers.for_run(config.Config(image_size=21), None, None, 5) is not None


@pytest.mark.parametrize("policy, bf16_ms, steps", [
    ("float32", 60.0, 100),  # float32 itself: nothing to explain.
    (BF16, 31.0, 100),       # 1.03x float32's: below SLOWER (1.05x).
    (BF16, 60.0, 10),        # a run shorter than the measurement.
])
def test_nothing_is_measured_where_nothing_needs_explaining(measured, policy, bf16_ms,
                                                            steps):
  cfg = config.Config(policy=policy, image_size=22)
  assert layers.for_run(cfg, None, _step(bf16_ms), steps) is None and measured == []
  assert layers.for_run(cfg, None, None, 100) is None and measured == []


def test_a_recorded_stand_in_or_none(monkeypatch, tmp_path):
  path = tmp_path / "layers.json"
  path.write_text(__import__("json").dumps(_costs().to_dict()))
  monkeypatch.setenv("MPT_LAYERS", str(path))
  found = layers.for_run(config.Config(policy=BF16), None, None, 5)
  assert found.source == f"recorded: {path}" and layers.read_or_measure(
      config.Config(), None).rows == found.rows
  monkeypatch.setenv("MPT_LAYERS", "none")
  assert layers.for_run(config.Config(policy=BF16), None, _step(60.0), 100) is None


def test_the_lines_say_the_sums_the_gap_to_the_step_and_the_slower_classes(capsys):
  found = _costs()
  said = layers.said(lambda: found, BF16, _step(24.0))
  assert said is found
  line = capsys.readouterr().out.strip()
  assert line.startswith("mpt: per layer here (measured in 1.5 s, summed): float32 "
                         "~27 ms (the step ~30, -10%), mixed_bfloat16 ~25 ms (the step "
                         "~24, +5%)")
  assert line.endswith("slower under mixed_bfloat16: DepthwiseConv2D: 2 layers, 48% of "
                       "the bfloat16 step, 3x their float32 time")
  table = layers.format_table(found, BF16)
  assert "| DepthwiseConv2D | 2 | 4.0 | 12.0 (3x) | 200.0 (50x) |" in table
  assert ("predicted fastest: --policy=mixed_bfloat16 --layer_policy="
          "DepthwiseConv2D=float32, ~20 ms/step") in table


def test_a_measurement_that_fails_is_a_note_and_the_run_goes_on(capsys):
  def fails():
    raise tf.errors.InvalidArgumentError(None, None, "no kernel for this layer")
  assert layers.said(fails, BF16) is None
  assert capsys.readouterr().out.strip() == (
      "mpt: note: the per-layer cost was not measured: InvalidArgumentError: no kernel "
      "for this layer")
