"""mpt in research code as it is, each shape a user's own script run in a child
process, its run folder, tags and diagnosis read back:

- `mpt.callbacks` around a Functional model's `fit`;
- an unbuilt subclassed model with a custom layer (and layers inside a custom layer),
  two fits with one callback list, a recompile (new optimizer) and an `evaluate`
  between them;
- a custom loop through `mpt.track` under mixed_float16 with the Keras 3
  LossScaleOptimizer recipe (experiments/own_loop.py, as a user would run it);
- Keras on another backend: one line, from the library; handled by the command line.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import ROOT, USER_SCALE_LAYER, read_events, script_forked, tiny_flags
from mpt.records import numerics as numerics_lib
from mpt.records import summary as summary_lib


USER_SCRIPT = '''
import keras
import numpy as np
import mpt

keras.mixed_precision.set_global_policy("mixed_bfloat16")
rng = np.random.default_rng(0)
x = rng.random((64, 24, 24, 3), dtype=np.float32)
y = rng.integers(0, 4, 64)
inputs = keras.Input((24, 24, 3))
h = keras.layers.Conv2D(8, 3, activation="relu")(inputs)
h = keras.layers.GlobalAveragePooling2D()(h)
outputs = keras.layers.Activation("softmax", dtype="float32")(keras.layers.Dense(4)(h))
model = keras.Model(inputs, outputs, name="my_net")
model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, batch_size=8, epochs=2, validation_data=(x[:16], y[:16]), verbose=0,
          callbacks=mpt.callbacks(RUN_DIR, batch_size=8, warmup_steps=2, log_every=4,
                                   sample_every=0.05))

''' + USER_SCALE_LAYER + '''


class Block(keras.layers.Layer):
  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.conv = keras.layers.Conv2D(8, 3, activation="relu", name="inner_conv")
    self.scale = Scale(name="scale")

  def call(self, x):
    return self.scale(self.conv(x))


class Net(keras.Model):
  def __init__(self):
    super().__init__(name="sub_net")
    self.block = Block(name="block")
    self.pool = keras.layers.GlobalAveragePooling2D()
    self.head = keras.layers.Dense(4)
    self.probs = keras.layers.Activation("softmax", dtype="float32")

  def call(self, x, training=False):
    return self.probs(self.head(self.pool(self.block(x))))


sub = Net()  # Unbuilt: fit builds it.
sub.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
cbs = mpt.callbacks(SUB_DIR, batch_size=8, warmup_steps=2, log_every=4, sample_every=0.05)
sub.fit(x, y, batch_size=8, epochs=2, validation_data=(x[:16], y[:16]), verbose=0,
        callbacks=cbs)
sub.evaluate(x[:16], y[:16], verbose=0, callbacks=cbs)
sub.compile(keras.optimizers.Adam(1e-4), "sparse_categorical_crossentropy",
            metrics=["accuracy"])  # Fine-tune: a new optimizer, iterations from 0.
sub.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=cbs)
'''


@pytest.fixture(scope="module")
def user_runs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("user")
  run_dir, sub_dir = tmp / "logs" / "my_run", tmp / "logs" / "sub_run"
  script = tmp / "train_mine.py"
  script.write_text(f"RUN_DIR = {str(run_dir)!r}\nSUB_DIR = {str(sub_dir)!r}\n"
                    + textwrap.dedent(USER_SCRIPT))
  # The real rule for the step's cost (MPT_COST unset); the script's start is not
  # under test, so it is forked from the server that imported TensorFlow once.
  proc = script_forked(script, cwd=tmp, env={"MPT_COST": None}, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return run_dir, sub_dir, proc.stdout


def test_user_script_gets_a_run_folder(user_runs):
  run_dir, _, stdout = user_runs
  summary = summary_lib.read(run_dir / "summary.json")
  assert (summary.status, summary.model, summary.policy) == \
      ("completed", "my_net", "mixed_bfloat16")
  assert summary.steps == 16 and summary.epochs_completed == 2  # 64 / 8 x 2 epochs.
  assert summary.timed_steps == 14 and summary.ms_per_step > 0
  assert summary.val_accuracy is not None and summary.flops_per_step > 0
  dtypes = json.loads((run_dir / "dtypes.json").read_text())
  assert dtypes["policy"] == "mixed_bfloat16" and dtypes["params"] == 8 * 27 + 8 + 36
  assert "mpt: dtypes:" in stdout and f"tensorboard --logdir {run_dir.parent}" in stdout
  # The evidence a CLI run records: the batch fetch timed (through Keras' train
  # function), the kernel verdict before step 1; and what it could not measure.
  assert summary.data_wait_share is not None and 0 <= summary.data_wait_share < 1
  # The kernel table conftest gives for its stand-in CPU (a recorded probe), or none.
  assert summary.policy_verdict is not None and summary.policy_verdict.evidence == (
      "flags" if os.environ.get("MPT_KERNELS") == "none" else "probe")
  # Its 16 steps are fewer than measuring the step per policy would cost: said.
  assert "this run's 16 steps cost about what measuring them would" in \
      summary.not_measured["cost"] and summary.cost is None
  # Its numerics (a 16-bit global policy: --numerics' auto), on the batches it fed:
  # after the warm-up's 2 steps and at the fit's end, every layer of its model.
  numerics = numerics_lib.read(run_dir)
  assert [(s.step, s.examples) for s in numerics.samples] == [(3, 8), (16, 8)]
  assert [r.cls for r in numerics.samples[0].layers] == [
      "Conv2D", "GlobalAveragePooling2D", "Dense", "Activation"]
  assert all(r.grad is not None for r in numerics.samples[0].layers[:3])  # fit's loss.
  assert "numerics" not in summary.not_measured and "mpt: numerics at step 3" in stdout


def test_user_script_gets_mpts_tags_and_diagnosis(user_runs):
  run_dir, _, stdout = user_runs
  events = read_events(run_dir)
  assert [s for s, _ in events["train/loss"]] == [8, 16]  # Per epoch, at the step.
  assert [s for s, _ in events["eval/accuracy"]] == [8, 16]
  assert [s for s, _ in events["perf/step_time_ms"]] == [4, 8, 12, 16]
  assert "precision/loss_scale" in events and "util/process_cpu_percent" in events
  assert {"final/ms_per_step", "final/images_per_sec", "final/val_accuracy"} <= set(events)
  assert "diagnosis/report" in events and "inspect/dtypes" in events
  from tensorboard.backend.event_processing import event_accumulator
  acc = event_accumulator.EventAccumulator(str(run_dir))
  acc.Reload()
  hparams = acc.PluginTagToContent("hparams")  # The HParams dashboard's session.
  assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(hparams)
  diagnosis = (run_dir / "diagnosis.md").read_text()  # Written as for any run.
  assert "not measured (cost)" in diagnosis and "made before mpt" not in diagnosis


def test_a_subclassed_model_over_two_fits_is_one_run(user_runs):
  _, sub_dir, stdout = user_runs
  summary = summary_lib.read(sub_dir / "summary.json")
  # 8 steps per epoch: 2 epochs, then 1 more; each fit warms up again (2 steps).
  assert (summary.status, summary.model, summary.steps) == ("completed", "sub_net", 24)
  assert summary.epochs_completed == 3 and summary.timed_steps == 24 - 2 - 2
  assert summary.image_size == 24  # Read off the model once fit had built it.
  assert summary.skipped_steps == 0  # Not 16: the new optimizer counts from its own 0.
  events = read_events(sub_dir)
  assert [s for s, _ in events["train/loss"]] == [8, 16, 24]  # Steps continue.
  assert [s for s, _ in events["perf/step_time_ms"]] == [4, 8, 12, 16, 20, 24]
  assert [s for s, _ in events["precision/skipped_steps"]] == [4, 8, 12, 16, 20, 24]
  assert {v for _, v in events["precision/skipped_steps"]} == {0.0}
  assert len(events["diagnosis/report"]) == 2  # One per fit, the whole run so far.
  assert stdout.count(f"mpt: completed: {sub_dir}") == 2
  assert f"mpt: completed: {sub_dir}, fit 2, 24 steps" in stdout
  # Every layer doing its own work, inside the custom layer too (named by its path
  # there), and what was not seen.
  dtypes = json.loads((sub_dir / "dtypes.json").read_text())
  assert [l["name"] for l in dtypes["layers"]][:2] == ["block/inner_conv", "block/scale"]
  assert dtypes["input_shape"] == [24, 24, 3]
  assert dtypes["uncounted_layers"] == ["block/scale"]
  conv = dtypes["layers"][0]
  assert conv["flops"] == 2 * 22 * 22 * 8 * 27 + 22 * 22 * 8  # By hand, with its ReLU.
  # What the script ran, as its record (no flags.txt: mpt cannot replay a script).
  assert not (sub_dir / "flags.txt").exists()
  program = summary.program
  assert (summary.api, program.api, program.batch_size, program.policy) == \
      ("mpt.callbacks", "mpt.callbacks", 8, "mixed_bfloat16")
  assert [(f.epochs, f.steps, f.epochs_completed) for f in program.fits] == \
      [(2, 16, 2), (1, 8, 1)]  # evaluate() between them is no fit.
  assert [(o.cls, o.learning_rate, o.updates) for o in program.optimizers] == \
      [("Adam", pytest.approx(1e-3), 16), ("Adam", pytest.approx(1e-4), 8)]
  assert program.inputs == {"input": [24, 24, 3]}


@pytest.fixture(scope="module")
def own_loop(tmp_path_factory):
  run_dir = tmp_path_factory.mktemp("loop") / "logs" / "own"
  proc = script_forked(  # Its start is not under test.
      ROOT / "experiments" / "own_loop.py", f"--run_dir={run_dir}",
      "--policy=mixed_float16", "--epochs=2", "--image_size=16", "--batch_size=8",
      cwd=run_dir.parent.parent, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return run_dir, proc.stdout


def test_own_loop_with_a_loss_scale_optimizer(own_loop):
  run_dir, stdout = own_loop
  summary = summary_lib.read(run_dir / "summary.json")
  assert (summary.status, summary.loop, summary.model) == ("completed", "custom",
                                                           "own_net")
  assert summary.steps == 16 and summary.epochs_completed == 2  # 8 batches x 2.
  assert summary.timed_steps == 14 and summary.ms_per_step > 0
  # The LossScaleOptimizer's dynamic scale, read from the optimizer the loop gave: it
  # starts at 2**15, halves at each skipped step and doubles only after 2000 good
  # ones, so after 16 steps it tells how many were skipped.
  assert summary.loss_scale == 2.0**(15 - summary.skipped_steps), summary.loss_scale
  assert 0 <= summary.skipped_steps < 16 and summary.train_loss is not None
  assert summary.data_wait_share is not None  # run.batches() timed each fetch.
  events = read_events(run_dir)
  assert [s for s, _ in events["perf/step_time_ms"]] == [4, 8, 12, 16]
  scales = [v for _, v in events["precision/loss_scale"]]
  assert len(scales) == 4 and scales[-1] == summary.loss_scale
  assert [s for s, _ in events["train/loss"]] == [8, 16]
  assert "diagnosis/report" in events and (run_dir / "diagnosis.md").exists()
  assert "mpt: diagnosis of" in stdout and f"mpt: completed: {run_dir}" in stdout
  # Its numerics (mixed_float16: sampled): outputs only, a loop's own loss being
  # unknown to mpt (docs/usage.md), so no layer has an incoming gradient.
  rows = [l for s in numerics_lib.read(run_dir).samples for l in s.layers]
  assert rows and all(l.output.count for l in rows)
  assert all(l.grad is None for l in rows)


def test_a_loop_that_never_steps_says_so(tmp_path, capsys):
  """Said in one line, not raised: the program goes on after its loop (it may save
  its model next)."""
  import keras
  import mpt
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  run = mpt.track(str(tmp_path / "r"), model, batch_size=2, sample_every=None,
                  diagnose=False)
  with run:
    for _ in range(3):
      pass  # The step was never wrapped or called.
  lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("mpt:")]
  assert len(lines) == 1 and "never called the tracked step" in lines[0]
  assert not (tmp_path / "r" / "summary.json").exists()


def test_a_loop_without_end_epoch_keeps_its_last_steps_metrics_and_its_flops(tmp_path):
  """No run.end_epoch(): the run's metrics are what the last tracked step returned, no
  epoch is claimed, and the step's FLOPs come from the tracked tf.function's own
  graph: a Dense 4->2 at batch 8, forward and its weights' gradient (2 x 2*8*4*2)."""
  import keras
  import numpy as np
  import tensorflow as tf
  import mpt
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  opt = keras.optimizers.SGD(0.1)
  opt.build(model.trainable_variables)

  @tf.function
  def train_step(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(model(x) ** 2)
    opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return {"loss": loss, "score": 2 * loss}

  run = mpt.track(str(tmp_path / "r"), model, batch_size=8, optimizer=opt,
                  warmup_steps=1, sample_every=None, diagnose=False)
  step = run.step(train_step)
  with run:
    for _ in range(3):
      logs = step(np.ones((8, 4), "float32"))
  summary = summary_lib.read(tmp_path / "r" / "summary.json")
  last = float(logs["loss"])
  assert summary.metrics == pytest.approx({"loss": last, "score": 2 * last})
  assert summary.train_loss == pytest.approx(last) and summary.epochs_completed == 0
  assert "never called run.end_epoch()" in summary.not_measured["epochs"]
  assert summary.flops_matmul == 2 * (2 * 8 * 4 * 2)
  assert summary.flops_counted_by.startswith("graph:")


def test_an_eager_tracked_step_has_no_flop_count_and_says_why(tmp_path):
  import keras
  import numpy as np
  import mpt
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  run = mpt.track(str(tmp_path / "r"), model, batch_size=8, sample_every=None,
                  diagnose=False)
  step = run.step(lambda x: {"loss": float(np.mean(model(x)))})
  with run:
    step(np.ones((8, 4), "float32"))
    run.end_epoch()
  summary = summary_lib.read(tmp_path / "r" / "summary.json")
  assert summary.flops_per_step is None and "not a tf.function" in \
      summary.not_measured["flops"]
  assert "epochs" not in summary.not_measured


def test_another_keras_backend_is_one_line(tmp_path, monkeypatch):
  """No other Keras backend is installed here (jax and torch are not mpt's
  dependencies, and Keras' numpy backend needs jax), so the library's check is shown
  Keras answering "jax"; the command line is run with KERAS_BACKEND=jax for real."""
  import keras
  import mpt
  from mpt.errors import UserError
  monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
  for call in (lambda: mpt.callbacks(str(tmp_path / "a"), batch_size=8),
               lambda: mpt.track(str(tmp_path / "b"), None, batch_size=8)):
    with pytest.raises(UserError) as e:
      call()
    assert "Keras runs on the 'jax' backend here; mpt measures TensorFlow only: set " \
        "KERAS_BACKEND=tensorflow before keras is imported" in str(e.value)
  assert not (tmp_path / "a").exists()
  # The command line sets it for its own process, and says so (without that, importing
  # Keras would fail here: jax is not installed).
  # (On tiny data: the numerics sample reads a few batches of the synthetic set.)
  proc = subprocess.run([sys.executable, "-m", "mpt", "--mode=inspect",
                         *tiny_flags(tmp_path)], capture_output=True, text=True,
                        timeout=180, cwd=tmp_path,
                        env={**os.environ, "KERAS_BACKEND": "jax"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "KERAS_BACKEND=jax ignored: mpt measures TensorFlow" in proc.stdout
  assert len(list((tmp_path / "logs").glob("*/dtypes.json"))) == 1


def test_user_run_folder_is_never_overwritten(tmp_path):
  import mpt
  (tmp_path / "summary.json").write_text("{}")
  with pytest.raises(FileExistsError, match="already holds a run"):
    mpt.callbacks(str(tmp_path), batch_size=8)


def test_a_step_may_return_any_nest():
  """mpt.track reads back every leaf of whatever the step returned and logs its
  scalars by path (a tuple failed in np.asarray before)."""
  import numpy as np
  import tensorflow as tf
  from mpt.train.script.tracker import _materialised
  images = tf.zeros((2, 4, 4, 1))
  assert _materialised((tf.constant(0.5), 2.0, images)) == {"output_0": 0.5,
                                                            "output_1": 2.0}
  assert _materialised({"d": {"loss": tf.constant(1.5)}, "n": np.int64(3),
                        "text": "x"}) == {"d/loss": 1.5, "n": 3.0}
  assert _materialised(tf.constant(0.25)) == {"loss": 0.25}
  assert _materialised([tf.constant([1.0])]) == {"output_0": 1.0}
  assert _materialised(None) == {}


LOOP_THAT_RAISES = '''
import keras, numpy as np, tensorflow as tf, mpt
inputs = keras.Input((4,))
model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
opt = keras.optimizers.SGD()
@tf.function
def train_step(x):
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(model(x) ** 2)
  opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
  return loss
run = mpt.track(RUN_DIR, model, batch_size=8, optimizer=opt, sample_every=None)
step = run.step(train_step)
with run:
  for i in range(6):
    step(np.ones((8, 4), "float32"))
    if i == 3:
      raise RAISED("the loop's own bug")
'''


@pytest.mark.parametrize("raised, status", [("ValueError", "failed"),
                                            ("KeyboardInterrupt", "interrupted")])
def test_a_tracked_loop_ends_in_the_command_lines_words(tmp_path, raised, status):
  """A bug in a script's loop is `failed` with its error, as the same bug in the
  command line's run is; Ctrl-C is `interrupted` (one vocabulary, mpt/errors.py)."""
  run_dir = tmp_path / "loop"
  script = tmp_path / "loop.py"
  script.write_text(f"RUN_DIR = {str(run_dir)!r}\nRAISED = {raised}\n"
                    + textwrap.dedent(LOOP_THAT_RAISES))
  proc = script_forked(script, cwd=tmp_path, timeout=300)  # Its start is not under test.
  assert proc.returncode != 0 and raised in proc.stderr  # The error goes on.
  summary = summary_lib.read(run_dir / "summary.json")
  assert (summary.status, summary.steps) == (status, 4)
  if status == "failed":
    assert summary.message == "ValueError: the loop's own bug"
