"""The GPU kernel table from xprof's kernel_stats (mpt/machine/gpu_kernels.py): rows
from the JSON and CSV forms, each kernel's dtype from its name, the ops that missed
the Tensor Cores, and bad input as a note, never a crash."""

import pytest

from mpt.machine import gpu_kernels

from helpers import DATA

GPU = DATA / "gpu"


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
