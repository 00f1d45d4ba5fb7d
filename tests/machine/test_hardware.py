"""Where mpt's CPU facts come from, and the peak and device name built on them (the
per-cycle rule itself: test_microbench); GPU data-sheet peaks by exact model; the
measured ceilings that judge a peak estimate; the GPU kernel table from xprof."""

import json
import os
import pathlib

import pytest

from mpt.machine import ceilings
from mpt.machine import gpu_kernels
from mpt.machine import hardware
from mpt.machine import isa

from helpers import CPUINFO, CPUINFO_FIXTURES, DATA

SPR_MICROBENCH = DATA / "microbench" / "intel_spr_amx_microbench.json"
GPU = DATA / "gpu"


@pytest.mark.parametrize("name", CPUINFO_FIXTURES)
def test_mpt_cpuinfo_stands_in_for_the_host(monkeypatch, name):
  path = CPUINFO / name
  monkeypatch.setenv("MPT_CPUINFO", str(path))
  recorded = isa.parse_cpuinfo(path.read_text())
  cpu = isa.detect()
  assert cpu.source == str(path)
  assert (cpu.name, cpu.flags, cpu.logical_cpus) == (
      recorded.name, recorded.flags, recorded.logical_cpus)
  assert hardware.cpu_flags() == recorded.flags and hardware.cpu_name() == recorded.name
  peak, source = hardware.peak_gflops("float32")
  expected = isa.peak_gflops(recorded, "float32")
  assert (peak, source) == (expected["gflops"], f"estimate: {expected['assumptions']}")
  # The session hides GPUs (conftest.py), so the device is the stand-in CPU.
  assert hardware.device_name() == (
      f"CPU: {recorded.name} ({os.cpu_count()} logical cores)")


@pytest.mark.skipif(not pathlib.Path("/proc/cpuinfo").is_file(),
                    reason="no /proc/cpuinfo on this host (not Linux)")
def test_without_mpt_cpuinfo_the_host_is_read(monkeypatch):
  """The one test that reads this machine's own CPU facts."""
  monkeypatch.delenv("MPT_CPUINFO", raising=False)
  cpu = isa.detect()
  assert cpu.source == "/proc/cpuinfo"
  assert cpu.logical_cpus >= 1 and cpu.name


def test_an_unreadable_mpt_cpuinfo_falls_back_and_says_so(monkeypatch, tmp_path):
  monkeypatch.setenv("MPT_CPUINFO", str(tmp_path / "missing"))
  cpu = isa.detect()
  assert f"{tmp_path / 'missing'} not readable" in cpu.source
  assert cpu.flags == isa.numpy_features()


# --- GPU data sheets: the exact model, never a substring of another's name ---

@pytest.mark.parametrize("name,model", [
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA A100-PCIE-40GB", "A100 PCIe"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe"), ("Tesla V100-SXM2-16GB", "V100"),
    ("Tesla V100-PCIE-32GB", "V100 PCIe"), ("Tesla T4", "T4"), ("NVIDIA L4", "L4"),
    ("NVIDIA L40", "L40"), ("NVIDIA L40S", "L40S"), ("NVIDIA A10G", "A10G"),
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"), ("NVIDIA H200", "H200"), ("NVIDIA B200", "B200"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("NVIDIA TITAN Xp", "TITAN Xp"),
    ("Quadro M2200", "M2200"), ("NVIDIA A100X", "A100X"), ("NVIDIA", ""),
])
def test_device_names_reduce_to_their_model(name, model):
  assert hardware.gpu_model(name) == model


def test_every_data_sheet_entry_is_reachable_from_a_device_name():
  for key in hardware.GPU_PEAK_TFLOPS:
    assert hardware.gpu_model(f"NVIDIA {key}") == key


@pytest.mark.parametrize("name,dtype,tflops,key", [
    # L40S is not L4, nor L40 (a substring match took "L4" for all three).
    ("NVIDIA L40S", "bfloat16", 362.05, "L40S"),
    ("NVIDIA L40S", "float32", 183.0, "L40S"),
    ("NVIDIA L40", "bfloat16", 181.05, "L40"), ("NVIDIA L4", "bfloat16", 121.0, "L4"),
    ("NVIDIA H100 80GB HBM3", "float16", 989.5, "H100"),
    ("NVIDIA H100 PCIe", "float16", 756.5, "H100 PCIe"),
    ("NVIDIA H200", "bfloat16", 989.5, "H200"),
    ("NVIDIA B200", "bfloat16", 2250.0, "B200"),
    ("Tesla V100-SXM2-16GB", "float16", 125.0, "V100"),
    ("Tesla V100-PCIE-16GB", "float16", 112.0, "V100 PCIe"),
    ("NVIDIA A100-SXM4-40GB", "float32", 156.0, "A100"),  # TF32, TensorFlow's default
])
def test_data_sheet_peaks_by_exact_model(name, dtype, tflops, key):
  found, source = hardware.gpu_peak_tflops(name, dtype)
  assert found == tflops
  assert source.startswith(f"data sheet: {key} {dtype}")


def test_without_tf32_float32_is_the_fp32_units_rate():
  assert hardware.gpu_peak_tflops("NVIDIA A100-SXM4-40GB", "float32", tf32=False) == (
      19.5, "data sheet: A100 float32_fp32")
  # Pre-Ampere parts have one float32 rate either way.
  assert hardware.gpu_peak_tflops("Tesla T4", "float32", tf32=False)[0] == 8.1


@pytest.mark.parametrize("name,dtype,words", [
    ("NVIDIA GeForce RTX 4090", "float16", "model 'RTX 4090' is not in the table"),
    ("NVIDIA H200 NVL", "bfloat16", "model 'H200 NVL' is not in the table"),
    ("NVIDIA A100X", "float16", "model 'A100X' is not in the table"),
    ("Tesla V100-SXM2-16GB", "bfloat16", "no data-sheet figure for bfloat16"),
])
def test_unknown_models_and_unlisted_dtypes_have_no_peak_and_say_why(name, dtype, words):
  found, reason = hardware.gpu_peak_tflops(name, dtype)
  assert found is None
  assert reason.startswith("no data-sheet figure") and words in reason


def test_approximate_figures_say_so():
  assert "approximate" in hardware.gpu_peak_tflops("NVIDIA A10G", "float16")[1]


def test_peak_gflops_on_a_gpu_machine_uses_the_data_sheet_for_every_gpu(monkeypatch):
  import tensorflow as tf
  fake = [tf.config.PhysicalDevice(name=f"/physical_device:GPU:{i}", device_type="GPU")
          for i in range(2)]
  monkeypatch.setattr(tf.config, "list_physical_devices",
                      lambda kind=None: fake if kind == "GPU" else [])
  monkeypatch.setattr(tf.config.experimental, "get_device_details",
                      lambda device: {"device_name": "NVIDIA L40S"})
  assert hardware.peak_gflops("float16") == (2 * 362.05e3, "data sheet: L40S float16")


# --- Ceilings: the best measured rate judges the estimate ---

def test_recorded_sapphire_rapids_estimates_are_flagged_both_ways():
  found = ceilings.ceilings(json.loads(SPR_MICROBENCH.read_text()))
  f32, bf16, f16 = found["float32"], found["bfloat16"], found["float16"]
  # float32: TensorFlow's conv2d beat the "theoretical peak" (the reported clock).
  assert f32["verdict"] == "unreliable estimate" and f32["measured_share"] > 1
  assert f32["practical_op"] == "conv2d" and "beats it" in f32["why"]
  # bfloat16: AMX's 1024 multiply-adds/cycle are nowhere near reached (> 4x short).
  assert bf16["verdict"] == "unreliable estimate" and bf16["measured_share"] < 0.25
  assert "misses it by 5.7x" in bf16["why"]
  assert f16["verdict"] == "plausible" and f16["practical_op"] == "matmul"
  # Per op type, TensorFlow's best only (numpy's float32 matmul is not a TF rate).
  assert f32["by_op"] == {"matmul": {"gflops": pytest.approx(340.63, abs=0.01),
                                     "size": 2048},
                          "conv2d": {"gflops": pytest.approx(348.36, abs=0.01),
                                     "size": "8x56x56x64->64 k3"}}
  assert f32["estimate_gflops"] == 332.8 and f32["device"] == "cpu"
  assert "FLOP/cycle" in f32["estimate_source"]


@pytest.mark.parametrize("estimate,measured,word", [
    (100.0, 100.0, "plausible"), (100.0, 100.1, "unreliable estimate"),
    (100.0, 25.0, "plausible"), (100.0, 24.9, "unreliable estimate"),
    (None, 50.0, "no estimate"), (100.0, None, "not measured"),
])
def test_verdict_thresholds(estimate, measured, word):
  assert ceilings.verdict(estimate, measured, "matmul")[0] == word


def test_with_a_gpu_the_data_sheet_is_the_estimate():
  results = {"gpus": [{"name": "NVIDIA L40S"}], "peak": {"bfloat16": {"gflops": 1.0}},
             "throughput": [{"op": "matmul", "lib": "tensorflow", "dtype": "bfloat16",
                             "size": 4096, "gflops": 250e3}]}
  found = ceilings.ceilings(results)["bfloat16"]
  assert found["estimate_gflops"] == pytest.approx(362.05e3) and found["device"] == "gpu"
  assert found["estimate_source"] == "data sheet: L40S bfloat16"
  assert found["verdict"] == "plausible"


def test_results_without_measurements_have_no_ceilings():
  assert ceilings.ceilings({}) == {}
  found = ceilings.ceilings({"peak": {"float32": {"gflops": None, "assumptions": "x"}}})
  assert found["float32"]["verdict"] == "not measured"
  assert found["float32"]["practical_gflops"] is None


# --- The GPU kernel table from xprof's kernel_stats ---

@pytest.mark.parametrize("fixture", ["kernel_stats_synthetic.json",
                                     "kernel_stats_synthetic.csv"])
def test_kernel_stats_rows(fixture):
  table = gpu_kernels.parse((GPU / fixture).read_bytes())
  assert table["note"] is None
  rows = {(r["op"], r["kernel"][:24]): r for r in table["rows"]}
  assert len(table["rows"]) == 8
  wgrad = rows[("gradient_tape/model/conv2d_1/Conv2D/Conv2DBackpropFilter",
                "void cudnn::cnn::wgrad_a")]
  assert (wgrad["dtype"], wgrad["ms"], wgrad["occurrences"]) == ("float16", 6.1204, 200)
  assert wgrad["tensor_core_eligible"] is True and wgrad["tensor_core_used"] is False
  assert [r["dtype"] for r in table["rows"]] == [
      "float16", "float16", "float16", "float32", "bfloat16", "float16", "float32", None]
  assert [r["op"] for r in table["rows"]][-2:] == [None, None]  # Not launched by an op.


def test_kernel_stats_summary_names_the_ops_that_missed_tensor_cores():
  table = gpu_kernels.parse((GPU / "kernel_stats_synthetic.json").read_text())
  found = gpu_kernels.missed_tensor_cores(table["rows"])
  assert found["kernel_ms"] == pytest.approx(19.07265)
  assert [(m["op"], m["dtype"]) for m in found["missed"]] == [
      ("gradient_tape/model/conv2d_1/Conv2D/Conv2DBackpropFilter", "float16"),
      ("model/logits/MatMul", "float32")]
  assert found["missed"][0]["share"] == pytest.approx(6.1204 / 19.07265)
  assert found["missed_share"] == pytest.approx((6.1204 + 1.80025) / 19.07265)
  assert found["missed"][1]["kernels"] == ["volta_sgemm_128x64_nn"]


@pytest.mark.parametrize("kernel,op,dtype", [
    ("ampere_bf16_s16816gemm_bf16_64x64_ldg8_f2f_stages_64x5_tn", "", "bfloat16"),
    ("sm80_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize96x64x32", "", "bfloat16"),
    ("volta_h884gemm_64x64_ldg8_nn", "", "float16"),
    ("turing_fp16_s1688cudnn_fp16_128x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1", "",
     "float16"),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc", "", "float32"),
    ("cutlass_80_tensorop_s1688gemm_128x256_16x3_tn_align4", "", "float32"),
    ("void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false>", "",
     "float32"),
    # The op name, as a last resort.
    ("redzone_checker", "model/float16_head/MatMul", "float16"),
    ("redzone_checker", None, None),
])
def test_dtype_from_kernel_names(kernel, op, dtype):
  assert gpu_kernels.dtype_of(kernel, op) == dtype


@pytest.mark.parametrize("data,words", [
    (None, "no kernel_stats output"), ("", "empty"), (b"  ", "empty"),
    ("{", "not valid JSON"), ("{}", "no `cols`"), ([1, 2], "no `cols`"),
    ("hello", "no kernel_name, total_duration_us"), (42, "no `cols`"),
    ({"cols": [], "rows": 5}, "no kernel_name"), (b"\xff\xfe\x00", "not a kernel_stats"),
])
def test_kernel_stats_bad_input_is_a_note_never_a_crash(data, words):
  table = gpu_kernels.parse(data)
  assert table["rows"] == [] and words in table["note"]
  summary = gpu_kernels.missed_tensor_cores(table["rows"])
  assert summary["note"] == "no kernel time recorded" and summary["missed"] == []


def test_kernel_stats_of_a_recorded_cpu_trace_is_empty_and_says_why():
  table = gpu_kernels.parse((GPU / "kernel_stats_cpu_trace_recorded.json").read_bytes())
  assert table["rows"] == [] and "no kernels" in table["note"]


def test_kernel_stats_rows_with_bad_cells_are_skipped_and_counted():
  cols = [{"id": "kernel_name"}, {"id": "total_duration_us"}]
  table = gpu_kernels.parse({"cols": cols, "rows": [
      {"c": [{"v": "volta_h884gemm"}, {"v": 10}]}, {"c": [{"v": "k"}, {"v": "x"}]}, 3]})
  assert [r["kernel"] for r in table["rows"]] == ["volta_h884gemm"]
  assert "1 row(s)" in table["note"]


def test_a_trace_xprof_cannot_read_is_a_note(tmp_path):
  table = gpu_kernels.from_trace(str(tmp_path / "missing.xplane.pb"))
  assert table["rows"] == [] and table["note"]


@pytest.mark.parametrize("cpuinfo,expect,word", [
    ("amd_epyc_zen3_dev_machine", False, "without AVX512_VNNI"),  # AVX2 + FMA only.
    ("intel_broadwell_avx2", False, "without AVX512_VNNI"),
    ("amd_epyc_zen4_dev_machine", True, "AVX512_VNNI"),
    ("intel_spr_amx_recorded", True, "AVX512_VNNI"),
    ("arm_neoverse_v1", None, "not x86"),
])
def test_tfs_default_for_its_onednn_rewrite_on_recorded_cpus(cpuinfo, expect, word):
  """TF 2.21's DefaultOneDnnPolicy (tensorflow/core/util/port.cc): on for x86 CPUs with
  AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX; tests/train/test_keras_fit.py holds the
  rule to TF's own answer on the host."""
  cpu = isa.detect(str(CPUINFO / f"{cpuinfo}.txt"))
  on, why = hardware.onednn_default(cpu.flags)
  assert on is expect and word in why
