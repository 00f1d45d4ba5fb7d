"""The numerics of whole runs: the issue's convnet whose layer leaves float16's range
(the run diverges and the diagnosis names the layer, not only "find the layer"), no
numerics finding on the registered variants under each policy, numerics.json against
a direct float32 computation, and the final metrics beside float32's seeds.
"""

import dataclasses
import json
import pathlib
import re
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import helpers
from mpt import models
from mpt.diagnose import detectors
from mpt.diagnose.evidence import Evidence
from mpt.measure import numerics
from mpt.records import numerics as records
from mpt.records import spread
from mpt.records.summary import RunSummary
from mpt.train.cli import data as data_lib
from mpt.train.common import overflow
from mpt.train.common import precision
from mpt.train.common import steps as steps_lib
from mpt.train.common.model import build_model

NUMERICS = ("f16_overflow", "gradient_underflow", "loss_scale_room", "bf16_error")


def overflowing_convnet(input_shape, num_classes):
  """A small convnet whose `boost` layer multiplies its input by 10^5: its outputs
  pass 65504 on any image that is not black."""
  x = keras.Input(input_shape)
  h = keras.layers.Conv2D(8, 3, activation="relu", name="conv")(x)
  h = keras.layers.Rescaling(1e5, name="boost")(h)
  h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
  h = keras.layers.Rescaling(1e-5, name="back")(h)
  out = keras.layers.Dense(num_classes, name="logits")(h)
  return keras.Model(x, keras.layers.Activation("softmax", dtype="float32")(out))


def test_the_issues_convnet_diverges_and_the_diagnosis_names_the_layer(tiny):
  """The run the issue tried: mixed_float16 diverged at step 1; the diagnosis now says
  which layer overflows float16 and how to keep it in float32."""
  sys.modules.setdefault("wrong_nets", sys.modules[__name__])
  cfg = tiny(model="wrong_nets:overflowing_convnet", policy="mixed_float16", epochs=1,
             warmup_steps=1, checkpoint=False)
  summary = helpers.train_run(cfg)
  assert summary["status"] == "diverged"
  run_dir = next(pathlib.Path(cfg.logdir).glob("*/summary.json")).parent
  found = records.read(run_dir)
  # Sampled at the end of the run, a diverged one included (docs/usage.md).
  assert found.samples and found.samples[-1].step == summary["steps"], [
      s.step for s in found.samples]
  rows = {r.name: r for r in records.worst(found)}
  assert rows["boost"].overflow > 0 and rows["conv"].overflow == 0
  diagnosis = json.loads((run_dir / "diagnosis.json").read_text())
  by_id = {f["id"]: f for f in diagnosis["findings"]}
  assert by_id["f16_overflow"]["severity"] == "high"
  assert by_id["f16_overflow"]["title"].startswith("boost's activations overflow")
  advice = by_id["f16_overflow"]["next_step"]
  assert "safe under bfloat16" in advice
  assert "## Numerics per layer" in (run_dir / "diagnosis.md").read_text()
  # The advice works: kept in float32, boost's output still meets float16 in the layer
  # that reads it (a cast on entry), so that layer is kept too, and the run trains.
  pinned = re.search(r"--layer_policy='([^']+)=float32'", advice).group(1).split("|")
  assert pinned[0] == "boost" and "gap" in pinned and "conv" not in pinned
  again = dataclasses.replace(cfg, layer_policy=f"{'|'.join(pinned)}=float32",
                              logdir=f"{cfg.logdir}-kept")
  assert helpers.train_run(again)["status"] == "completed"
  # ... and its diagnosis no longer says boost overflows float16: it computes in
  # float32 now, as do the layers that read it.
  rerun = next(pathlib.Path(again.logdir).glob("*/diagnosis.json"))
  assert "f16_overflow" not in {f["id"] for f in json.loads(rerun.read_text())["findings"]}


def test_a_float32_layer_above_float16s_range_is_not_float16s_overflow(tiny):
  """Under mixed_float16, a layer given dtype="float32" computes in float32: its
  outputs above 65504 (and those of the float32 layer reading them) overflow
  nothing; the float16 layers around them stay in range. No f16_overflow."""
  cfg = tiny(policy="mixed_float16")
  data = data_lib.load(cfg)
  precision.set_policy("mixed_float16")
  x = keras.Input((16, 16, 3))
  h = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(x)
  h = keras.layers.Rescaling(1e6, name="big", dtype="float32")(h)
  h = keras.layers.Rescaling(1e-6, name="small", dtype="float32")(h)
  h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
  model = keras.Model(x, keras.layers.Dense(10, activation="softmax", dtype="float32")(h))
  loss = steps_lib.make_loss()
  sample = numerics.sample(model, list(data.train_from(0).take(1)),
                           lambda x, y, p: loss(y, p), 0, 2.0**15)
  precision.set_policy("float32")
  rows = {r.name: r for r in sample.layers}
  assert rows["big"].output.max > np.finfo(np.float16).max  # As built: above range.
  assert (rows["big"].dtype, rows["conv"].dtype) == ("float32", "float16")
  ev = Evidence(RunSummary(policy="mixed_float16", status="completed"), None,
                numerics=records.Numerics("mixed_float16", samples=[sample]))
  assert detectors.DETECTORS["f16_overflow"](ev) is None


# The larger variants at smaller widths and depths: the same layers, in seconds.
SMALLER = {"resnet": "depth=10,width=16", "mobilenet": "alpha=0.35",
           "vit": "dim=48,depth=2,heads=3,mlp=96"}


@pytest.mark.parametrize("name", models.names())
def test_the_registered_variants_raise_no_numerics_finding(tiny, name):
  """Each variant as built, on a real batch, under each policy: no numerics finding."""
  cfg = tiny(model=name, model_opts=SMALLER.get(name, ""))
  data = data_lib.load(cfg)
  batches = list(data.train_from(0).take(1))
  loss = steps_lib.make_loss()
  for policy in ("float32", "mixed_bfloat16", "mixed_float16"):
    keras.utils.set_random_seed(0)
    precision.set_policy(policy)
    model = build_model(dataclasses.replace(cfg, policy=policy), len(data.class_names))
    sample = numerics.sample(model, batches, lambda x, y, p: loss(y, p), 0, 2.0**15)
    # Quiet because every layer was looked at and is in range, not because none was:
    # a row per layer with weights (the ones that compute), each output seen finite.
    rows = {r.name: r for r in sample.layers}
    weighted = {l.name for l in _all_layers(model) if l.weights}
    assert weighted and weighted <= set(rows), (name, policy, weighted - set(rows))
    assert all(rows[n].output.count for n in weighted), (name, policy)
    ev = Evidence(RunSummary(policy=policy, status="completed"), None,
                  numerics=records.Numerics(policy, samples=[sample]))
    fired = {n: f.title for n in NUMERICS if (f := detectors.DETECTORS[n](ev))}
    assert not fired, (name, policy, fired)
  precision.set_policy("float32")


def _all_layers(model):
  """Every layer of `model`, nested ones included (Keras' own walk)."""
  return [l for l in model._flatten_layers() if l is not model]


def _direct(values: np.ndarray) -> dict:
  """numpy's count of what numerics.json records of a tensor."""
  a = np.abs(values.astype(np.float64)).ravel()
  nonzero = a[a > 0]
  exponents = np.floor(np.log2(nonzero)).astype(int)
  bins, counts = np.unique(exponents, return_counts=True)
  return {"max": a.max(), "zeros": int(np.sum(a == 0)), "count": a.size,
          "hist": dict(zip(bins.tolist(), counts.tolist()))}


def _close(recorded: records.Values, direct: list[dict]) -> None:
  """The record of several batches against numpy's count of each."""
  assert recorded.count == sum(d["count"] for d in direct)
  assert recorded.max == pytest.approx(max(d["max"] for d in direct), rel=1e-4)
  assert abs(recorded.zeros - sum(d["zeros"] for d in direct)) <= recorded.count * 1e-3
  hist: dict[int, int] = {}
  for d in direct:
    for e, n in d["hist"].items():
      hist[e] = hist.get(e, 0) + n
  moved = sum(abs(recorded.hist.get(str(e), 0) - n) for e, n in hist.items())
  assert moved <= recorded.count * 2e-3  # Elements at a bin edge, float32 rounding.


def test_numerics_json_agrees_with_a_direct_float32_computation(tiny):
  """The seed convnet trained under mixed_bfloat16 with --numerics=on: its
  numerics.json's end sample against a float32 copy of the model holding the run's
  final checkpoint, called directly (no layer watched, no policy switched) on the
  same batches, with the gradient tape on its layers' outputs."""
  cfg = tiny(policy="mixed_bfloat16", numerics="on", epochs=1)
  helpers.train_run(cfg)
  run_dir = next(pathlib.Path(cfg.logdir).glob("*/summary.json")).parent
  found = records.read(run_dir)
  assert [s.step for s in found.samples] == [cfg.warmup_steps + 1, 8]
  end = {r.name: r for r in found.samples[-1].layers}
  assert {r.dtype for r in end.values()} == {"bfloat16", "float32"}

  precision.set_policy("float32")
  data = data_lib.load(cfg)
  copy = build_model(dataclasses.replace(cfg, policy="float32"), len(data.class_names))
  tf.train.Checkpoint(model=copy).restore(
      tf.train.latest_checkpoint(run_dir / "checkpoints")).expect_partial()
  names = ["conv1", "bn1", "conv3", "logits"]
  probe = keras.Model(copy.inputs, [copy.get_layer(n).output for n in names] +
                      [copy.output])
  loss = steps_lib.make_loss()
  direct = {n: ([], []) for n in names}
  for x, y in data.train_from(8).take(2):
    with tf.GradientTape() as tape:
      *outs, prediction = probe(x, training=True)
      value = loss(y, prediction)
    for n, out, grad in zip(names, outs, tape.gradient(value, outs)):
      direct[n][0].append(_direct(out.numpy()))
      direct[n][1].append(_direct(grad.numpy()))
  for n in names:
    _close(end[n].output, direct[n][0])
    _close(end[n].grad, direct[n][1])


def _values(exponents: dict[int, int], top: float) -> records.Values:
  """Gradients with `n` elements in each bin [2^e, 2^(e+1)), the largest `top`."""
  n = sum(exponents.values())
  return records.Values(count=n, max=top, hist={str(e): c for e, c in exponents.items()})


def _sampled(step: int, scale: float, grad: records.Values) -> records.Sample:
  row = records.LayerNumerics("dense", "Dense", "float16",
                              records.Values(count=4, max=1.0, hist={"-1": 4}), grad)
  return records.Sample(step, 32, scale, 1.0, [row])


@pytest.mark.parametrize("scales,final,fires", [
    ((32768.0, 32768.0), 32768.0, False),  # Where it started: room up to 2^17 only.
    ((32768.0, 1024.0), 1024.0, True),     # Fell 32x after warm-up.
    ((32768.0, 4096.0), 4096.0, False),    # Fell 8x: settling, not falling.
])
def test_a_dynamic_scale_that_kept_falling_is_loss_scale_room(scales, final, fires):
  grad = _values({-2: 90, -40: 10}, 0.45)  # The largest allows 2^17; a tail at 2^-40.
  found = records.Numerics("mixed_float16", "dynamic", [
      _sampled(6, scales[0], grad), _sampled(200, scales[1], grad)])
  ev = Evidence(RunSummary(policy="mixed_float16", status="completed",
                           loss_scale=final), None, numerics=found)
  finding = detectors.DETECTORS["loss_scale_room"](ev)
  assert (finding is not None) == fires
  if fires:
    assert finding.title == "the loss scale kept falling"
    assert "the gradients allow up to 131072" in finding.evidence[1]


def test_a_scale_far_below_what_the_gradients_allow_while_some_underflow():
  """Gradients whose largest is 2^-10 allow a scale of 2^25; at 2^15 a tail of them
  (2^-45) still flushes to zero: far below, though it never fell."""
  grad = _values({-11: 95, -45: 5}, 2.0**-10)
  found = records.Numerics("mixed_float16", "dynamic", [
      _sampled(6, 32768.0, grad), _sampled(200, 32768.0, grad)])
  ev = Evidence(RunSummary(policy="mixed_float16", status="completed",
                           loss_scale=32768.0), None, numerics=found)
  finding = detectors.DETECTORS["loss_scale_room"](ev)
  assert finding.title == "the loss scale sits far below what the gradients allow"
  # A fixed scale is gradient_underflow's to judge, not this one's.
  fixed = dataclasses.replace(found, loss_scale="32768")
  assert detectors.DETECTORS["loss_scale_room"](dataclasses.replace(
      ev, numerics=fixed)) is None


def test_a_skips_cause_supersedes_loss_scale_trouble_and_the_falling_scale():
  """docs/diagnosis.md: the skipped steps' cause supersedes loss-scale trouble and the
  loss scale falling. The same run without its replayed forward overflow raises
  both (so their absence is the precedence, not a quiet run); with it, neither runs
  and both count as checked and clear."""
  grad = _values({-2: 90, -40: 10}, 0.45)  # As above: a scale that fell 32x.
  cause = records.Overflow(step=3, loss_scale=2048.0, op="Einsum", layer="attention",
                           output="float16 [8, 2, 8, 8]", kind="+Inf")
  found = records.Numerics("mixed_float16", "dynamic", [
      _sampled(6, 32768.0, grad), _sampled(200, 1024.0, grad)], overflows=[cause])
  run = RunSummary(policy="mixed_float16", status="completed", steps=200,
                   skipped_steps=40, loss_scale=1024.0)
  without, _ = detectors.run(Evidence(
      run, None, numerics=dataclasses.replace(found, overflows=[])))
  assert {"loss_scale", "loss_scale_room"} <= {f.id for f in without}
  assert "skip_cause" not in {f.id for f in without}
  findings, clear = detectors.run(Evidence(run, None, numerics=found))
  ids = [f.id for f in findings]
  assert "skip_cause" in ids
  assert not {"loss_scale", "loss_scale_room"} & set(ids), ids
  assert {"loss_scale", "loss_scale_room"} <= set(clear)


def test_final_metrics_outside_float32s_seeds_are_a_finding_of_the_run():
  base = [RunSummary(policy="float32", seed=s, status="completed", val_accuracy=a,
                     train_loss=1.0) for s, a in enumerate((0.40, 0.42, 0.44))]
  run = RunSummary(policy="mixed_float16", seed=0, status="completed",
                   val_accuracy=0.30, train_loss=1.0)
  finding = detectors.DETECTORS["metrics_spread"](Evidence(run, None, float32_runs=base))
  assert finding.severity == "high" and "val_accuracy" in finding.title
  assert "val_accuracy 0.3 outside float32's 0.4..0.44 (3 seeds)" in finding.evidence
  within = dataclasses.replace(run, val_accuracy=0.45)
  assert detectors.DETECTORS["metrics_spread"](Evidence(within, None,
                                                        float32_runs=base)) is None
  # One float32 seed, however often repeated, has no spread: nothing is judged.
  same = [dataclasses.replace(b, seed=0) for b in base]
  assert detectors.DETECTORS["metrics_spread"](Evidence(run, None,
                                                        float32_runs=same)) is None


def _attention_classifier(policy: str, attention_dtype=None,
                          scale: float = 8000.0) -> keras.Model:
  """A one-block Transformer classifier in the shape of issue 56's: token embeddings
  (pretrained, frozen), self-attention with key_dim 64 whose query and key
  projections are `scale` times their initial weights (large q and k: their dot
  products, the scores, overflow float16 while q and k themselves stay in range), a
  softmax head."""
  keras.mixed_precision.set_global_policy(policy)
  keras.utils.set_random_seed(0)
  x = keras.Input((8,), dtype="int32")
  h = keras.layers.Embedding(30, 64, name="embedding", trainable=False)(x)
  attention = keras.layers.MultiHeadAttention(2, 64, name="attention",
                                              dtype=attention_dtype)
  h = attention(h, h)
  h = keras.layers.GlobalAveragePooling1D()(h)
  y = keras.layers.Dense(2, activation="softmax", dtype="float32")(h)
  model = keras.Model(x, y)
  for dense in (attention._query_dense, attention._key_dense):
    dense.kernel.assign(dense.kernel * scale)
  model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
  return model


def _fit_under_mpt(model, run_dir) -> dict:
  import mpt
  ids = np.random.default_rng(0).integers(0, 30, (48, 8)).astype("int32")
  model.fit(ids, (ids[:, 0] % 2).astype("int32"), batch_size=8, epochs=1, verbose=0,
            callbacks=mpt.callbacks(str(run_dir), batch_size=8, warmup_steps=2))
  return json.loads((run_dir / "diagnosis.json").read_text())


def _scores_max(model, ids) -> float:
  """The attention scores' largest magnitude, by numpy in float32 from the model's
  own weights: q and k projections, scaled by 1/sqrt(key_dim), q.k per head."""
  embedded = model.get_layer("embedding").get_weights()[0][ids]
  attention = model.get_layer("attention")
  wq, bq = [w.numpy().astype(np.float32) for w in attention._query_dense.weights]
  wk, bk = [w.numpy().astype(np.float32) for w in attention._key_dense.weights]
  q = np.einsum("btd,dhk->bthk", embedded, wq) + bq
  k = np.einsum("btd,dhk->bthk", embedded, wk) + bk
  return float(np.abs(np.einsum("bthk,bshk->bhts", q / 8.0, k)).max())


def test_attention_scores_overflowing_inside_the_layer_are_the_skips_cause(tmp_path,
                                                                          capsys):
  """Every layer's output in float16's range, the attention scores far beyond it
  (numpy's own computation): each skipped step is replayed, the first non-finite op
  is the attention layer's own, and the first finding says so; followed (the layer
  in float32), the run skips no step; under bfloat16 and float32 no alarm."""
  model = _attention_classifier("mixed_float16")
  ids = np.random.default_rng(0).integers(0, 30, (8, 8)).astype("int32")
  assert _scores_max(model, ids) > np.finfo(np.float16).max  # The oracle.
  before = [w.numpy().copy() for w in model.weights]
  report = _fit_under_mpt(model, tmp_path / "f16")
  printed = capsys.readouterr().out
  found = records.read(tmp_path / "f16")
  assert found.overflows and found.overflows[0].layer == "attention"
  assert not found.overflows[0].backward and found.overflows[0].op
  # Found in the forward pass run eagerly (no trace): the scores' own output named.
  assert found.overflows[0].output.startswith("float16 [8, 2, 8, 8]")
  sampled = [l.output.max for s in found.samples for l in s.layers if l.output.max]
  assert sampled and max(sampled) < np.finfo(np.float16).max  # Outputs in range.
  first = report["findings"][0]
  assert first["id"] == "skip_cause" and "inside attention" in first["title"]
  # The sample's range inside the layer is this finding's evidence, not a second one.
  assert any(e.startswith("the numerics sample: attention") and "Einsum's values" in e
             for e in first["evidence"]), first["evidence"]
  assert "f16_overflow" not in [f["id"] for f in report["findings"]]
  # The scores scaled (numpy's, above) still pass 65504: the order is not the issue.
  assert "the order of the ops" not in " ".join(first["evidence"])
  assert 'dtype="float32"' in first["next_step"]
  # Loss-scale trouble and the falling scale: superseded by the cause (diagnosis.md).
  assert not {"loss_scale", "loss_scale_room"} & {f["id"] for f in report["findings"]}
  assert {"loss_scale", "loss_scale_room"} <= set(report["checked_clear"])
  # The underflow that follows the collapsed scale: said once, as its consequence (low).
  [underflow] = [f for f in report["findings"] if f["id"] == "gradient_underflow"]
  assert "a consequence of Einsum" in underflow["title"], underflow["title"]
  assert underflow["severity"] == "low"
  # The replays moved nothing: every step was skipped, so the weights are the ones
  # the run started with (a replay that trained would have moved them).
  ran = json.loads((tmp_path / "f16" / "summary.json").read_text())
  assert ran["skipped_steps"] == ran["steps"]
  # Each replayed skip's op and layer in summary.json too, as numerics.json has them.
  assert [(c["step"], c["op"], c["layer"]) for c in ran["skip_causes"]] == \
      [(o.step, o.op, o.layer) for o in found.overflows]
  assert all(np.array_equal(a, w.numpy()) for a, w in zip(before, model.weights))
  assert len(found.overflows) == overflow.MAX_REPLAYS
  # Each replayed skip's cause, in the run's TensorBoard text too.
  [(_, text)] = helpers.read_events(tmp_path / "f16")["numerics/skipped"][-1:]
  assert text.count("Einsum in attention went") == overflow.MAX_REPLAYS
  # The skips past the replays' bound: counted in numerics.json, said once as the
  # run goes, and in the TensorBoard text and the finding's evidence.
  later = ran["skipped_steps"] - overflow.MAX_REPLAYS
  assert later == 3 and found.skipped_not_replayed == later
  assert printed.count("skipped steps were replayed already, the rest are counted "
                       "only") == 1, printed
  assert (f"mpt: step {overflow.MAX_REPLAYS + 1} skipped; {overflow.MAX_REPLAYS} "
          "skipped steps were replayed already") in printed, printed
  assert text.endswith(f"- {later} later skipped steps not replayed"), text
  assert f"{later} later skipped steps were not replayed (a bounded number are)" in \
      first["evidence"], first["evidence"]

  skipped = json.loads((tmp_path / "f16" / "summary.json").read_text())["skipped_steps"]
  followed = _fit_under_mpt(_attention_classifier("mixed_float16", "float32"),
                            tmp_path / "followed")
  summary = json.loads((tmp_path / "followed" / "summary.json").read_text())
  # No step skipped: the attention's own backward pass is float32 too.
  assert skipped > 0 and (summary["status"], summary["skipped_steps"]) == ("completed", 0)
  assert records.read(tmp_path / "followed").overflows == []
  assert "skip_cause" not in [f["id"] for f in followed["findings"]]
  for policy in ("mixed_bfloat16", "float32"):
    other = _fit_under_mpt(_attention_classifier(policy), tmp_path / policy)
    assert not [f for f in other["findings"] if f["id"] in ("skip_cause", "f16_overflow")
                and f["severity"] == "high"], policy


def test_a_run_that_skips_nothing_replays_nothing(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(overflow, "replay", lambda *a, **k: calls.append(a))
  _fit_under_mpt(_attention_classifier("mixed_float16", scale=1.0), tmp_path / "r")
  assert calls == [] and records.read(tmp_path / "r").overflows == []


class Energy(keras.layers.Layer):
  """A custom layer whose own product (x * x) leaves float16's range while what it
  returns (the root of the mean square) stays in it."""

  def call(self, x):
    return keras.ops.sqrt(keras.ops.mean(x * x, axis=-1, keepdims=True) + 1e-3)


def _energy_model(policy: str, energy_dtype=None) -> keras.Model:
  keras.mixed_precision.set_global_policy(policy)
  keras.utils.set_random_seed(0)
  x = keras.Input((16,))
  wide = keras.layers.Dense(16, name="wide")
  y = keras.layers.Dense(2, activation="softmax", dtype="float32")(
      Energy(name="energy", dtype=energy_dtype)(wide(x)))
  model = keras.Model(x, y)
  wide.kernel.assign(wide.kernel * 1000.0)
  model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
  return model


def _fit_energy(model, run_dir) -> dict:
  import mpt
  data = np.random.default_rng(1).uniform(size=(32, 16)).astype("float32")
  model.fit(data, np.zeros(32, "int32"), batch_size=8, epochs=1, verbose=0,
            callbacks=mpt.callbacks(str(run_dir), batch_size=8, warmup_steps=1))
  return json.loads((run_dir / "diagnosis.json").read_text())


def test_a_custom_layers_own_product_overflowing_is_named(tmp_path):
  """Named, with its remedy; followed (the layer in float32), no step skipped; under
  bfloat16 and float32, no alarm."""
  model = _energy_model("mixed_float16")
  wide = model.get_layer("wide")
  data = np.random.default_rng(1).uniform(size=(32, 16)).astype("float32")
  # The oracle, in numpy: the layer's input squared passes float16's largest value,
  # its output (the root mean square) does not.
  inner = data @ wide.kernel.numpy().astype("float32") + wide.bias.numpy()
  assert (inner ** 2).max() > np.finfo(np.float16).max
  assert np.sqrt((inner ** 2).mean(axis=-1)).max() < np.finfo(np.float16).max
  report = _fit_energy(model, tmp_path / "r")
  found = records.read(tmp_path / "r")
  assert found.overflows and found.overflows[0].layer == "energy", found.overflows
  assert not found.overflows[0].backward
  assert report["findings"][0]["id"] == "skip_cause"
  assert "inside energy" in report["findings"][0]["title"]
  assert 'dtype="float32"' in report["findings"][0]["next_step"]
  _fit_energy(_energy_model("mixed_float16", "float32"), tmp_path / "followed")
  summary = json.loads((tmp_path / "followed" / "summary.json").read_text())
  assert (summary["status"], summary["skipped_steps"]) == ("completed", 0)
  for policy in ("mixed_bfloat16", "float32"):
    other = _fit_energy(_energy_model(policy), tmp_path / policy)
    assert not [f for f in other["findings"] if f["id"] in ("skip_cause", "f16_overflow")
                and f["severity"] == "high"], policy


def test_an_overflow_only_in_the_backward_pass_is_named_there_and_raises_no_alarm(
    tmp_path):
  """Token embeddings scaled up 1000-fold: every forward value in float16's range, but
  the gradient flowing back through the scaling, times the starting loss scale,
  passes 65504 (a float32 copy's own gradient says so). The replay names the op in
  the gradient of that layer; dynamic scaling finding its scale is no finding."""
  import mpt
  keras.mixed_precision.set_global_policy("mixed_float16")
  keras.utils.set_random_seed(0)
  x = keras.Input((8,), dtype="int32")
  h = keras.layers.Embedding(30, 64, name="embedding")(x)
  h = keras.layers.Rescaling(1000.0, name="scale_up")(h)
  h = keras.layers.GlobalAveragePooling1D()(h)
  y = keras.layers.Dense(2, activation="softmax", dtype="float32")(h)
  model = keras.Model(x, y)
  model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
  ids = np.random.default_rng(0).integers(0, 30, (48, 8)).astype("int32")
  labels = (ids[:, 0] % 2).astype("int32")
  # The oracle, by numpy in float32 from the model's weights as built: the gradient
  # of the mean loss over the first batch at the scaling's input (1000/8 x the
  # classifier's kernel times softmax - one-hot, over the batch), times 2^15: the
  # scale step 1 runs at, its skip replayed.
  table = model.get_layer("embedding").get_weights()[0]
  kernel, bias = [w.astype(np.float32) for w in model.layers[-1].get_weights()]
  pooled = (table[ids[:8]] * 1000.0).mean(axis=1)
  logits = pooled @ kernel + bias
  p = np.exp(logits - logits.max(axis=1, keepdims=True))
  p /= p.sum(axis=1, keepdims=True)
  upstream = (p - np.eye(2)[labels[:8]]) @ kernel.T / 8  # d(mean loss)/d(pooled)
  grad = upstream * 1000.0 / 8 * 2.0 ** 15  # Through the scaling and the mean over 8.
  assert np.abs(grad).max() > np.finfo(np.float16).max
  keras.mixed_precision.set_global_policy("mixed_float16")
  model.fit(ids, labels, batch_size=8, epochs=1, verbose=0,
            callbacks=mpt.callbacks(str(tmp_path / "r"), batch_size=8, warmup_steps=1))
  found = records.read(tmp_path / "r").overflows
  assert found and found[0].step == 1 and found[0].loss_scale == 2.0 ** 15, found
  assert found[0].backward and found[0].layer == "scale_up", found
  report = json.loads((tmp_path / "r" / "diagnosis.json").read_text())
  assert "skip_cause" not in [f["id"] for f in report["findings"]]
