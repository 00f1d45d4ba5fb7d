"""mpt under Keras training programs of many shapes (tests/train/programs/, each in the
shape of a keras.io guide or example: fit with a custom train_step, a GAN with two
optimizers, a VAE with add_loss, string and dict inputs, a multi-input model, a
MirroredStrategy, loops of its own under `mpt.track`, mixed_float16 with skipped
steps, ...). run_all.py runs them all once, in one child process; each program's run
folder is then read back and compared with the figures the program fixed itself:
status, steps, epochs, policy, loop, skipped steps and loss scale (summary.json), and
its diagnosis.
"""

import importlib.util
import json
import subprocess
import sys

import pytest

from helpers import ROOT
from mpt.records import summary as summary_lib

pytestmark = pytest.mark.slow

RUNNER = ROOT / "tests" / "train" / "programs" / "run_all.py"
# summary.json fields a program's expectation may name (only those it names are read).
FIELDS = ("status", "steps", "epochs_completed", "policy", "loop", "skipped_steps",
          "loss_scale")


def _programs() -> tuple[str, ...]:
  spec = importlib.util.spec_from_file_location("mpt_programs_run_all", RUNNER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)  # Imports nothing of TensorFlow or Keras.
  return module.PROGRAMS


PROGRAMS = _programs()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """Every program run once (results.json, one run folder each), in a child that
  inherits the session's environment."""
  tmp = tmp_path_factory.mktemp("programs")
  out = tmp / "out"
  proc = subprocess.run([sys.executable, str(RUNNER), str(out)], capture_output=True,
                        text=True, timeout=400, cwd=tmp)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((out / "results.json").read_text())
  assert list(results) == list(PROGRAMS)
  return out, results


@pytest.mark.parametrize("name", PROGRAMS)
def test_program_gets_its_run_folder(corpus, name):
  out, results = corpus
  result = results[name]
  assert result["error"] is None, f"{name} raised:\n{result['error']}"
  expected = result["expected"]
  assert set(expected) <= set(FIELDS) and {"status", "steps", "policy"} <= set(expected)
  run_dir = out / name
  summary = summary_lib.read(run_dir / "summary.json")
  found = {field: getattr(summary, field) for field in FIELDS if field in expected}
  assert found == expected  # loss_scale exactly: each program fixed its own.
  assert (run_dir / "diagnosis.md").exists()
