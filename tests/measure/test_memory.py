"""Memory (mpt/measure/memory.py): the estimate's arithmetic on a hand-computed case,
the available memory (its stand-in, a GPU's by NVML), the estimate beside the measured
peak in a child process, and a death by signal ending in summary.json. The preflight
that acts on the estimate: tests/train/before_step1/test_preflight.py."""

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT, SMALL_REPORT as REPORT, TINY_FLAGS, mpt_forked
from mpt.errors import UserError
from mpt.measure import memory

MB = 2**20


def test_the_estimate_adds_up_by_hand():
  est = memory.estimate(REPORT, "mixed_bfloat16", 4, baseline_mb=100.0,
                        trainable_params=900)
  assert est.parameters_mb * MB == 4 * 1000      # float32 variables
  assert est.gradients_mb * MB == 4 * 900        # a float32 gradient per trainable
  assert est.optimizer_mb * MB == 2 * 4 * 900    # Adam's two slots
  assert est.weight_copies_mb * MB == 2 * 900    # the bfloat16 casts of the weights
  # (100 x 2 bytes + 10 x 4 bytes) x the factor; the input: 8*8*3 float32 x 3 batches.
  assert est.activations_mb_per_example * MB == pytest.approx(
      240 * memory.ACTIVATION_FACTOR)
  assert est.input_mb_per_example * MB == 8 * 8 * 3 * 4 * (1 + memory.PREFETCH)
  fixed = 100 + (4000 + 3600 + 7200 + 1800) / MB
  per_example = (240 * memory.ACTIVATION_FACTOR + 2304) / MB
  assert est.total_mb == pytest.approx(fixed + 4 * per_example)
  # Inverted: the batch that fills 1 MB beyond the fixed part.
  assert memory.largest_batch(est, fixed + 1.0) == int(1.0 // per_example)
  # The same report under float32: no weight copies, 4 bytes for every output; and
  # under mixed_float16, 2 bytes where the layer follows the policy.
  f32 = memory.estimate(REPORT, "float32", 4, 100.0, 900)
  assert f32.weight_copies_mb == 0 and f32.activations_mb_per_example * MB == \
      pytest.approx(440 * memory.ACTIVATION_FACTOR)
  f16 = memory.estimate(REPORT, "mixed_float16", 4, 100.0, 900)
  assert f16.activations_mb_per_example == est.activations_mb_per_example
  # Emulated 16-bit kernels (float32 working copies): every output at 4 bytes, the
  # rest as before; float32 itself is unchanged by the flag.
  emulated = memory.estimate(REPORT, "mixed_bfloat16", 4, 100.0, 900,
                             emulated_16bit=True)
  assert emulated.emulated_16bit and not est.emulated_16bit
  assert emulated.activations_mb_per_example * MB == pytest.approx(
      440 * memory.ACTIVATION_FACTOR)
  assert emulated.weight_copies_mb == est.weight_copies_mb
  assert memory.estimate(REPORT, "float32", 4, 100.0, 900, True) == f32


def test_the_available_memory_stand_in(monkeypatch):
  monkeypatch.setenv("MPT_AVAILABLE_MB", "1234.5")
  assert memory.available_mb() == (1234.5, "available (MPT_AVAILABLE_MB stand-in)")
  assert memory.available_mb(gpu=True)[0] == 1234.5
  for bad in ("lots", "-1", "nan"):
    monkeypatch.setenv("MPT_AVAILABLE_MB", bad)
    with pytest.raises(UserError, match=r"^MPT_AVAILABLE_MB=.*: expected a number of "
                                        r"MiB >= 0$"):
      memory.available_mb()


def _host() -> str:
  """This machine's CPU, named in a failure: the measured peak is its allocator's."""
  try:
    names = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
             if l.startswith("model name")]
  except OSError:
    names = []
  return f"host: {names[0] if names else 'unknown CPU'}, {os.cpu_count()} logical cores"


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("model,opts", [("seed_convnet", ""),
                                        ("resnet", "depth=10,width=16")])
def test_the_estimate_follows_the_measured_peak(tmp_path, model, opts, policy):
  """Batch 16 and 1024 at 32 px, each run in a process of its own (forked from a server
  that has imported TensorFlow and run nothing: in a shared one, memory an earlier run
  freed stays resident and hides the next run's growth). summary.json has the
  estimate beside the measured peak, and the step's part of each (beyond the
  baseline measured before step 1) grows with the batch.

  How close the estimate comes is the host's: its allocator, oneDNN's scratch memory,
  its threads. experiments/bench_memory.py measures it (the step part at batch 1024:
  0.69-0.98 of the measured one on an AMD Zen 4; 0.72-1.2 on a 2-core AMD EPYC,
  oneDNN's rewrite on and off), and the diagnosis flags a gap over 30% as a finding
  of its own. Here it must come within a factor of 2 on any host: still short of an
  estimate without the activations (~0.2), or without the batch, or in wrong units."""
  flags = [f for f in TINY_FLAGS if not f.startswith(("--batch_size", "--image_size"))]
  step = {}
  for batch in (16, 1024):
    name = f"{model}_{policy}_{batch}"
    proc = mpt_forked(
        *flags, f"--model={model}", f"--model_opts={opts}", f"--policy={policy}",
        f"--batch_size={batch}", "--image_size=32", "--epochs=1", "--steps_per_epoch=2",
        "--warmup_steps=0", "--checkpoint=false", f"--data_dir={tmp_path}",
        f"--logdir={tmp_path}/logs", f"--run_name={name}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads((tmp_path / "logs" / name / "summary.json").read_text())["memory"]
    est, peak, base = m["estimate"]["total_mb"], m["peak_rss_mb"], \
        m["estimate"]["baseline_mb"]
    assert m["estimate_over_measured"] == pytest.approx(est / peak, abs=1e-3)
    assert m["available"] == "available (MPT_AVAILABLE_MB stand-in)"  # Not the host's.
    step[batch] = (est - base, peak - base)
  (est16, peak16), (est1024, peak1024) = step[16], step[1024]
  assert 0 < est16 < est1024 and 0 < peak16 < peak1024, (step, _host())
  assert 0.5 < est1024 / peak1024 < 2.0, (step, _host())


@pytest.mark.parametrize("env,status,code,why", [
    ({"MPT_INJECT_FAULT": "kill:4"}, "oom", 4,
     "the training process died of SIGKILL while training: the kernel counted an OOM kill"),
    ({"MPT_INJECT_FAULT": "oom:4"}, "oom", 4, "mpt: out of memory at step 1: "),
    ({"MPT_KILL_AT": "end:1"}, "interrupted", 137,
     "the training process was killed (SIGKILL) from outside mpt, not by the kernel's "
     "OOM killer"),
])
def test_a_death_of_memory_ends_in_summary_json_and_one_line(tmp_path, env, status, code,
                                                             why):
  """SIGKILL (the kernel's OOM killer: the session's stand-in counters count it,
  conftest.py) and TF's ResourceExhaustedError, injected right before the first step:
  status `oom`, exit 4, and mpt's line is the last word. A SIGKILL the counters did not
  count (MPT_KILL_AT) came from outside: `interrupted`, resumable."""
  proc = subprocess.run(
      [sys.executable, "-m", "mpt.main", *TINY_FLAGS, f"--data_dir={tmp_path}",
       f"--logdir={tmp_path}/logs"], cwd=ROOT, capture_output=True, text=True,
      timeout=300, env={**os.environ, **env})
  assert proc.returncode == code, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert why in last and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  [run_dir] = [p for p in (tmp_path / "logs").iterdir() if p.is_dir()]
  summary = json.loads((run_dir / "summary.json").read_text())
  assert summary["status"] == status and why.removeprefix("mpt: ") in \
      (summary["message"] or ""), summary["message"]
  assert (tmp_path / "logs" / "runs.csv").read_text().count(f",{status},") == 1
  if status == "interrupted":
    assert f"--resume={run_dir}" in summary["message"]


def test_a_gpus_free_memory_comes_from_nvml(monkeypatch):
  monkeypatch.delenv("MPT_AVAILABLE_MB")  # The session's stand-in (conftest.py) wins.
  class Info:
    free, total = 3 * 2**30, 16 * 2**30
  fake = type(sys)("pynvml")
  fake.nvmlInit = lambda: None
  fake.nvmlDeviceGetHandleByIndex = lambda i: i
  fake.nvmlDeviceGetMemoryInfo = lambda h: Info()
  monkeypatch.setitem(sys.modules, "pynvml", fake)
  assert memory.available_mb(gpu=True) == (3 * 1024.0,
                                           "free on GPU 0 (16 GiB total, NVML)")
  monkeypatch.setitem(sys.modules, "pynvml", None)  # Not installed: host RAM, said so.
  mb, where = memory.available_mb(gpu=True)
  assert mb > 0 and where.endswith("the GPU's memory is unknown without nvidia-ml-py)")
