"""mpt never ends the training it measures: each part of mpt.callbacks / mpt.track
made to raise (`MPT_FAIL_PART`, mpt/train/common/besteffort.py), one part per run, in one
child process: the user's `fit` and loop run to their end, the run's record says what
was lost, and what did not fail is still written.
"""

import json
import textwrap

import pytest

from helpers import script_forked
from mpt.records import summary as summary_lib
from mpt.train.common import besteffort

SCRIPT = '''
import json, os, sys
import keras, numpy as np, tensorflow as tf
import mpt

out = sys.argv[1]
rng = np.random.default_rng(0)
x, y = rng.random((32, 6), dtype=np.float32), rng.integers(0, 2, (32, 1))
done = {}
for part in PARTS:
  os.environ["MPT_FAIL_PART"] = part
  model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4),
                            keras.layers.Dense(1, activation="sigmoid")], name="net")
  model.compile("sgd", "binary_crossentropy", metrics=["binary_accuracy"])
  history = model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=mpt.callbacks(
      f"{out}/fit_{part}", batch_size=4, warmup_steps=1, log_every=2,
      sample_every=0.01, profile_steps=(3, 4), numerics="on"))
  opt = keras.optimizers.SGD()
  @tf.function
  def step(a, b):
    with tf.GradientTape() as tape:
      loss = keras.losses.binary_crossentropy(b, model(a))
    opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return {"loss": tf.reduce_mean(loss)}
  run = mpt.track(f"{out}/loop_{part}", model, batch_size=4, optimizer=opt,
                  warmup_steps=1, log_every=2, sample_every=0.01, numerics="on")
  tracked, ds = run.step(step), tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
  steps = 0
  with run:
    for epoch in range(2):
      for a, b in run.batches(ds):
        tracked(a, b)
        steps += 1
      run.end_epoch()
  done[part] = {"fit_epochs": len(history.history["loss"]), "loop_steps": steps}
os.environ.pop("MPT_FAIL_PART")
print("DONE " + json.dumps(done))
'''


@pytest.mark.slow  # 22 trainings in one child: 25 s on a loaded 2-core Xeon.
def test_no_failing_part_ends_the_training(tmp_path):
  """One test over every part (under pytest-xdist a shared fixture would run the
  child once per worker)."""
  faulty = _run(tmp_path)
  for part in sorted(besteffort.PARTS):
    _check(faulty, part)


def _run(tmp):
  script = tmp / "faulty.py"
  script.write_text(f"PARTS = {sorted(besteffort.PARTS)!r}\n" + textwrap.dedent(SCRIPT))
  proc = script_forked(script, str(tmp / "logs"), cwd=tmp)  # Its start: not under test.
  assert proc.returncode == 0, proc.stderr[-3000:]
  done = json.loads(proc.stdout.split("DONE ", 1)[1].splitlines()[0])
  return tmp / "logs", done, proc.stderr


def _check(faulty, part: str) -> None:
  """`part` failed in one fit and one loop: both ran to their end, the record says
  what was lost, the rest is written."""
  logs, done, stderr = faulty
  # The user's training ran to its end: both epochs of fit, every step of the loop.
  assert done[part] == {"fit_epochs": 2, "loop_steps": 16}, part
  # (A part may also fail because another did: the writer has no step times to log
  # when the timer failed; those lines are not this part's fault.)
  said = [l for l in stderr.splitlines()
          if l.startswith(f"mpt: {part} not measured: InjectedFault: injected fault")]
  for kind in ("fit", "loop"):
    folder = logs / f"{kind}_{part}"
    if part == "record":  # What failed is the record itself: nothing to read back.
      assert not (folder / "summary.json").exists()
      continue
    if part == "profile" and kind == "loop":  # The loop asked for no profile.
      continue
    s = summary_lib.read(folder / "summary.json")
    assert s.status == "completed" and part in s.not_measured, (kind, s.not_measured)
    assert "injected fault" in s.not_measured[part]
    # What did not fail is still there: the step count (the timer's own failure
    # aside) and the diagnosis (its own failure aside).
    assert s.steps == (0 if part == "timer" else 16), (part, kind)
    assert (folder / "diagnosis.md").exists() == (part != "diagnosis"), (part, kind)
  # Said once per run, however many steps it failed at.
  assert len(said) == (1 if part == "profile" else 2), (part, said)


def test_a_hook_that_raises_is_a_line_not_an_error(capsys):
  """Guarded: whatever a part forgot, no hook of mpt's raises into Keras' loop."""
  import keras
  import numpy as np

  class Broken(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      raise ZeroDivisionError("a bug of mpt's")

  not_measured = {}
  parts = besteffort.Parts(not_measured)
  model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  model.compile("sgd", "mse")
  history = model.fit(np.zeros((8, 2)), np.zeros((8, 1)), batch_size=2, epochs=2,
                      verbose=0, callbacks=[besteffort.Guarded(Broken(), "writer", parts)])
  assert len(history.history["loss"]) == 2
  assert "ZeroDivisionError: a bug of mpt's" in not_measured["writer"]
  lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("mpt:")]
  assert lines == ["mpt: writer not measured: ZeroDivisionError: a bug of mpt's "
                   "(the training goes on)"]
