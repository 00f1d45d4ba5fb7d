"""The diagnosis of a profile folder (mpt/diagnose/profile.py) and the GPU rules
(mpt/diagnose/detectors/gpu.py) on the real captures of tests/data/gpu_captures
(see its README: V100, T4, P100 and P4 AlexNet in float32, a partial 8x V100 BERT in
float16), on GpuProfile records built here for the edges the captures lack, on an mpt
run folder holding a GPU capture, on bad input through the command line, and on a
profile a plain Keras script writes on this CPU.

The bound is checked against an independent computation from each capture's own
split and the data-sheet figures written out here.
"""

import json
import pathlib
import shutil
import subprocess

import pytest

from mpt.diagnose import diagnosis as diagnose
from mpt.diagnose import detectors
from mpt.diagnose import profile as profile_lib
from mpt.diagnose.detectors import gpu as rules
from mpt.diagnose.gpu_evidence import GpuEvidence
from mpt.diagnose.options import DiagnoseOptions
from mpt.machine import gpu_profile, gpu_specs, xspace
from mpt.records.cost import times
from mpt.records.gpu import GpuDevice, GpuProfile, Kernel, Split

from helpers import DATA, ROOT, gpu_captures, mpt_forked, script_forked

CAPTURES = gpu_captures()  # Expanded from tests/data (helpers.py).
ALEXNETS = ("v100_alexnet", "t4_alexnet", "p100_alexnet", "p4_alexnet")
# Data sheets: float16 on Tensor Cores over float32 on CUDA cores.
TC_RATIO = {"v100_alexnet": 125.0 / 15.7, "t4_alexnet": 65.0 / 8.1}


@pytest.fixture
def caps(tmp_path) -> pathlib.Path:
  """The captures, copied: diagnosing a folder writes diagnosis.json/.md into it."""
  shutil.copytree(CAPTURES, tmp_path / "caps", ignore=shutil.ignore_patterns("*.md"))
  return tmp_path / "caps"


def _profile(name: str) -> GpuProfile:
  return gpu_profile.read(gpu_profile.find_traces(CAPTURES / name)[0])


def _casts(p: GpuProfile) -> float:
  return sum(k.ms for k in p.kernels if k.family == "cast" and not k.eligible)


def _by_id(report: dict) -> dict[str, dict]:
  return {f["id"]: f for f in report["findings"]}


def _cli(*args: str) -> subprocess.CompletedProcess:
  """`python -m mpt.main ARGS` (--mode=diagnose: no supervisor), forked: its start is
  not under test."""
  return mpt_forked(*args, timeout=120)


# --- The captures ---------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(TC_RATIO))
def test_float32_on_tensor_cores_gets_the_bound_from_its_own_eligible_share(caps, name):
  p = _profile(name)
  total = p.split.total
  eligible, memory = p.split.eligible_not_tc / total, p.split.memory_bound / total
  other, on_tc = p.split.other / total, p.split.tensor_core / total
  casts = _casts(p) / total  # float32's conversions: taken as vanishing.
  after = other + (memory - casts) / 2 + eligible / TC_RATIO[name] + on_tc
  busy = p.device_busy_share
  kernel_bound, step_bound = 1 / after, 1 / ((1 - busy) + busy * after)
  report = profile_lib.diagnose(caps / name)
  found = _by_id(report)["tensor_cores_unused"]
  assert report["figures"]["bound"]["kernel"] == pytest.approx(kernel_bound)
  assert report["figures"]["bound"]["step"] == pytest.approx(step_bound)
  assert f"mixed_float16 at most {times(step_bound)} faster per step" in found["title"]
  assert f"{eligible:.1%} of {total:.1f} ms kernel time" in found["evidence"][1]
  assert f"at most {times(kernel_bound)} faster kernels" in found["evidence"][2]
  assert "a bound, not a promise" in found["evidence"][2]
  assert found["next_step"].startswith(
      'keras.mixed_precision.set_global_policy("mixed_float16")')
  assert found["based_on"] == ["gpu trace"]
  assert eligible > 0.5 and 1 < step_bound < kernel_bound


@pytest.mark.parametrize("name", ["p100_alexnet", "p4_alexnet"])
def test_gpus_without_tensor_cores_get_no_mixed_float16_speed_suggestion(caps, name):
  p = _profile(name)
  memory = p.split.memory_bound / p.split.total
  report = profile_lib.diagnose(caps / name)
  found = _by_id(report)
  assert "tensor_cores_unused" not in found
  for f in found.values():
    assert "set_global_policy" not in f["next_step"]
    assert "--policy=mixed_float16" not in f["next_step"]
  none = found["no_tensor_cores"]
  assert f"at most {times(1 / (1 - memory / 2))} here (memory-bound ops only)" in none["title"]
  assert none["next_step"].startswith("keep float32 on this GPU")
  assert report["figures"]["tensor_cores"] is False


def test_the_partial_float16_bert_capture_reads_and_says_what_is_missing(caps):
  report = profile_lib.diagnose(caps / "bert_8xv100")
  notes = " | ".join(report["notes"])
  assert notes.startswith("no summary.json: no ms/step baseline, no loss scale")
  assert "kernels on 2 of 8 GPUs" in notes and "no convolution or matmul" in notes
  assert report["figures"]["precision"] == "16-bit" and report["figures"]["gpus"] == 8
  ids = set(_by_id(report))
  assert "tensor_cores_unused" not in ids and "gpu_memory_bound" in ids
  memory = _by_id(report)["gpu_memory_bound"]
  assert "already 16-bit" in memory["evidence"][1]


def test_where_mixed_precision_cannot_help_it_says_so_first(caps):
  """The V100 idled 71% of its step: that ranks above the bound, which it caps."""
  report = profile_lib.diagnose(caps / "v100_alexnet")
  assert [f["id"] for f in report["findings"]] == ["gpu_idle", "tensor_cores_unused"]
  idle = report["findings"][0]
  assert idle["severity"] == "high" and "cannot speed that up" in idle["title"]


def test_the_four_gpus_side_by_side_one_row_each(caps, capsys):
  folders = [caps / n for n in ALEXNETS]
  result = diagnose.run(DiagnoseOptions(run=",".join(map(str, folders))))
  out = capsys.readouterr().out
  rows = [l for l in out.splitlines() if l.startswith(f"| {caps}")]
  assert len(rows) == 4 and result["status"] == "completed"
  for row, gpu, cores in zip(rows, ["V100 (7.0)", "T4 (7.5)", "P100 PCIe (6.0)",
                                    "P4 (6.1)"], ["yes", "yes", "no", "no"]):
    assert f"| {gpu} | {cores} |" in row
  assert "(memory-bound only)" in rows[2] and "(memory-bound only)" in rows[3]
  for folder, name in zip(folders, ALEXNETS):
    written = json.loads((folder / "diagnosis.json").read_text())
    assert written["kind"] == "profile"
    assert f"| {written['figures']['step_ms']:.1f} |" in rows[ALEXNETS.index(name)]


def test_autotuning_in_the_capture_is_noted(caps):
  notes = profile_lib.diagnose(caps / "t4_alexnet")["notes"]
  assert any("cuDNN's autotuning" in n for n in notes)


# --- The H200 captures: Keras on JAX, the seed convnet, three policies ----------

H200 = {p: CAPTURES / f"h200_seed_{p}" for p in ("float32", "mixed_float16",
                                                 "mixed_bfloat16")}
H200_TIMINGS = json.loads((CAPTURES / "h200_seed_timings.json").read_text())


def test_h200_float32_on_tf32_tensor_cores_is_bounded_and_the_bound_was_reached(caps):
  p = _profile("h200_seed_float32")
  total = p.split.total
  shares = [getattr(p.split, part) / total for part in
            ("eligible_not_tc", "memory_bound", "other", "tensor_core")]
  eligible, memory, other, on_tc = shares
  casts = _casts(p) / total
  # H200 (H100 SXM) data sheet: 989.5 float16 Tensor, 494.5 TF32, 67 FP32.
  after = other + (memory - casts) / 2 + eligible / (989.5 / 67) + on_tc / (989.5 / 494.5)
  report = profile_lib.diagnose(caps / "h200_seed_float32")
  found = _by_id(report)["tensor_cores_unused"]
  assert report["figures"]["bound"]["kernel"] == pytest.approx(1 / after)
  assert found["title"].startswith(f"float32 runs {on_tc:.0%} of its kernel time on "
                                   f"TF32 Tensor Cores: mixed_float16 at most")
  assert "494.5 on TF32 Tensor Cores, at most 2x" in found["evidence"][0]
  assert "most eligible time on CUDA cores: conv1" in found["evidence"][3]
  # What mixed_float16 really gained on that H200: its capture's kernel time, and
  # the step times the script measured (interleaved, after warm-up, unprofiled).
  gained = total / _profile("h200_seed_mixed_float16").split.total
  assert gained == pytest.approx(1 / after, rel=0.02)  # Reached, within 2%.
  for ms in H200_TIMINGS["ms_per_step"].values():
    assert 1.3 < ms["float32"] / ms["mixed_float16"] < 1 / after


def test_h200_bfloat16_names_the_first_convolution_that_missed_the_tensor_cores(caps):
  missed = _by_id(profile_lib.diagnose(caps / "h200_seed_mixed_bfloat16"))
  found = missed["tensor_cores_missed"]
  assert found["evidence"][1].startswith("by layer: conv1 ")
  assert "tensor_cores_missed" not in _by_id(
      profile_lib.diagnose(caps / "h200_seed_mixed_float16"))


def test_the_seed_table_across_five_gpus(caps, capsys):
  folders = [caps / n for n in ALEXNETS] + [caps / "h200_seed_float32"]
  diagnose.run(DiagnoseOptions(run=",".join(map(str, folders))))
  rows = [l for l in capsys.readouterr().out.splitlines() if l.startswith(f"| {caps}")]
  assert len(rows) == 5 and "| H200 (9.0) | yes |" in rows[4]


# --- Edges on built records -----------------------------------------------------

V100 = GpuDevice("/device:GPU:0", None, [7, 0], 80, 1530.0)


def _built(kernels: list[Kernel], device=V100, busy=0.9, **kw) -> GpuProfile:
  split = Split()
  for k in kernels:
    part = ("tensor_core" if k.tensor_core else "eligible_not_tc" if k.eligible
            else "memory_bound" if k.family in ("batchnorm", "transpose", "cast")
            else "other")
    setattr(split, part, getattr(split, part) + k.ms)
  by_family = {}
  for k in kernels:
    by_family[k.family] = by_family.get(k.family, 0.0) + k.ms
  sixteen = sum(k.ms for k in kernels if k.dtype == "float16") / split.total
  return GpuProfile("t.xplane.pb", device, 1, 10.0, busy, 0.0, 0.0, split=split,
                    by_family=by_family, kernels=kernels, sixteen_bit_share=sixteen, **kw)


def test_a_16bit_run_that_missed_the_tensor_cores_names_the_layers():
  p = _built([Kernel("h884gemm", "net/dense/MatMul", "MatMul", "matmul", "float16", 6.0,
                     tensor_core=True, eligible=True),
              Kernel("cudnn_conv", "net/conv1/Conv2D", "Conv2D", "conv", "float16", 3.0,
                     eligible=True),
              Kernel("nchwToNhwc", "net/conv1/Conv2D", "Conv2D", "transpose", "float16",
                     1.0)])
  found = rules.tensor_cores_missed(GpuEvidence(p))
  assert found.id == "tensor_cores_missed" and found.severity == "high"
  assert "net/conv1 3.00 ms (30.0%)" in found.evidence[1]
  assert "first convolution's 3 input channels" in found.evidence[3]
  assert "layout transposes: 10.0%" in found.evidence[2]
  assert rules.tensor_cores_unused(GpuEvidence(p)) is None  # Already 16-bit.
  p.kernels[1].ms = 0.7  # 0.7 of 7.7 ms: 9.1%, under the 10% of a finding.
  assert rules.tensor_cores_missed(GpuEvidence(_built(p.kernels))) is None


@pytest.mark.parametrize("busy,inputs,gaps,fires,severity", [
    (0.49, 0.0, 0.0, True, "high"), (0.50, 0.0, 0.0, False, None),
    (0.9, 0.10, 0.0, True, "medium"), (0.9, 0.20, 0.0, True, "high"),
    (0.9, 0.0, 0.25, True, "medium"), (0.9, 0.09, 0.24, False, None),
])
def test_gpu_idle_on_its_thresholds(busy, inputs, gaps, fires, severity):
  p = _built([Kernel("k", "a/MatMul", "MatMul", "matmul", "float32", 1.0,
                     eligible=True)], busy=busy)
  p.input_share, p.host_gap_share = inputs, gaps
  found = rules.idle(GpuEvidence(p))
  assert (found is not None) == fires
  if fires:
    assert found.severity == severity
    assert f"at most {times(1 / (1 - busy))} faster" in found.evidence[1]


def test_an_unknown_tensor_core_gpu_takes_the_eligible_part_as_free():
  odd = GpuDevice("/device:GPU:0", None, [8, 7], 16, 1300.0)  # Jetson Orin: no table.
  p = _built([Kernel("k", "a/MatMul", "MatMul", "matmul", "float32", 8.0, eligible=True),
              Kernel("bn", "a/bn/FusedBatchNormV3", "FusedBatchNormV3", "batchnorm",
                     "float32", 2.0)], device=odd, busy=1.0)
  g = GpuEvidence(p)
  assert g.ceiling.ratio is None and g.ceiling.tensor_cores
  assert g.bound.kernel_bound == pytest.approx(1 / (0.2 / 2))
  found = rules.tensor_cores_unused(g)
  assert "the eligible ops are taken as free" in found.evidence[0]


def test_transposes_alone_make_memory_bound_a_finding():
  p = _built([Kernel("gemm", "a/MatMul", "MatMul", "matmul", "float32", 8.5,
                     eligible=True),
              Kernel("SwapDimension1And2", "a/Transpose", "Transpose", "transpose",
                     "float32", 1.5)])
  found = rules.memory_bound(GpuEvidence(p))
  assert found and "layout transposes 15.0%" in found.evidence[2]
  p.kernels[1].ms = 0.9  # 0.9 of 9.4 ms: 9.6%, under 10%.
  assert rules.memory_bound(GpuEvidence(_built(p.kernels))) is None


@pytest.mark.parametrize("device,key", [
    (GpuDevice("g", None, [7, 0], 80, 1530.0), "V100"),
    (GpuDevice("g", None, [7, 0], 80, 1380.0), "V100 PCIe"),
    (GpuDevice("g", None, [6, 0], 56, 1328.5), "P100 PCIe"),
    (GpuDevice("g", "Tesla T4", [7, 5], 40), "T4"),
    (GpuDevice("g", "NVIDIA A100-SXM4-40GB", [8, 0], 108), "A100"),
    (GpuDevice("g", None, [8, 7], 16), None),
])
def test_gpus_are_recognised_by_name_else_by_shape(device, key):
  assert gpu_specs.identify(device)[0] == key


def test_ampere_float32_on_tensor_cores_is_bounded_by_float16_over_tf32():
  a100 = GpuDevice("/device:GPU:0", "NVIDIA A100-SXM4-80GB", [8, 0], 108)
  p = _built([Kernel("ampere_tf32", "a/MatMul", "MatMul", "matmul", "float32", 10.0,
                     tensor_core=True, eligible=True)], device=a100, busy=1.0)
  assert GpuEvidence(p).bound.kernel_bound == pytest.approx(312.0 / 156.0)


# --- An mpt run with a GPU capture ----------------------------------------------

def _gpu_run(tmp_path, capture: str, policy: str) -> pathlib.Path:
  shutil.copytree(DATA / "runs" / "f32_custom", tmp_path / "run")
  run = tmp_path / "run"
  folder = run / "plugins" / "profile" / "2020_12_22_03_42_42"
  folder.mkdir(parents=True)
  for trace in (CAPTURES / capture).glob("*.xplane.pb"):
    shutil.copy(trace, folder)
  summary = json.loads((run / "summary.json").read_text())
  summary.update(device="GPU: a capture's GPU (x1)", policy=policy)
  summary["hardware"]["gpus"] = [{"name": "GPU", "compute_capability": [6, 0]}]
  (run / "summary.json").write_text(json.dumps(summary))
  return run


def test_an_mpt_run_with_a_gpu_capture_gets_the_gpu_findings(tmp_path, capsys):
  run = _gpu_run(tmp_path, "v100_alexnet", "float32")
  report = diagnose.diagnose_run(run)
  found = _by_id(report)
  assert found["tensor_cores_unused"]["next_step"].startswith(
      f"python -m mpt.main --flagfile={run}/flags.txt --policy=mixed_float16")
  assert "--cache=memory" in found["gpu_idle"]["next_step"]
  assert report["gpu"]["gpu"] == "V100" and report["gpu"]["bound"]["step"] > 1
  # Side by side with a CPU run: the GPU run's row has its GPU, bound and own ms/step.
  shutil.copytree(DATA / "runs" / "f32_fit", tmp_path / "cpu_run")
  diagnose.run(DiagnoseOptions(run=f"{run},{tmp_path / 'cpu_run'}"))
  rows = [l for l in capsys.readouterr().out.splitlines() if l.startswith(f"| {tmp_path}")]
  ms = json.loads((run / "summary.json").read_text())["ms_per_step"]
  assert rows[0].startswith(f"| {run} | V100 (7.0) | yes |") and f"| {ms:.1f} |" in rows[0]
  assert "| CPU: " in rows[1] and "| - |" in rows[1]


def test_a_16bit_run_on_a_gpu_without_tensor_cores_supersedes_the_cc_rule(tmp_path):
  run = _gpu_run(tmp_path, "p100_alexnet", "mixed_float16")
  report = diagnose.diagnose_run(run)
  found = _by_id(report)
  assert found["no_tensor_cores"]["severity"] == "high"
  assert found["no_tensor_cores"]["next_step"].endswith("--policy=float32")
  assert "hardware" not in found and "hardware" in report["checked_clear"]
  assert set(detectors.SUPERSEDED_BY["hardware"]) == {"no_tensor_cores",
                                                      "tensor_cores_missed"}


# --- Bad input, the command line -------------------------------------------------

def _renamed_planes(path: pathlib.Path, gpu: str = "/device:NPU",
                    host: str = "/host:future") -> None:
  """A capture whose planes xprof does not know (a newer TensorFlow's, say)."""
  space = xspace.parse((CAPTURES / "p4_alexnet" / "1e6c44adc064.xplane.pb").read_bytes())
  for plane in space.planes:
    plane.name = plane.name.replace("/device:GPU:0", gpu).replace("/host:CPU", host)
    if plane.name == "/host:CPU":  # Kept: then without TensorFlow's ops.
      del plane.lines[:]
  path.write_bytes(space.SerializeToString())


@pytest.mark.parametrize("make,words", [
    (lambda d: None, "missing summary.json and flags.txt, and no profiler capture"),
    (lambda d: (d / "x.xplane.pb").write_bytes(
        (CAPTURES / "v100_alexnet" / "d1792a5a2842.xplane.pb").read_bytes()[:5000]),
     "is not a readable profiler capture"),
    (lambda d: _renamed_planes(d / "new.xplane.pb", "/device:NPU:0"),
     "has no GPU plane and no TensorFlow op xprof can read (planes: /device:NPU:0, "
     "/host:future): a capture from a newer TensorFlow/xprof"),
    # JAX's planes on a CPU: XLA's module protos in /host:metadata, no TF ops.
    (lambda d: _renamed_planes(d / "jax.xplane.pb", "/host:metadata", "/host:CPU"),
     "a JAX (XLA) capture of a CPU run"),
])
def test_bad_profile_folders_are_one_line_and_exit_2(tmp_path, make, words):
  folder = tmp_path / "prof" / "plugins" / "profile" / "2024_01_01_00_00_00"
  folder.mkdir(parents=True)
  make(folder)
  proc = _cli("--mode=diagnose", f"--run={tmp_path / 'prof'}")
  assert proc.returncode == 2, proc.stdout
  errors = [l for l in proc.stderr.splitlines() if l.startswith("mpt: error:")]
  assert len(errors) == 1 and words in errors[0], proc.stderr
  assert proc.stdout == ""


def test_a_converter_that_dies_is_one_line_and_exit_2(caps):
  """xprof's C++ aborting on a capture: the child's death, one line, not a crash."""
  child = ('import os, sys; sys.stderr.write("F0101 check.cc:1] Check failed: '
           'plane\\n"); os.abort()')
  script = caps.parent / "dies.py"
  script.write_text(
      "import sys; from mpt.machine import traces; traces.child_command = "
      f"lambda: [sys.executable, '-c', {child!r}]; from mpt import main; main.run()")
  proc = script_forked(script, "--mode=diagnose", f"--run={caps / 'p4_alexnet'}",
                       cwd=ROOT, timeout=120)  # Its start is not under test.
  assert proc.returncode == 2, proc.stderr
  [line] = [l for l in proc.stderr.splitlines() if l.startswith("mpt: error:")]
  assert "xprof's converter died" in line and "SIGABRT" in line
  assert "Check failed: plane" in line


# --- A plain Keras script's profile, on this CPU --------------------------------

KERAS_SCRIPT = """
import sys
import numpy as np
import keras
x = np.random.rand(64, 16, 16, 3).astype("float32")
y = np.random.randint(0, 4, 64)
model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=8, epochs=1, verbose=0,
          callbacks=[keras.callbacks.TensorBoard(sys.argv[1], profile_batch=(2, 3))])
"""


def test_a_plain_keras_scripts_profile_is_diagnosed(tmp_path):
  logdir = tmp_path / "logs"
  script = tmp_path / "plain.py"
  script.write_text(KERAS_SCRIPT)
  made = script_forked(script, str(logdir), cwd=tmp_path, timeout=120)  # Start untested.
  assert made.returncode == 0, made.stderr[-2000:]
  proc = _cli("--mode=diagnose", f"--run={logdir}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "a profile folder: CPU capture train/plugins/profile/" in proc.stdout
  assert "note: no summary.json: no ms/step baseline, no loss scale" in proc.stdout
  assert "a CPU-only capture (no GPU plane)" in proc.stdout
  assert "Conv2D" in proc.stdout
  written = json.loads((logdir / "diagnosis.json").read_text())
  assert written["kind"] == "profile" and written["figures"]["capture"] == "CPU"
