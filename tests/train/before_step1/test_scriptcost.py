"""A script's own step timed per policy (mpt/train/before_step1/scriptcost.py): the step the
program runs (an overridden train_step or compute_loss, a frozen teacher in the loss,
the loop's own tf.function) traced once per policy in that policy, the optimizer
loss-scaled under mixed_float16 only; the program left exactly as it was, read back
right after by Keras', TF's and NumPy's own accessors; the cache key following what
changes the step; a step that does more than compute not timed, said; two fits whose
steps differ measured apart."""

import json
import random
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.backend.common import global_state

from helpers import script_forked
from mpt.records import summary as summary_lib
from mpt.train.before_step1 import scriptcost
from mpt.train.common import keras_fit


def _net(policy: str | None, name: str = "net") -> keras.Model:
  """A small convnet built under `policy` (None: the global policy as it is, the
  one object every layer then shares, as one program's models do)."""
  if policy:
    keras.mixed_precision.set_global_policy(policy)
  inputs = keras.Input((8, 8, 3))
  h = keras.layers.Conv2D(8, 3, padding="same", name="conv")(inputs)
  h = keras.layers.BatchNormalization()(h)
  h = keras.layers.Dropout(0.5)(h)
  h = keras.layers.GlobalAveragePooling2D()(h)
  out = keras.layers.Activation("softmax", dtype="float32")(
      keras.layers.Dense(4, name="head")(h))
  model = keras.Model(inputs, out, name=name)
  if policy:
    keras.mixed_precision.set_global_policy("float32")
  return model


class Noisy(keras.Model):
  """A model whose compute_loss draws from Keras' global seed generator and TF's op
  seeds (as augmentation in a loss does), and whose train_step notes the optimizer
  class it was traced with and draws from Python's and NumPy's generators as it is
  traced (a per-trace random choice)."""
  traced: list = []

  def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
    loss = super().compute_loss(x, y, y_pred, sample_weight, training)
    noise = keras.random.normal(()) + tf.random.uniform(())  # Unseeded, both.
    return loss + 0.0 * tf.cast(noise, loss.dtype)

  def train_step(self, data):
    Noisy.traced.append((type(self.optimizer).__name__, random.random(),
                         np.random.random()))
    return super().train_step(data)


def _noisy(policy: str) -> keras.Model:
  plain = _net(policy)
  keras.mixed_precision.set_global_policy(policy)
  model = Noisy(plain.inputs, plain.outputs, name="noisy")
  keras.mixed_precision.set_global_policy("float32")
  return model


def _data(n=16):
  rng = np.random.default_rng(0)
  return rng.random((n, 8, 8, 3), dtype=np.float32), rng.integers(0, 4, n)


def _state(model: keras.Model) -> dict:
  """Everything a step could move, and the random state of the process."""
  opt = model.optimizer
  return {
      "variables": [np.array(v) for v in model.variables],  # BN statistics, seeds too.
      "metrics": [np.array(v) for v in model.metrics_variables],
      "optimizer": [np.array(v) for v in opt.variables],
      "opt": opt,
      "policies": [id(l.dtype_policy) for l in model._flatten_layers()],  # pylint: disable=protected-access
      "global_policy": keras.mixed_precision.global_policy().name,
      "keras_seed": np.array(global_state.get_global_attribute(
          "global_seed_generator").state),
      "tf_generator": np.array(tf.random.get_global_generator().state),
      "op_seeds": keras_fit.op_seeds(),
      "numpy": np.random.get_state()[1].copy(), "python": random.getstate(),
      "numpy_position": np.random.get_state()[2:],
  }


def _assert_same(before: dict, after: dict) -> None:
  for part in ("variables", "metrics", "optimizer"):
    assert len(before[part]) == len(after[part]), part
    for a, b in zip(before[part], after[part]):
      np.testing.assert_array_equal(a, b)
  for part in ("opt", "policies", "global_policy", "op_seeds", "python",
               "numpy_position"):
    assert before[part] == after[part], part
  for part in ("keras_seed", "tf_generator", "numpy"):
    np.testing.assert_array_equal(before[part], after[part])


def test_the_measurement_leaves_the_program_as_it_was():
  """Under mixed_float16 (compile wraps a LossScaleOptimizer), after two steps, with
  the global policy still set as the program set it: each policy's step timed, then
  read right after, every variable, the optimizer (the same object, its slots and
  scale), the metrics, each layer's policy object, the global policy and every
  random state the step or its trace draws from are as they were."""
  keras.utils.set_random_seed(3)
  model = _noisy("mixed_float16")
  keras.mixed_precision.set_global_policy("mixed_float16")
  tf.random.get_global_generator()  # Made now, so that a later draw shows.
  try:
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = _data()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    before = _state(model)
    step = scriptcost.of_fit(model, (tf.constant(x[:8]), tf.constant(y[:8])))
    found = scriptcost.measure(step, [model.optimizer], "mixed_float16",
                               table=lambda families: None)
    after = _state(model)  # Read at once: nothing reset in between.
  finally:
    keras.mixed_precision.set_global_policy("float32")
  assert [r.policy for r in found.policies] == ["float32", "mixed_bfloat16",
                                                "mixed_float16"]
  assert all(r.ms_per_step and r.first_ms for r in found.policies)
  assert found.timed == ("this program's step on a batch it fed: fit's train_step "
                         "of Noisy, with its own compute_loss, train_step")
  _assert_same(before, after)


def test_each_policy_traces_the_programs_own_step_once_loss_scaled_under_float16_only():
  """A distiller: its compute_loss runs a frozen teacher, its train_step is its own.
  Each candidate traces that step exactly once, in order (float32, the program's
  own, then the other), its layers computing in the candidate's dtype, the teacher
  inside the step, and the model's optimizer a LossScaleOptimizer under
  mixed_float16 alone; the program's optimizer is back afterwards."""
  keras.mixed_precision.set_global_policy("float32")  # One policy, as a program has.
  teacher = _net(None, "teacher")
  teacher.trainable = False
  teacher_calls, dtypes = [], []

  class Distiller(keras.Model):
    def __init__(self, student):
      super().__init__(name="distiller")
      self.student, self.teacher = student, teacher
      self.traced = []

    def call(self, x, training=False):
      return self.student(x, training=training)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None,
                     training=True):
      teacher_calls.append(1)
      soft = self.teacher(x, training=False)
      return keras.ops.mean(keras.losses.kl_divergence(soft, y_pred))

    def train_step(self, data):
      self.traced.append(type(self.optimizer).__name__)
      return super().train_step(data)

  model = Distiller(_net(None, "student"))
  model.compile(keras.optimizers.SGD(0.1))
  x, y = _data()
  model.fit(x, y, batch_size=8, epochs=1, verbose=0)
  original, teacher_calls[:], model.traced[:] = model.optimizer, [], []
  head = model.student.get_layer("head")  # The student's alone (the teacher has one).
  call = head.call
  head.call = lambda *a, **k: dtypes.append(head.compute_dtype) or call(*a, **k)
  try:
    step = scriptcost.of_fit(model, (tf.constant(x[:8]), tf.constant(y[:8])))
    found = scriptcost.measure(step, [model.optimizer], "mixed_bfloat16",
                               table=lambda families: None)  # All run, none predicted.
  finally:
    del head.call
  assert found.timed.endswith("with its own compute_loss, train_step")
  assert model.traced == ["SGD", "SGD", "LossScaleOptimizer"]  # One trace each.
  assert dtypes == ["float32", "bfloat16", "float16"]
  assert len(teacher_calls) == 3 and model.optimizer is original
  assert all(r.ms_per_step for r in found.policies)


def test_a_step_that_does_more_than_compute_is_not_timed_and_says_why(monkeypatch,
                                                                       tmp_path):
  """tf.print in the step would print again on every timed call: nothing is timed,
  the note says what the step does, and the cache holds nothing."""
  monkeypatch.delenv("MPT_COST")
  monkeypatch.setenv("MPT_CACHE", str(tmp_path))

  class Printing(keras.Model):
    def train_step(self, data):
      logs = super().train_step(data)
      tf.print("loss", logs["loss"])
      return logs

  plain = _net("float32")
  model = Printing(plain.inputs, plain.outputs)
  model.compile("adam", "sparse_categorical_crossentropy")
  x, y = _data()
  step = scriptcost.of_fit(model, (tf.constant(x[:8]), tf.constant(y[:8])))
  model.optimizer.build(model.trainable_variables)
  found, note = scriptcost.for_script(step, [model.optimizer], "float32", None)
  assert found is None
  assert note.endswith("the step prints: timing it would do that again in the "
                       "program's run")
  assert not list(tmp_path.rglob("*.json"))
  assert scriptcost.side_effects(tf.function(lambda: tf.constant(1.0))
                                 .get_concrete_function().graph) == []


def test_a_run_whose_trace_alone_would_pass_its_share_is_not_measured(monkeypatch,
                                                                      tmp_path):
  """Worth its cost: 100 planned steps of 10 ms are 1 s of training; a first step of
  5 s (a trace of ~5 s) would pass its 10% many times over: nothing is timed."""
  monkeypatch.delenv("MPT_COST")
  monkeypatch.setenv("MPT_CACHE", str(tmp_path))
  monkeypatch.setattr(scriptcost, "measure", lambda *a, **k: pytest.fail("measured"))
  model = _net("float32")
  model.compile("adam", "sparse_categorical_crossentropy")
  x, y = _data()
  step = scriptcost.of_fit(model, (tf.constant(x[:8]), tf.constant(y[:8])))
  found, note = scriptcost.for_script(step, [model.optimizer], "float32", 100,
                                      (5000.0, 10.0))
  assert found is None and note == (
      "the step's cost per policy was not measured: one trace of it (its first step "
      "took 5.0 s) would pass 10% of this run's planned training (100 steps of ~10 ms)")


def test_the_cache_key_follows_what_changes_the_step():
  """A frozen part, another loss, an overridden method, another optimizer, another
  batch: each its own entry; the same program twice, the same one."""
  x, y = _data()
  batch = (tf.constant(x[:8]), tf.constant(y[:8]))

  def key(model, optimizer="adam", loss="sparse_categorical_crossentropy", data=batch):
    model.compile(optimizer, loss)
    return scriptcost.key_for(scriptcost.of_fit(model, data), [model.optimizer])

  base = key(_net("float32"))
  assert key(_net("float32")) == base
  frozen = _net("float32")
  frozen.get_layer("conv").trainable = False
  assert key(frozen)["signature"] != base["signature"]
  assert key(_net("float32"), loss="mse")["compiled"] != base["compiled"]
  assert key(_net("float32"), optimizer="sgd")["optimizers"] != base["optimizers"]
  assert key(_net("float32"), data=(batch[0][:4], batch[1][:4]))["inputs"] != base[
      "inputs"]
  plain = _net("float32")
  assert key(Noisy(plain.inputs, plain.outputs, name="net"))["methods"] != base[
      "methods"]


def test_a_loops_own_step_is_timed_and_an_eager_one_is_not():
  model = _net("float32")
  optimizer = keras.optimizers.Adam()
  optimizer.build(model.trainable_variables)
  loss_fn = keras.losses.SparseCategoricalCrossentropy()

  @tf.function
  def train_step(x, y):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
    optimizer.apply(tape.gradient(loss, model.trainable_variables),
                    model.trainable_variables)
    return loss

  x, y = _data()
  args = (tf.constant(x[:8]), tf.constant(y[:8]))
  train_step(*args)
  before = [np.array(v) for v in model.variables + optimizer.variables]
  step = scriptcost.of_loop((model,), train_step, args, {})
  found = scriptcost.measure(step, [optimizer], "float32", table=lambda f: None)
  assert found.timed.endswith("the loop's own step function")
  assert all(r.ms_per_step for r in found.policies)
  for a, b in zip(before, [np.array(v) for v in model.variables + optimizer.variables]):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(scriptcost.NotTimeable, match="run eagerly"):
    scriptcost.of_loop((model,), train_step.python_function, args, {})


SCRIPT = '''
import keras, numpy as np, mpt
rng = np.random.default_rng(0)
x, y = rng.random((160, 8, 8, 3), dtype=np.float32), rng.integers(0, 4, 160)
inputs = keras.Input((8, 8, 3))
h = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(8, 3)(inputs))
model = keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(h))
model.compile("adam", "sparse_categorical_crossentropy")
cbs = mpt.callbacks(RUN_DIR, batch_size=8, sample_every=None, diagnose=DIAGNOSE)
model.fit(x, y, batch_size=8, epochs=EPOCHS, verbose=0, callbacks=cbs)
if TWO_FITS:  # The convolution frozen: another step, another measurement.
  model.layers[1].trainable = False
  model.compile("adam", "sparse_categorical_crossentropy")
  model.fit(x, y, batch_size=8, epochs=EPOCHS, verbose=0, callbacks=cbs)
'''


def _script(tmp_path, epochs: int, two_fits: bool = False, diagnose: bool = True
            ) -> tuple[summary_lib.RunSummary, str]:
  run_dir = tmp_path / f"run{epochs}{two_fits}"
  script = tmp_path / f"s{epochs}{two_fits}.py"
  script.write_text(f"RUN_DIR = {str(run_dir)!r}\nEPOCHS = {epochs}\n"
                    f"TWO_FITS = {two_fits}\nDIAGNOSE = {diagnose}\n"
                    + textwrap.dedent(SCRIPT))
  # Its start is not under test.
  # Measured whatever the run's length (its 20 steps of ~3 ms cannot pay for it).
  proc = script_forked(script, cwd=tmp_path, timeout=300,
                       env={"MPT_COST": "always", "MPT_CACHE": str(tmp_path / "cache")})
  assert proc.returncode == 0, proc.stderr[-3000:]
  return summary_lib.read(run_dir / "summary.json"), proc.stdout


def test_a_script_is_told_its_own_steps_cost_and_a_second_run_reads_the_cache(tmp_path):
  """20 steps: the step timed per policy after step 1, the verdict resting on it
  (evidence `cost`, not the probe); the same script for 40 steps reads the cache.
  (A run too short to pay for it: tests/train/script/test_library.py's 16-step fit.)"""
  summary, stdout = _script(tmp_path, 1)
  assert summary.cost is not None and summary.cost.source == "measured"
  assert summary.program.fits[0].cost == summary.cost
  assert {p.policy for p in summary.cost.policies if p.ms_per_step} == {
      "float32", "mixed_bfloat16", "mixed_float16"}
  assert summary.policy_verdict.evidence == "cost" and "cost" not in summary.not_measured
  assert "mpt: cost here" in stdout and "this program's step on a batch it fed" in stdout
  again, _ = _script(tmp_path, 2)
  assert again.cost.source.startswith("cache: ")
  summary = json.loads((tmp_path / "run2False" / "summary.json").read_text())
  assert summary["policy_verdict"]["evidence"] == "cost"


def test_two_fits_whose_steps_differ_are_measured_apart(tmp_path):
  """The second fit freezes a layer: its step differs, so it has its own measurement
  (its key names the frozen weights), checked against its own steps at its end."""
  summary, stdout = _script(tmp_path, 3, two_fits=True, diagnose=False)
  first, second = summary.program.fits
  assert first.cost and second.cost and first.cost.key != second.cost.key
  assert first.cost.key["signature"] != second.cost.key["signature"]
  assert summary.cost == second.cost and stdout.count("mpt: cost here") == 2
  assert first.ms_per_step and second.ms_per_step


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
          callbacks=mpt.callbacks(RUN_DIR, batch_size=8, warmup_steps=2,
                                  sample_every=None))
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


def test_cost_off_times_nothing_and_says_so(tmp_path, monkeypatch):
  import mpt  # pylint: disable=import-outside-toplevel
  monkeypatch.delenv("MPT_COST")  # Not standing in: "off" alone keeps it untimed.
  monkeypatch.setattr(scriptcost, "measure", lambda *a, **k: pytest.fail("measured"))
  model = _net("float32")
  model.compile("adam", "sparse_categorical_crossentropy")
  x, y = _data(64)
  model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=mpt.callbacks(
      str(tmp_path / "run"), batch_size=8, cost="off", sample_every=None,
      diagnose=False))
  summary = summary_lib.read(tmp_path / "run" / "summary.json")
  assert summary.cost is None and summary.not_measured["cost"] == "cost='off' was given"


def test_a_cost_option_other_than_auto_or_off_is_refused_before_training(tmp_path):
  import mpt  # pylint: disable=import-outside-toplevel
  from mpt.errors import UserError  # pylint: disable=import-outside-toplevel
  with pytest.raises(UserError, match=r"mpt.callbacks: cost='always': auto or off"):
    mpt.callbacks(str(tmp_path / "run"), batch_size=8, cost="always")
  assert not (tmp_path / "run").exists()  # Nothing written for a refused call.
