"""What a run leaves on the terminal and on disk: a quiet, honest terminal when output
is not a terminal (no absl INFO, no line twice, a line per epoch, no escape codes,
the closing line says how to look), --checkpoint=false leaving no checkpoint files,
and a failed run's summary.json saying why."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from helpers import ROOT, TINY_FLAGS, train_run
from mpt.errors import UserError
from mpt.records import summary as summary_lib


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
  """A default run's whole terminal output (stdout and stderr, one pipe: not a TTY),
  on tiny data, with the user's TF log level unset so that mpt's default applies."""
  tmp = tmp_path_factory.mktemp("quiet")
  flags = [f for f in TINY_FLAGS if not f.startswith("--verbose")]
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  proc = subprocess.run(
      [sys.executable, "-m", "mpt.main", *flags, "--epochs=3", f"--data_dir={tmp}",
       f"--logdir={tmp}/logs"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:]
  return proc.stdout, tmp / "logs"


def test_no_absl_info_lines_and_no_escape_codes(default_run):
  out, _ = default_run
  # absl's and TF's C++ INFO lines both start `I` + MMDD (`I1203 12:00:00.1 ...`).
  assert not [l for l in out.splitlines() if re.match(r"I\d{4} ", l)], out
  assert "\x1b[" not in out and "\r" not in out, out


def test_no_line_twice_and_few_lines(default_run):
  out, _ = default_run
  lines = [l for l in out.splitlines() if l.strip()]
  twice = sorted({l for l in lines if lines.count(l) > 1})
  assert twice == [], out
  assert len(lines) <= 30, out


def test_a_line_per_epoch_dtypes_in_one_line_and_how_to_look(default_run):
  out, logs = default_run
  # mpt's epoch lines in place of Keras' bar (5 steps of batch 4 over 20 images).
  epochs = re.findall(r"^mpt: epoch (\d)/3: 5 steps, [\d.]+ ms/step, .*val_loss", out, re.M)
  assert epochs == ["1", "2", "3"], out
  assert not re.search(r"^Epoch \d|\d+/\d+ \[=*", out, re.M), out  # No Keras bar.
  assert len(re.findall(r"^mpt: dtypes: ", out, re.M)) == 1, out
  # The per-layer table itself is not printed: neither its header, nor a layer's row
  # (name, then its class), nor the totals only the table has.
  assert not re.search(r"^name\s+class\s+policy\s+compute_dtype", out, re.M), out
  assert not re.search(r"^\s*conv1\s+\S*Conv2D\b", out, re.M), out
  assert "forward FLOPs in 16-bit:" not in out and "gradient dtypes" not in out, out
  assert out.rstrip().endswith(f"mpt: look: tensorboard --logdir {logs}"), out


def test_the_closing_line_says_where_and_the_headline_figures(default_run):
  out, logs = default_run
  # README's `mpt: completed: logs/<run>, 164 steps, 104.9 ms/step, val_accuracy 0.654,
  # wall 26 s`, next to last, naming the one run folder there is.
  (run_dir,) = [p for p in logs.iterdir() if p.is_dir()]
  summary = json.loads((run_dir / "summary.json").read_text())
  closing = out.rstrip().splitlines()[-2]
  assert closing == (f"mpt: completed: {run_dir}, 15 steps, "
                     f"{summary['ms_per_step']:.1f} ms/step, "
                     f"val_accuracy {summary['val_accuracy']:.3f}, "
                     f"wall {summary['wall_s']:.0f} s"), out


def test_checkpoint_false_writes_no_checkpoint(tiny):
  summary = train_run(tiny(checkpoint=False, epochs=2, checkpoint_every=2))
  run_dir = pathlib.Path(summary["run_dir"])
  assert summary["status"] == "completed" and summary["checkpoints"] is False
  assert not [p for p in run_dir.rglob("*") if "checkpoint" in p.name.lower()
              or p.parent.name == "checkpoints"]
  assert summary_lib.read(run_dir / "summary.json").checkpoints is False
  from mpt.train.cli import run
  with pytest.raises(UserError, match="--checkpoint=false and has no checkpoint"):
    run.train_and_evaluate(tiny(resume=str(run_dir)))


def test_failed_run_records_why(tiny, monkeypatch):
  monkeypatch.setenv("MPT_INJECT_FAULT", "fail:8")  # tiny's batch size.
  with pytest.raises(RuntimeError,
                     match=r"^injected failure \(MPT_INJECT_FAULT=fail:8\)$"):
    train_run(tiny())
  run_dir = next(p for p in pathlib.Path(tiny().logdir).iterdir() if p.is_dir())
  summary = json.loads((run_dir / "summary.json").read_text())
  assert summary["status"] == "failed"
  assert summary["message"] == "RuntimeError: injected failure (MPT_INJECT_FAULT=fail:8)"
