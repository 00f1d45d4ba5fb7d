"""mpt in a user's own training script: `mpt.callbacks(run_dir, ...)` around their
`model.fit` writes the run folder a `python -m mpt.main` run would (summary.json,
dtypes.json, the same TensorBoard tags) and ends with the diagnosis. Run as the user
would: a script of their own, in a child process."""

import json
import subprocess
import sys
import textwrap

import pytest

from helpers import read_events
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
'''


@pytest.fixture(scope="module")
def user_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("user")
  run_dir = tmp / "logs" / "my_run"
  script = tmp / "train_mine.py"
  script.write_text(f"RUN_DIR = {str(run_dir)!r}\n" + textwrap.dedent(USER_SCRIPT))
  proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                        timeout=300, cwd=tmp)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return run_dir, proc.stdout


def test_user_script_gets_a_run_folder(user_run):
  run_dir, stdout = user_run
  summary = summary_lib.read(run_dir / "summary.json")
  assert (summary.status, summary.model, summary.policy) == \
      ("completed", "my_net", "mixed_bfloat16")
  assert summary.steps == 16 and summary.epochs_completed == 2  # 64 / 8 x 2 epochs.
  assert summary.timed_steps == 14 and summary.ms_per_step > 0
  assert summary.val_accuracy is not None and summary.flops_per_step > 0
  dtypes = json.loads((run_dir / "dtypes.json").read_text())
  assert dtypes["policy"] == "mixed_bfloat16" and dtypes["params"] == 8 * 27 + 8 + 36
  assert "mpt: dtypes:" in stdout and f"tensorboard --logdir {run_dir.parent}" in stdout


def test_user_script_gets_mpts_tags_and_diagnosis(user_run):
  run_dir, stdout = user_run
  events = read_events(run_dir)
  assert [s for s, _ in events["train/loss"]] == [8, 16]  # Per epoch, at the step.
  assert [s for s, _ in events["eval/accuracy"]] == [8, 16]
  assert [s for s, _ in events["perf/step_time_ms"]] == [4, 8, 12, 16]
  assert "precision/loss_scale" in events and "util/process_cpu_percent" in events
  assert {"final/ms_per_step", "final/images_per_sec", "final/val_accuracy"} <= set(events)
  assert "diagnosis/report" in events
  assert (run_dir / "diagnosis.md").exists()  # Written by the diagnosis, as for any run.


def test_user_run_folder_is_never_overwritten(tmp_path):
  import mpt
  (tmp_path / "summary.json").write_text("{}")
  with pytest.raises(FileExistsError, match="already holds a run"):
    mpt.callbacks(str(tmp_path), batch_size=8)
