"""The memory preflight (mpt/train/before_step1/preflight.py): the estimate per policy as this
process's TensorFlow runs it, the refusal of a batch that will not fit (one line,
exit 2, the largest batch per policy, no run folder left), replicas sharing the
host, and `--mode=inspect`'s table. What is available is always stated
(`MPT_AVAILABLE_MB` or an argument), never the host's free RAM. The estimate's own
arithmetic and the measured peak: tests/measure/test_memory.py."""

import json
import pathlib
import re

import pytest

from helpers import SMALL_REPORT as REPORT, TINY_FLAGS, mpt_forked
from mpt import config
from mpt.measure import memory
from mpt.train.before_step1 import preflight


@pytest.mark.parametrize("rewrite_on", [True, False])
def test_the_run_estimates_follow_this_processs_onednn_rewrite(monkeypatch, rewrite_on):
  """Not the CPU flags (a stand-in may name them): whether TF runs its Eigen kernels
  here. On a GPU nothing is emulated whatever the CPU does."""
  from mpt.train.common import keras_fit
  monkeypatch.setattr(keras_fit, "onednn_rewrite_on", lambda: rewrite_on)
  ests = preflight.estimates(REPORT, 4, 900, 100.0)
  assert ests["mixed_bfloat16"].emulated_16bit is (not rewrite_on)
  assert ests["mixed_float16"].emulated_16bit is (not rewrite_on)
  assert not ests["float32"].emulated_16bit
  assert not preflight.estimates(REPORT, 4, 900, 100.0, gpu=True)[
      "mixed_bfloat16"].emulated_16bit


def test_preflight_refuses_with_the_largest_batch_per_policy():
  ests = {p: memory.estimate(REPORT, p, 10**6, 100.0, 900) for p in config.POLICY_DTYPE}
  with pytest.raises(preflight.WillNotFit) as e:
    preflight.check("float32", ests, force=False, available_mb=500.0, where="free")
  line = str(e.value)
  assert "\n" not in line and line.startswith("memory: batch 1000000 under float32 "
                                              "needs ~")
  assert "500 MiB free; largest batch that fits: " in line
  # The oracle: the largest batch whose whole estimate (memory.estimate, checked by
  # hand in tests/measure/test_memory.py) stays within the 500 MiB free plus the
  # 100 MiB baseline already in use, found by search, not by the formula the
  # message uses (memory.largest_batch).
  fits = {p: _largest(lambda n: memory.estimate(REPORT, p, n, 100.0, 900).total_mb
                      <= 600.0) for p in config.POLICY_DTYPE}
  for p, n in fits.items():
    assert f"~{n} under {p}" in line
  assert fits["mixed_bfloat16"] > fits["float32"]  # 16-bit activations: more fit.
  assert preflight.check("float32", ests, force=True, available_mb=500.0,
                         where="free").startswith("WARNING: memory: ")
  assert preflight.check("float32", {p: memory.estimate(REPORT, p, 4, 100.0, 900)
                                     for p in config.POLICY_DTYPE},
                         force=False, available_mb=500.0) is None


def _largest(fits) -> int:
  """The largest n >= 0 with fits(n), for a fits() true up to some n and false after."""
  low, high = 0, 1
  while fits(high):
    low, high = high, high * 2
  while high - low > 1:
    mid = (low + high) // 2
    low, high = (mid, high) if fits(mid) else (low, mid)
  return low


def test_a_batch_that_cannot_fit_stops_before_training(tmp_path):
  """The user's command (64 px, the default size), on tiny data, with 2 GiB standing
  in for what the host has free, whatever its RAM."""
  flags = [f for f in TINY_FLAGS if not f.startswith(("--batch_size", "--image_size"))]
  proc = mpt_forked(*flags, "--batch_size=4096", "--epochs=1", f"--data_dir={tmp_path}",
                    f"--logdir={tmp_path}/logs", env={"MPT_AVAILABLE_MB": "2048"})
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [l for l in proc.stderr.splitlines() if l.startswith("mpt: error")]
  assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert errors[0].startswith("mpt: error: memory: batch 4096 under float32 needs ~")
  assert "2.0 GiB available (MPT_AVAILABLE_MB stand-in)" in errors[0]
  fits = dict((p, int(n)) for n, p in re.findall(
      r"~(\d+) under (\S+?)(?:,| \(|$)", errors[0].split("largest batch that fits:")[1]))
  assert set(fits) == set(config.POLICY_DTYPE) and 0 < fits["float32"] < 4096, errors
  assert not [p for p in (tmp_path / "logs").glob("*") if p.is_dir()]  # No folder left.
  # A stand-in that is no number: one line, exit 2, no folder either.
  bad = mpt_forked(*flags, "--epochs=1", f"--data_dir={tmp_path}",
                   f"--logdir={tmp_path}/logs", env={"MPT_AVAILABLE_MB": "lots"})
  errors = [l for l in bad.stderr.splitlines() if l.startswith("mpt: error")]
  assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
  assert errors == ["mpt: error: MPT_AVAILABLE_MB='lots': expected a number of MiB "
                    ">= 0"], bad.stderr[-2000:]
  assert not [p for p in (tmp_path / "logs").glob("*") if p.is_dir()]


@pytest.mark.parametrize("rewrite_on", [True, False])
def test_inspect_reports_the_estimate_per_policy(tmp_path, monkeypatch, rewrite_on):
  """Whatever this host's TensorFlow does: with oneDNN's rewrite on, 16-bit
  activations take half float32's memory; with it off (Eigen's emulated kernels,
  float32 working copies), as much."""
  from mpt import config
  from mpt.train.cli import dryrun
  from mpt.train.common import keras_fit
  monkeypatch.setattr(keras_fit, "onednn_rewrite_on", lambda: rewrite_on)
  result = dryrun.inspect_only(config.Config(image_size=32, batch_size=64,
                                             logdir=str(tmp_path)))
  mem = json.loads((pathlib.Path(result["run_dir"]) / "memory.json").read_text())
  assert set(mem["policies"]) == set(config.POLICY_DTYPE) and mem["batch_size"] == 64
  f32, bf16 = mem["policies"]["float32"], mem["policies"]["mixed_bfloat16"]
  assert bf16["emulated_16bit"] is (not rewrite_on)
  share = 0.5 if rewrite_on else 1.0  # All but the float32 output.
  assert bf16["activations_mb_per_example"] == pytest.approx(
      f32["activations_mb_per_example"] * share, rel=0.05)
  if rewrite_on:  # 16-bit activations: more fit.
    assert bf16["largest_batch"] > f32["largest_batch"] > 0
  else:  # The same activations, and the 16-bit weight copies besides.
    assert 0 < bf16["largest_batch"] <= f32["largest_batch"]


def test_replicas_sharing_the_host_and_global_batches():
  """Two logical CPU devices draw on one host's RAM: half the room each, and the
  message speaks of global batches (2 replicas x the per-replica one)."""
  ests = {p: memory.estimate(REPORT, p, 5 * 10**5, 100.0, 900)
          for p in config.POLICY_DTYPE}
  one = {p: memory.largest_batch(e, 500.0 + 100.0) for p, e in ests.items()}
  shared = {p: memory.largest_batch(e, 250.0 + 100.0) for p, e in ests.items()}
  with pytest.raises(preflight.WillNotFit) as e:
    preflight.check("float32", ests, False, 500.0, "free", sharing=2, replicas=2)
  assert str(e.value).startswith("memory: batch 1000000 under float32 needs ~")
  assert f"~{shared['float32'] * 2} under float32" in str(e.value)
  assert shared["float32"] < one["float32"]
