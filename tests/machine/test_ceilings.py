"""The measured ceilings that judge a peak estimate (mpt/machine/ceilings.py): the best
TensorFlow rate per dtype and op against the CPU estimate or the GPU's data sheet, and
the verdict's thresholds."""

import json

import pytest

from mpt.machine import ceilings

from helpers import DATA

SPR_MICROBENCH = DATA / "microbench" / "intel_spr_amx_microbench.json"


def test_recorded_sapphire_rapids_estimates_are_flagged_both_ways():
  found = ceilings.ceilings(json.loads(SPR_MICROBENCH.read_text()))
  f32, bf16, f16 = found["float32"], found["bfloat16"], found["float16"]
  # float32: TensorFlow's conv2d beat the "theoretical peak" (the reported clock).
  assert f32["verdict"] == "unreliable estimate" and f32["measured_share"] > 1
  assert f32["practical_op"] == "conv2d" and "beats it" in f32["why"]
  # bfloat16: AMX's 1024 multiply-adds/cycle are nowhere near reached (> 4x short).
  assert bf16["verdict"] == "unreliable estimate" and bf16["measured_share"] < 0.25
  assert "misses it by 5.72x" in bf16["why"]
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
