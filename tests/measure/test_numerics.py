"""Per-layer numerics (mpt/measure/numerics.py, record mpt/records/numerics.py) on
models built to be numerically wrong in known ways, each checked against the answer
worked out here in numpy, without mpt: a layer whose outputs exceed 65504, gradients
all below 2^-24 at loss scale 1 and representable at the dynamic scale, a
large-vocabulary softmax whose bfloat16 error shows. Then the findings each gives
(mpt/diagnose/detectors/numerics.py): that layer, that type, and not the others.
"""

import dataclasses

import keras
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from mpt.diagnose import detectors
from mpt.diagnose.evidence import Evidence
from mpt.diagnose.thresholds import BF16_ERROR, UNDERFLOW_SHARE
from mpt.measure import numerics
from mpt.records import numerics as records
from mpt.records.numerics import Numerics

# The oracle's float16 limits, from numpy, not from mpt (a wrong constant there must
# not move the expectation with it).
F16_MAX = float(np.finfo(np.float16).max)  # 65504
F16_MIN_SUBNORMAL = float(np.finfo(np.float16).smallest_subnormal)  # 2^-24
from mpt.records.summary import RunSummary

NUMERICS = ("f16_overflow", "gradient_underflow", "loss_scale_room", "bf16_error")


def _findings(found: Numerics, policy: str) -> dict[str, object]:
  ev = Evidence(RunSummary(policy=policy, status="completed"), None, numerics=found)
  return {name: detectors.DETECTORS[name](ev) for name in NUMERICS}


def _sparse(x, y, prediction):
  return keras.losses.SparseCategoricalCrossentropy()(y, prediction)


def overflowing() -> keras.Model:
  """big: 10^4 * sum(x), 8 inputs in [0, 1): above 65504 where sum(x) > 6.5504."""
  x = keras.Input((8,))
  big = keras.layers.Dense(4, kernel_initializer=keras.initializers.Constant(1e4),
                           name="big")(x)
  small = keras.layers.Rescaling(1e-4, name="shrink")(big)
  logits = keras.layers.Dense(3, name="head")(small)
  return keras.Model(x, keras.layers.Activation("softmax", dtype="float32",
                                                name="probs")(logits))


def test_the_layer_above_65504_is_named_with_the_share_numpy_finds():
  rng = np.random.default_rng(0)
  x = rng.uniform(0, 1, (64, 8)).astype("float32")
  x[:, 0] += 3  # sum(x) ~ 7 on average: some rows above 6.5504, some below.
  y = rng.integers(0, 3, 64)
  keras.mixed_precision.set_global_policy("mixed_float16")
  model = overflowing()
  keras.mixed_precision.set_global_policy("float32")
  sample = numerics.sample(model, [(x, y)], _sparse, 1, 2.0**15)
  rows = {r.name: r for r in sample.layers}
  expected = np.abs(x.sum(1, dtype=np.float64) * 1e4)  # Every column of big the same.
  share = float(np.mean(expected > F16_MAX))
  assert 0.05 < share < 0.95, share  # The case it is built for.
  assert rows["big"].output.overflow_share() == pytest.approx(share)
  assert rows["big"].output.max == pytest.approx(expected.max(), rel=1e-6)
  assert rows["shrink"].output.overflow == 0 and rows["head"].output.overflow == 0

  assert rows["big"].dtype == "float16" and rows["probs"].pinned
  found = Numerics("mixed_float16", samples=[sample])
  own = _findings(found, "mixed_float16")
  assert own["f16_overflow"].severity == "high"
  assert "big" in own["f16_overflow"].title
  assert "shrink" not in own["f16_overflow"].title and "head" not in own["f16_overflow"].title
  # shrink is within range but reads big's output: kept in float32, big's output would
  # still be cast to float16 on shrink's entry, so the advice keeps shrink too.
  assert rows["shrink"].reads == ["big"] and rows["head"].reads == ["shrink"]
  assert "--layer_policy='big|shrink=float32'" in own["f16_overflow"].next_step
  assert [k for k, f in own.items() if f] == ["f16_overflow"]
  # A bfloat16 run of it is safe, and told what float16 would do.
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  model = overflowing()
  keras.mixed_precision.set_global_policy("float32")
  sample = numerics.sample(model, [(x, y)], _sparse, 1, None)
  bf16 = _findings(Numerics("mixed_bfloat16", samples=[sample]), "mixed_bfloat16")
  assert bf16["f16_overflow"].severity == "low"
  assert bf16["f16_overflow"].title.startswith("under mixed_float16, big")
  assert any("safe under bfloat16" in e for e in bf16["f16_overflow"].evidence)


def underflowing() -> keras.Model:
  """out's output is scaled by 10^-9 before the loss: every gradient flowing into
  hidden and out is ~1e-11, below 2^-24 (6e-8) at scale 1, ~1e-6 at 2^15."""
  x = keras.Input((8,))
  hidden = keras.layers.Dense(16, name="hidden")(x)
  out = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(0.5),
                           name="out")(hidden)
  return keras.Model(x, keras.layers.Rescaling(1e-9, name="tiny")(out))


def _mse(x, y, prediction):
  return tf.reduce_mean(tf.square(prediction - y))


def test_gradients_below_2_24_at_scale_1_are_named_and_the_dynamic_scale_keeps_them():
  rng = np.random.default_rng(1)
  x = rng.uniform(0, 1, (32, 8)).astype("float32")
  t = rng.uniform(0.5, 1.5, (32, 1)).astype("float32")
  keras.mixed_precision.set_global_policy("mixed_float16")
  model = underflowing()
  keras.mixed_precision.set_global_policy("float32")
  sample = numerics.sample(model, [(x, t)], _mse, 1, 1.0)
  rows = {r.name: r for r in sample.layers}
  # numpy: dL/dy = 2 (y - t) / N; into tiny's input (out's output) times 1e-9; into
  # hidden's output through out's kernel (0.5 each).
  w_h, b_h = (v.numpy().astype(np.float64) for v in model.get_layer("hidden").weights)
  w_o, b_o = (v.numpy().astype(np.float64) for v in model.get_layer("out").weights)
  y = ((x @ w_h + b_h) @ w_o + b_o) * 1e-9
  g_out = 2 * (y - t) / y.size * 1e-9
  g_hidden = g_out @ w_o.T
  for name, g in (("out", g_out), ("hidden", g_hidden)):
    assert np.all(np.abs(g) < F16_MIN_SUBNORMAL)
    assert np.all(np.abs(g) * 2.0**15 >= F16_MIN_SUBNORMAL)
    assert rows[name].grad.max == pytest.approx(np.abs(g).max(), rel=1e-4)
    assert rows[name].grad.share_below(F16_MIN_SUBNORMAL) == 1.0
    assert rows[name].grad.share_below(F16_MIN_SUBNORMAL, 2.0**15) == 0.0
  assert rows["tiny"].grad.share_below(F16_MIN_SUBNORMAL) == 0.0

  fixed = Numerics("mixed_float16", "1", samples=[sample])
  found = _findings(fixed, "mixed_float16")
  under = found["gradient_underflow"]
  assert under.severity == "medium" and "hidden, out" in under.title
  assert "tiny" not in under.title and "at loss scale 1" in under.title
  assert "--loss_scale=dynamic" in under.next_step
  assert [k for k, f in found.items() if f] == ["gradient_underflow"]
  # At the run's dynamic scale the same gradients are kept: nothing to find.
  kept = dataclasses.replace(sample, loss_scale=2.0**15)
  assert not any(_findings(Numerics("mixed_float16", samples=[kept]),
                           "mixed_float16").values())


def large_vocabulary(vocab: int = 8192) -> keras.Model:
  """Logits around 100 (a bias drifted up: a softmax ignores it, bfloat16's spacing
  there is 0.5), spread ~4, over 8192 classes, into a softmax computed in bfloat16."""
  x = keras.Input((64,))
  logits = keras.layers.Dense(
      vocab, name="logits", bias_initializer=keras.initializers.Constant(100.0),
      kernel_initializer=keras.initializers.RandomNormal(stddev=0.5, seed=0))(x)
  return keras.Model(x, keras.layers.Softmax(name="softmax")(logits))


def test_a_large_vocabulary_softmax_shows_bfloat16s_error_and_its_logits_do_not():
  rng = np.random.default_rng(2)
  x = rng.normal(0, 1, (16, 64)).astype("float32")
  y = rng.integers(0, 8192, 16)
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    model = large_vocabulary()
    sample = numerics.sample(model, [(x, y)], _sparse, 1, None)
  finally:
    keras.mixed_precision.set_global_policy("float32")
  rows = {r.name: r for r in sample.layers}
  assert rows["softmax"].dtype == "bfloat16" and rows["softmax"].reduction
  # numpy: the softmax of the float32 logits, and of the same logits rounded to
  # bfloat16 (its input rounding alone; the kernel's own rounding comes on top).
  w, b = (v.numpy().astype(np.float64) for v in model.get_layer("logits").weights)
  z = (x[:numerics.BF16_EXAMPLES] @ w + b)
  rounded = z.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
  soft = lambda v: np.exp(v - v.max(1, keepdims=True)) / np.exp(
      v - v.max(1, keepdims=True)).sum(1, keepdims=True)
  oracle = np.linalg.norm(soft(rounded) - soft(z)) / np.linalg.norm(soft(z))
  assert oracle > 2 * BF16_ERROR  # The case it is built for.
  assert oracle / 2 < rows["softmax"].bf16_error < oracle * 2
  assert rows["logits"].bf16_error < BF16_ERROR

  found = _findings(Numerics("mixed_bfloat16", samples=[sample]), "mixed_bfloat16")
  bad = found["bf16_error"]
  assert bad.severity == "medium" and "softmax" in bad.title
  assert "logits" not in bad.title
  assert [k for k, f in found.items() if f] == ["bf16_error"]


def test_a_sample_leaves_the_model_as_it_was():
  """Policies and non-trainable state (BatchNorm's moving statistics) put back; a
  large batch read in its first MAX_EXAMPLES examples."""
  rng = np.random.default_rng(3)
  keras.mixed_precision.set_global_policy("mixed_float16")
  try:
    x = keras.Input((4, 4, 3))
    h = keras.layers.Conv2D(8, 3, name="conv")(x)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    out = keras.layers.Dense(2, name="head")(h)
    model = keras.Model(x, keras.layers.Activation("softmax", dtype="float32")(out))
  finally:
    keras.mixed_precision.set_global_policy("float32")
  before = [v.numpy().copy() for v in model.non_trainable_variables]
  images = rng.uniform(0, 5, (80, 4, 4, 3)).astype("float32")
  sample = numerics.sample(model, [(images, np.zeros(80))], _sparse, 3, 1024.0)
  assert sample.examples == numerics.MAX_EXAMPLES == 64  # A large batch's first 64.
  assert sample.layers[0].output.count == 64 * 2 * 2 * 8
  assert [l.dtype_policy.name for l in model.layers[1:4]] == ["mixed_float16"] * 3
  assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.non_trainable_variables))
  rows = {r.name: r for r in sample.layers}
  assert rows["conv"].dtype == "float16" and not rows["conv"].pinned
  assert rows["bn"].reduction and rows["conv"].reduction  # bn reads conv's output.
  assert rows["head"].reduction  # The softmax reads it.


def test_keras_gives_layers_made_without_dtype_the_models_policy_object():
  """What `pinned` rests on (Keras 3.15): under a global policy set, a layer made
  without dtype= and the model hold the one policy object, a layer made with it a
  policy of its own. Fails when Keras changes it: a float32 run would then read its
  float32 softmax as a layer mixed_bfloat16 would compute in bfloat16."""
  keras.mixed_precision.set_global_policy("float32")
  x = keras.Input((3,))
  common, own = keras.layers.Dense(2), keras.layers.Dense(2, dtype="float32")
  model = keras.Model(x, own(common(x)))
  assert common.dtype_policy is model.dtype_policy
  assert own.dtype_policy is not model.dtype_policy
  with numerics.in_float32(model) as had:
    assert had[id(common)] == ("float32", False) and had[id(own)] == ("float32", True)


def test_the_histogram_answers_any_power_of_two_scale_exactly():
  """The record keeps binary exponents: shares at any power-of-two scale equal a
  direct count, and the scale range keeps_scales gives holds its ends."""
  rng = np.random.default_rng(4)
  g = np.concatenate([rng.uniform(-1, 1, 500) * 10.0 ** rng.integers(-12, 0, 500),
                      np.zeros(20)]).astype("float32")
  v = numerics.values(g)
  nonzero = np.abs(g[g != 0]).astype(np.float64)
  for k in (0, 4, 15, 24):
    assert v.share_below(F16_MIN_SUBNORMAL, 2.0**k) == pytest.approx(
        np.mean(nonzero * 2.0**k < F16_MIN_SUBNORMAL))
  assert v.zeros == 20 and v.count == 520
  low, high = records.keep_scales(v)
  assert np.mean(nonzero * low < F16_MIN_SUBNORMAL) <= 0.001
  assert np.mean(nonzero * low / 2 < F16_MIN_SUBNORMAL) > 0.001
  assert nonzero.max() * high < F16_MAX <= nonzero.max() * high * 2
  assert UNDERFLOW_SHARE < 0.5  # The finding fires well before half are lost.


def _ops():
  from mpt.train.common import keras_fit
  return keras_fit.eager_ops


def test_attention_scores_inside_the_layer_are_its_range_as_numpy_computes_them():
  """MultiHeadAttention whose query and key projections are 4000 times their initial
  weights: its scores (q.k, numpy's own, from the layer's weights) pass 65504 while
  every layer's output stays in range. (Keras 3.15 multiplies q.k by 1/sqrt(64)
  after the product, so the product itself is what float16 must hold: 8x the scaled
  scores.) The sample holds the scores'
  largest value inside the attention row, from the op that made it; the forward-
  looking finding (a bfloat16 run) names the layer and says it is inside."""
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    keras.utils.set_random_seed(0)
    x = keras.Input((8,), dtype="int32")
    h = keras.layers.Embedding(30, 64, name="embedding")(x)
    attention = keras.layers.MultiHeadAttention(2, 64, name="attention")
    h = keras.layers.GlobalAveragePooling1D()(attention(h, h))
    model = keras.Model(x, keras.layers.Dense(2, activation="softmax",
                                              dtype="float32")(h))
    for dense in (attention._query_dense, attention._key_dense):
      dense.kernel.assign(dense.kernel * 4000.0)
    ids = np.random.default_rng(0).integers(0, 30, (4, 8)).astype("int32")
    labels = np.zeros(4, "int32")
    sample = numerics.sample(model, [(ids, labels)], _sparse, 1, None, ops=_ops())
  finally:
    keras.mixed_precision.set_global_policy("float32")
  embedded = model.get_layer("embedding").get_weights()[0][ids]
  wq, bq = [w.numpy() for w in attention._query_dense.weights]
  wk, bk = [w.numpy() for w in attention._key_dense.weights]
  q = np.einsum("btd,dhk->bthk", embedded, wq) + bq
  k = np.einsum("btd,dhk->bthk", embedded, wk) + bk
  scores = np.abs(np.einsum("bthk,bshk->bhts", q, k)).max()
  assert scores > F16_MAX
  rows = {l.name: l for l in sample.layers}
  assert max(l.output.max for l in sample.layers) < F16_MAX
  assert rows["attention"].inside.max == pytest.approx(scores, rel=1e-3)
  assert rows["attention"].inside_op == "Einsum"
  finding = _findings(Numerics("mixed_bfloat16", samples=[sample]),
                      "mixed_bfloat16")["f16_overflow"]
  assert finding and "attention's values inside would overflow" in finding.title
  assert "Einsum's values up to" in finding.evidence[0]
  # Scaled by 1/sqrt(64) first, the scores (numpy's) would be in range: the order of
  # the layer's ops is the issue, and the advice says so.
  assert scores / 8.0 < F16_MAX and "the order of the ops is the issue" in \
      finding.evidence[0] and "scale before its product" in finding.next_step


def test_a_normalisations_float32_statistics_are_not_float16s_to_hold(monkeypatch):
  """Values up to 500 into LayerNormalization: their variance (numpy's) passes
  65504, but Keras computes a normalisation's statistics in float32 under any
  policy, so float16 never holds it: no overflow. Read without the one-example
  float16 pass that tells which ops compute in float16, it would be."""
  keras.utils.set_random_seed(0)
  x = keras.Input((16,))
  h = keras.layers.Rescaling(500.0, name="scale_up")(x)
  h = keras.layers.LayerNormalization(name="norm")(h)
  model = keras.Model(x, keras.layers.Dense(2, activation="softmax")(h))
  data = np.random.default_rng(2).uniform(-1, 1, (8, 16)).astype("float32")
  assert (data * 500.0).var(axis=-1).max() > F16_MAX  # The oracle.
  batches = [(data, np.zeros(8, "int32"))]
  found = Numerics("float32", samples=[numerics.sample(model, batches, _sparse, 1, None,
                                                       ops=_ops())])
  assert not {r.name: r for r in records.worst(found)}["norm"].overflows()
  assert _findings(found, "float32")["f16_overflow"] is None
  # Every op of the layer counted (no float16 pass): its statistics would overflow.
  monkeypatch.setattr(numerics, "_float16_ops", lambda *args: None)
  found = Numerics("float32", samples=[numerics.sample(model, batches, _sparse, 1, None,
                                                       ops=_ops())])
  assert {r.name: r for r in records.worst(found)}["norm"].overflows()
