"""A script's own step timed per policy (mpt/train/before_step1/scriptcost.py): the model, its
optimizer, its policies and its random state are left exactly as they were, read
back before and after by Keras' own accessors; the run's record and verdict rest on
it, and a second run of the same script reads it from the cache."""

import json
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import script_forked
from mpt.records import summary as summary_lib
from mpt.train.before_step1 import scriptcost


def _net(policy: str) -> keras.Model:
  keras.mixed_precision.set_global_policy(policy)
  inputs = keras.Input((8, 8, 3))
  h = keras.layers.Conv2D(8, 3, padding="same")(inputs)
  h = keras.layers.BatchNormalization()(h)
  h = keras.layers.Dropout(0.5)(h)
  h = keras.layers.GlobalAveragePooling2D()(h)
  out = keras.layers.Activation("softmax", dtype="float32")(keras.layers.Dense(4)(h))
  model = keras.Model(inputs, out)
  keras.mixed_precision.set_global_policy("float32")
  return model


def _state(model: keras.Model) -> dict:
  """Everything a step could move, as numpy arrays, and each layer's policy object."""
  opt = model.optimizer
  return {
      "variables": [np.array(v) for v in model.variables],  # BN statistics, seeds too.
      "metrics": [np.array(v) for v in model.metrics_variables],
      "optimizer": [np.array(v) for v in opt.variables],
      "scale": float(opt.dynamic_scale.numpy()),
      "policies": [id(l.dtype_policy) for l in model._flatten_layers()],  # pylint: disable=protected-access
  }


def test_the_measurement_leaves_the_model_as_it_was():
  """Under mixed_float16 (compile wraps a LossScaleOptimizer), after two steps: the
  step timed under each policy, then every variable, the optimizer's slots and
  scale, the metrics and each layer's policy object compared with before."""
  model = _net("mixed_float16")
  keras.mixed_precision.set_global_policy("mixed_float16")
  model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
  rng = np.random.default_rng(0)
  x, y = rng.random((16, 8, 8, 3), dtype=np.float32), rng.integers(0, 4, 16)
  model.fit(x, y, batch_size=8, epochs=1, verbose=0)
  assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
  before = _state(model)
  found = scriptcost.measure(model, (tf.constant(x[:8]), tf.constant(y[:8]), None),
                             scriptcost.loss_of(model, fit=True), model.optimizer,
                             "mixed_float16")
  keras.mixed_precision.set_global_policy("float32")
  after = _state(model)
  assert [r.policy for r in found.policies] == ["float32", "mixed_bfloat16",
                                                "mixed_float16"]
  assert all(r.ms_per_step and r.first_ms for r in found.policies)
  assert found.timed.startswith("this script's model on its first batch")
  assert scriptcost.COMPILED in found.timed
  assert before["policies"] == after["policies"]
  assert before["scale"] == after["scale"]
  for part in ("variables", "metrics", "optimizer"):
    assert len(before[part]) == len(after[part])
    for a, b in zip(before[part], after[part]):
      np.testing.assert_array_equal(a, b)


def test_each_candidate_computes_in_its_policy_and_its_loss_is_the_compiled_one():
  """The traced graphs run the compiled loss in each policy's compute dtype: a
  stand-in loss would be said, and the float32 softmax stays float32 (its own)."""
  model = _net("float32")
  model.compile("sgd", "sparse_categorical_crossentropy")
  seen = []
  original = keras.layers.Dense.call

  def watched(layer, *args, **kwargs):
    out = original(layer, *args, **kwargs)
    seen.append(out.dtype)
    return out

  keras.layers.Dense.call = watched
  try:
    x = tf.zeros((4, 8, 8, 3))
    scriptcost.measure(model, (x, tf.zeros((4,), "int64"), None),
                       scriptcost.loss_of(model, fit=True), model.optimizer, "float32",
                       table=lambda families: None)  # Every policy run, none predicted.
  finally:
    keras.layers.Dense.call = original
  assert {d.name for d in seen} == {"float32", "bfloat16", "float16"}  # One per trace.
  assert scriptcost.loss_of(model, fit=False)[1] == scriptcost.STAND_IN


SCRIPT = '''
import keras, numpy as np, mpt
rng = np.random.default_rng(0)
x, y = rng.random((160, 8, 8, 3), dtype=np.float32), rng.integers(0, 4, 160)
inputs = keras.Input((8, 8, 3))
h = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(8, 3)(inputs))
model = keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(h))
model.compile("adam", "sparse_categorical_crossentropy")
model.fit(x, y, batch_size=8, epochs=EPOCHS, verbose=0,
          callbacks=mpt.callbacks(RUN_DIR, batch_size=8, sample_every=None))
'''


def _script(tmp_path, epochs: int) -> tuple[summary_lib.RunSummary, str]:
  run_dir = tmp_path / f"run{epochs}"
  script = tmp_path / f"s{epochs}.py"
  script.write_text(f"RUN_DIR = {str(run_dir)!r}\nEPOCHS = {epochs}\n"
                    + textwrap.dedent(SCRIPT))
  # Its start is not under test.
  proc = script_forked(script, cwd=tmp_path, timeout=300,
                       env={"MPT_COST": None, "MPT_CACHE": str(tmp_path / "cache")})
  assert proc.returncode == 0, proc.stderr[-3000:]
  return summary_lib.read(run_dir / "summary.json"), proc.stdout


def test_a_script_is_told_its_own_steps_cost_and_a_short_one_why_not(tmp_path):
  """20 steps: the step timed per policy after step 1, the verdict resting on it
  (evidence `cost`, not the probe); the same script for 40 steps reads the cache.
  (A run too short to pay for it: tests/train/script/test_library.py's 16-step fit.)"""
  summary, stdout = _script(tmp_path, 1)
  assert summary.cost is not None and summary.cost.source == "measured"
  assert {p.policy for p in summary.cost.policies if p.ms_per_step} == {
      "float32", "mixed_bfloat16", "mixed_float16"}
  assert summary.policy_verdict.evidence == "cost" and "cost" not in summary.not_measured
  assert "mpt: cost here" in stdout and "this script's model on its first batch" in stdout
  again, _ = _script(tmp_path, 2)
  assert again.cost.source.startswith("cache: ")
  summary = json.loads((tmp_path / "run2" / "summary.json").read_text())
  assert summary["policy_verdict"]["evidence"] == "cost"


PLAN_SCRIPT = '''
import keras, numpy as np, mpt
keras.mixed_precision.set_global_policy("mixed_bfloat16")
rng = np.random.default_rng(0)
x, y = rng.random((32, 8, 8, 3), dtype=np.float32), rng.integers(0, 4, 32)
inputs = keras.Input((8, 8, 3))
h = keras.layers.BatchNormalization(name="bn")(keras.layers.Conv2D(8, 3, name="conv")(inputs))
h = keras.layers.Dense(4, name="head")(keras.layers.GlobalAveragePooling2D(name="gap")(h))
model = keras.Model(inputs, keras.layers.Activation("softmax", dtype="float32")(h))
model.compile("adam", "sparse_categorical_crossentropy")
model.fit(x, y, batch_size=8, epochs=1, verbose=0,
          callbacks=mpt.callbacks(RUN_DIR, batch_size=8, sample_every=None))
'''


def test_a_slower_16_bit_script_gets_its_layers_plan_as_a_policy_map(tmp_path):
  """The step (a recorded stand-in) puts mixed_bfloat16 at 1.5x float32's time; the
  layers (a recorded stand-in) put BatchNormalization slower in bfloat16: the run
  keeps the per-layer cost, writes the plan as policy_map.json, and the diagnosis'
  slow-layer finding tells the script to apply that map, in Keras' words."""
  cost = {"key": {}, "onednn": True, "batch": 8, "schema": 1, "policies": [
      {"policy": "float32", "ms_per_step": 10.0},
      {"policy": "mixed_bfloat16", "ms_per_step": 15.0},
      {"policy": "mixed_float16", "ms_per_step": 30.0}]}
  layers = {"key": {}, "batch": 8, "schema": 1, "optimizer_ms": {}, "casts": {},
            "edges": [], "rows": [
      {"cls": "Conv2D", "names": ["conv"], "calls": 1, "input_shapes": [[8, 8, 3]],
       "ms": {"float32": 20.0, "mixed_bfloat16": 5.0, "mixed_float16": 50.0}},
      {"cls": "BatchNormalization", "names": ["bn"], "calls": 1,
       "input_shapes": [[6, 6, 8]],
       "ms": {"float32": 1.0, "mixed_bfloat16": 4.0, "mixed_float16": 4.0}}]}
  (tmp_path / "cost.json").write_text(json.dumps(cost))
  (tmp_path / "layers.json").write_text(json.dumps(layers))
  run_dir = tmp_path / "run"
  script = tmp_path / "plan.py"
  script.write_text(f"RUN_DIR = {str(run_dir)!r}\n" + textwrap.dedent(PLAN_SCRIPT))
  proc = script_forked(script, cwd=tmp_path, timeout=300,
                       env={"MPT_COST": str(tmp_path / "cost.json"),
                            "MPT_LAYERS": str(tmp_path / "layers.json")})
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = summary_lib.read(run_dir / "summary.json")
  assert summary.layer_costs is not None and summary.cost.source.startswith("recorded")
  plan = keras.saving.deserialize_keras_object(
      json.loads((run_dir / "policy_map.json").read_text())["policy_map"])
  assert plan.default_policy.name == "mixed_bfloat16"
  assert {path: p.name for path, p in plan.items()} == {"bn": "float32"}
  findings = json.loads((run_dir / "diagnosis.json").read_text())["findings"]
  slow = next(f for f in findings if f["id"] == "slow_layers")
  step = slow["next_step"]
  assert "policy_map.json" in step and "set_global_policy" in step
  assert "--layer_policy" not in step


def test_a_cost_option_other_than_auto_or_off_is_refused_before_training(tmp_path):
  import mpt  # pylint: disable=import-outside-toplevel
  from mpt.errors import UserError  # pylint: disable=import-outside-toplevel
  with pytest.raises(UserError, match=r"mpt.callbacks: cost='always': auto or off"):
    mpt.callbacks(str(tmp_path / "run"), batch_size=8, cost="always")
  assert not (tmp_path / "run").exists()  # Nothing written for a refused call.
