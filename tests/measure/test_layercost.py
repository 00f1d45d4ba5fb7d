"""Each layer timed under each policy (mpt/measure/layercost.py) on a small real model:
which layers are timed once, the edges where a plan pays casts (element counts worked
out by hand), a policy the recorded kernel table marks pathological predicted and
never run, and the global policy left as it was. No timed assertion: which policy is
faster is this host's."""

import json

import keras
import pytest
import tensorflow as tf

from mpt.machine import fastpath
from mpt.measure import layercost
from mpt.train.common import precision

from helpers import DATA

SPR_TABLE = DATA / "kernels" / "intel_spr_amx_recorded.json"


def _model() -> keras.Model:
  """Two twin convolutions on the input (one signature), added, pooled, classified."""
  x = keras.Input((8, 8, 3))
  a = keras.layers.Conv2D(4, 3, padding="same", name="a")(x)
  b = keras.layers.Conv2D(4, 3, padding="same", name="b")(x)
  y = keras.layers.Add(name="add")([a, b])
  y = keras.layers.GlobalAveragePooling2D(name="gap")(y)
  return keras.Model(x, keras.layers.Dense(2, name="head")(y))


def test_layers_alike_are_timed_once_and_every_edge_is_found():
  rows, edges, skipped = layercost.survey(_model(), tf.zeros((2, 8, 8, 3)))
  by = {r.cls: r for r, _, _ in rows}
  assert by["Conv2D"].names == ["a", "b"] and by["Conv2D"].calls == 2
  assert by["Add"].input_shapes == [[8, 8, 4], [8, 8, 4]]
  assert by["Dense"].input_shapes == [[4]] and skipped == []
  # Per example: the 8x8x3 input into a and b, 8x8x4 from each into add, and so on.
  assert [(e.producer, e.consumer, e.elements) for e in edges] == [
      (None, "a", 192), (None, "b", 192), ("a", "add", 256), ("b", "add", 256),
      ("add", "gap", 256), ("gap", "head", 4)]


def test_every_policy_is_timed_and_a_pathological_one_is_predicted_not_run(
    monkeypatch):
  table = json.loads(SPR_TABLE.read_text())
  ran = []
  real = layercost._step

  def step(layer, policy, spec, batch, jit):
    ran.append((type(layer).__name__, policy))
    return real(layer, policy, spec, batch, jit)

  monkeypatch.setattr(layercost, "_step", step)
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    found = layercost.measure(
        _model(), tf.zeros((2, 8, 8, 3)), 4, {"model": "t"},
        lambda p: precision.make_optimizer(p, 1e-3), table=table)
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
  finally:
    keras.mixed_precision.set_global_policy("float32")
  conv = next(r for r in found.rows if r.cls == "Conv2D")
  ratio = fastpath.policy_ratios(table, ["conv"])["mixed_float16"]
  assert ratio >= fastpath.PATHOLOGICAL
  assert ("Conv2D", "mixed_float16") not in ran and ("Dense", "mixed_float16") in ran
  assert conv.ms["mixed_float16"] == pytest.approx(conv.ms["float32"] * ratio, rel=1e-3)
  assert conv.notes["mixed_float16"].startswith("predicted from the kernel table")
  for row in found.rows:  # Every layer has a time under every policy.
    assert set(row.ms) == {"float32", "mixed_bfloat16", "mixed_float16"}
    assert all(ms >= 0 for ms in row.ms.values())
  assert set(found.optimizer_ms) == {"float32", "mixed_float16"}
  assert set(found.casts) == {f"{a}>{b}" for a in ("float32", "bfloat16", "float16")
                              for b in ("float32", "bfloat16", "float16") if a != b}
  assert found.batch == 4 and [e.elements for e in found.edges][:2] == [768, 768]
  # The float32 input cast into bfloat16 at both convolutions: the record's own rate
  # (a 4M-element cast takes longer than a 16K one on any host), rounded as predicted.
  into = found.cast_ms("float32", "bfloat16", 768)
  assert into > 0
  assert found.predict("mixed_bfloat16")["casts"] == pytest.approx(round(2 * into, 3))
  assert found.predict("float32")["casts"] == 0
