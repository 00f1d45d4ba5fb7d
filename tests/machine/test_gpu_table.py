"""The kernel table on a GPU (mpt/machine/gpu_table.py) and where it goes: built from
the real H200 captures (tests/data/gpu_captures/h200_seed_*: the seed convnet under
each policy), read by the verdict before step 1 and by --policy=auto's table, and made
by mpt/train/before_step1/cost.py, which profiles each policy's step on a GPU: on this CPU its
capture has no GPU plane, and it says so instead of failing the run.
"""

import dataclasses
import json

import pytest

from mpt import config
from mpt.machine import fastpath, gpu_profile, gpu_table, hardware, kernels
from mpt.records.cost import Cost, PolicyCost
from mpt.train.before_step1 import autopolicy, cost, gpu_steps
from mpt.train.common import model, precision

from helpers import gpu_captures

CAPTURES = gpu_captures()  # Expanded from tests/data (helpers.py).
TIMED = json.loads((CAPTURES / "h200_seed_timings.json").read_text())["ms_per_step"]
FAMILIES = fastpath.families_of(["Conv2D", "BatchNormalization", "Dense"])
HOPPER = [(9, 0)]


@pytest.fixture(scope="module")
def h200():
  return {p: gpu_profile.read(CAPTURES / f"h200_seed_{p}" / "h200.xplane.pb")
          for p in config.POLICY_DTYPE}


def test_the_table_keeps_every_kernel_and_names_the_layers_on_cuda_cores(h200):
  table = gpu_table.table(h200, 3, "H200")
  for policy, profile in h200.items():  # Nothing lost: per step, all families.
    rows = [r for r in table.rows if r.dtype == config.POLICY_DTYPE[policy]]
    assert 3 * sum(r.ms for r in rows) == pytest.approx(profile.split.total, rel=1e-3)
  conv = {r.dtype: r for r in table.rows if r.family == "conv"}
  # What the kernel names showed (tests/machine/test_h200_captures.py): float16 all
  # on Tensor Cores, bfloat16's conv1 forward on cuDNN's CUDA-core engine.
  assert conv["float16"].tensor_core == 1.0 and conv["float16"].layers == []
  assert conv["bfloat16"].layers == ["conv1"] and conv["bfloat16"].cuda_cores_ms > 0
  assert conv["float16"].ratio == pytest.approx(conv["float16"].ms / conv["float32"].ms,
                                                rel=1e-3)
  assert conv["float32"].ratio == 1.0
  assert "mixed_bfloat16 86% (CUDA cores: conv1), mixed_float16 100%" in \
      gpu_table.one_line(table)


def test_the_verdict_before_step_1_names_the_layers_that_missed_the_tensor_cores(h200):
  table = gpu_table.table(h200, 3, "H200").as_table()
  def verdict(policy, step_ms=TIMED["128"]):
    return fastpath.verdict(policy, table, FAMILIES, set(), HOPPER, "", step_ms)
  bf16, f16, f32 = verdict("mixed_bfloat16"), verdict("mixed_float16"), verdict("float32")
  assert bf16.evidence == "cost" and not bf16.slow and bf16.fastest == "mixed_float16"
  assert bf16.text.startswith(
      "mixed_bfloat16: 14% of its convolution and matmul kernel time ran on CUDA cores, "
      "not Tensor Cores (conv1)")
  assert bf16.cuda_cores_layers == ["conv1"]
  assert f16.text is None and f16.cuda_cores_share == 0.0
  assert f32.text is None and f32.cuda_cores_share is None
  # Without the step timed, the table's kernel times decide (not the flags).
  probe = verdict("mixed_float16", None)
  rows = [r for r in table["rows"] if r["op"] in ("conv", "matmul")]
  ms = {d: sum(r["ms"] for r in rows if r["dtype"] == d) for d in ("float32", "float16")}
  assert probe.evidence == "probe"
  assert probe.ratio == pytest.approx(ms["float16"] / ms["float32"])


def _cost(h200) -> Cost:
  return Cost({}, None, 128, [PolicyCost(p, ms) for p, ms in TIMED["128"].items()],
              gpu_kernels=gpu_table.table(h200, 3, "H200"))


def test_on_a_gpu_the_warning_reads_the_models_table_not_the_cpus(h200, monkeypatch,
                                                                   capsys):
  monkeypatch.setattr(hardware, "gpu_compute_capabilities", lambda: HOPPER)
  monkeypatch.setattr(kernels, "table", lambda: pytest.fail("the CPU's table probed"))
  found = precision.check_speed("mixed_bfloat16", ["Conv2D", "Dense"], _cost(h200))
  out = capsys.readouterr().out
  assert out.count("WARNING:") == 1 and "Tensor Cores (conv1)" in out
  assert found.source == "measured"  # The step's cost record's own source.
  assert precision.check_speed("mixed_float16", ["Conv2D"], _cost(h200)).text is None
  # A GPU without the model's table: the flags speak, still no CPU probe.
  untabled = dataclasses.replace(_cost(h200), gpu_kernels=None, policies=[])
  assert precision.check_speed("mixed_float16", ["Conv2D"], untabled).evidence == "flags"


def test_auto_shows_each_candidates_tensor_cores(h200):
  # The measurement's rows, with the GPU's kernel table: nothing trains.
  chosen, _, choice = autopolicy.choose(_cost(h200))
  text = autopolicy.format_table(choice)
  lines = {l.split("|")[1].strip(): l for l in text.splitlines()[1:]
           if l.startswith("|")}
  assert "on Tensor Cores" in text.splitlines()[0]
  assert "| 100% |" in lines["mixed_float16"]
  assert lines["mixed_bfloat16"].endswith("| 86% | CUDA cores: conv1 |")
  fastest = min(TIMED["128"], key=TIMED["128"].get)
  assert chosen == fastest and "| chosen |" in lines[fastest]


def _tiny():
  cfg = config.Config(image_size=16, batch_size=8)
  return cfg, lambda: model.build_model(cfg, 10)


def test_measure_profiles_each_policys_step_on_a_gpu(h200, monkeypatch):
  """The wiring, on this CPU: each policy's real step runs under the profiling call;
  the capture read stands in with the H200's (this machine has no GPU)."""
  ran = []
  def profiled(step, folder):
    ran.append(folder.name)
    step()
    return h200[folder.name]
  monkeypatch.setattr(gpu_steps, "_profiled", profiled)
  cfg, build = _tiny()
  found = cost.measure(cfg, build, gpu=True,
                       table=lambda families: None)  # A GPU reads no CPU table.
  assert ran == list(config.POLICY_DTYPE) and found.gpu_kernels.device == "H200"
  table = found.gpu_kernels
  assert table.steps == gpu_steps.PROFILED_STEPS
  for policy, profile in h200.items():  # Each policy's capture, per profiled step.
    rows = [r for r in table.rows if r.dtype == config.POLICY_DTYPE[policy]]
    assert table.steps * sum(r.ms for r in rows) == pytest.approx(profile.split.total,
                                                                  rel=1e-3)
  conv = {r.dtype: r for r in table.rows if r.family == "conv"}
  assert conv["float16"].tensor_core == 1.0 and conv["bfloat16"].layers == ["conv1"]
  assert any("read from the kernel names" in n for n in found.gpu_kernels.notes)
  assert Cost.from_dict(found.to_dict()) == found  # cost.json keeps it, typed.
  assert cost.measure(cfg, build, ["float32"]).gpu_kernels is None  # No GPU here.


def test_a_profile_without_a_gpu_plane_is_a_note_not_a_failure(tmp_path):
  """The real profiler on this CPU's step: its capture has no GPU kernels to read."""
  cfg, build = _tiny()
  found = cost.measure(cfg, build, ["float32"], gpu=True)
  assert found.of("float32").ms_per_step and found.gpu_kernels is None
  assert found.gpu_kernels_note.startswith(
      "the kernel table on this GPU was not read (float32): ")
  assert "no GPU in the capture (a CPU-only trace)" in found.gpu_kernels_note
