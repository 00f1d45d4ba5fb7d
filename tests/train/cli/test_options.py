"""Training flags a user sets and a run obeys, read back from the run: --notf32 in the
run's TF state and summary.json, --verbose=2 as Keras' own lines, --force training past
a refusal, and the microbenchmark's cache read as this machine's measured rate."""

import json
import pathlib

import pytest
import tensorflow as tf

from mpt.machine import isa
from mpt.machine import rates
from mpt.train.before_step1 import preflight

from helpers import train_run


@pytest.fixture
def tf32_restored():
  """TF32 is process-wide: put TensorFlow's default back for the tests that follow."""
  yield
  tf.config.experimental.enable_tensor_float_32_execution(True)


def test_notf32_trains_with_tf32_off_and_says_so(tiny, tf32_restored):
  """--notf32 (config.tf32=False) is applied before step 1 and recorded (the default
  leaves TensorFlow's TF32 on: tests/train/cli/test_train.py's runs record True). No
  GPU here: the state is read, not its effect."""
  off = train_run(tiny(tf32=False, epochs=1, run_name="off"))
  assert off["hardware"]["tf32"] is False
  assert not tf.config.experimental.tensor_float_32_execution_enabled()
  assert "--notf32" in (pathlib.Path(off["run_dir"]) / "flags.txt").read_text()


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_verbose_2_prints_keras_lines_per_epoch_instead_of_mpts(tiny, capfd, loop):
  """Output is not a terminal here: at --verbose=1 mpt prints its own line per epoch
  (test_terminal_and_disk.py); --verbose=2 hands the lines to Keras, in both loops."""
  train_run(tiny(verbose=2, epochs=2, loop=loop))
  out = capfd.readouterr().out.splitlines()
  assert [l for l in out if l.startswith("Epoch ")] == ["Epoch 1/2", "Epoch 2/2"], out
  assert sum(l.startswith("8/8 ") and " loss: " in l for l in out) == 2, out
  assert not [l for l in out if l.startswith("mpt: epoch ")], out


def test_force_trains_a_batch_the_estimate_refuses(tiny, monkeypatch, capfd):
  """1 MiB stands in for the host's free RAM: refused without --force (no run folder
  left), trained with it, with the warning and the plan it overrode recorded."""
  monkeypatch.setenv("MPT_AVAILABLE_MB", "1")
  with pytest.raises(preflight.WillNotFit):
    train_run(tiny(epochs=1, run_name="refused"))
  assert not (pathlib.Path(tiny().logdir) / "refused").exists()
  summary = train_run(tiny(epochs=1, force=True, run_name="forced"))
  assert summary["status"] == "completed" and summary["steps"] == 8
  assert summary["memory"]["available_mb"] == 1.0
  warned = [l for l in capfd.readouterr().out.splitlines() if l.startswith("WARNING: ")]
  assert len(warned) == 1 and warned[0].startswith(
      "WARNING: memory: batch 8 under float32 needs ~"), warned
  assert warned[0].endswith("; training anyway (--force)")


def test_a_run_reads_this_machines_cached_microbenchmark(tiny, monkeypatch, tmp_path):
  """A full --mode=microbench caches its rates by CPU, core count and TF version
  (mpt/machine/rates.py); a run compares its achieved rate with the best TensorFlow
  matmul there. The cache here is written by hand with known figures."""
  monkeypatch.setenv("MPT_CACHE", str(tmp_path / "cache"))
  cpu = isa.detect()
  path = rates.cache_path(cpu.name, cpu.logical_cpus, tf.__version__)
  path.parent.mkdir(parents=True)
  row = lambda lib, dtype, gflops, op="matmul": dict(op=op, lib=lib, dtype=dtype,
                                                     size=256, gflops=gflops)
  path.write_text(json.dumps({"throughput": [
      row("tensorflow", "float32", 50.0), row("tensorflow", "float32", 123.0),
      row("numpy", "float32", 999.0), row("tensorflow", "float32", 500.0, "conv2d"),
      row("tensorflow", "bfloat16", 77.0)]}))
  summary = train_run(tiny(epochs=1))
  assert summary["microbench_gflops_by_dtype"] == {
      "float32": 123.0, "bfloat16": 77.0, "float16": None}
  assert summary["achieved_gflops"] > 0
  assert summary["achieved_vs_microbench"] == pytest.approx(
      summary["achieved_gflops"] / 123.0)
