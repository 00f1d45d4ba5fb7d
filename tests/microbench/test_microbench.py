"""The microbenchmark: ISA parsing, the exact FMA oracle, the peak formula, TF's
probe output, the report's verdict on each peak estimate, bad input, and
`--mode=microbench --quick` end to end."""

from fractions import Fraction
import json
import re
import sys

import pytest

from mpt import config
from mpt.errors import UserError
from mpt.machine import ceilings
from mpt.machine import isa
from mpt.machine import rates
from mpt.microbench import fma
from mpt.microbench import report
from mpt.microbench import run as microbench
from mpt.microbench import tfbuild
from mpt.microbench import throughput
from mpt.microbench.options import MicrobenchOptions

from helpers import CPUINFO, DATA, mpt_forked, read_events


def cpu(name: str) -> isa.Cpu:
  return isa.parse_cpuinfo((CPUINFO / name).read_text())


@pytest.mark.parametrize("name,present,absent", [
    ("intel_sapphire_rapids.txt", {"avx512f", "avx512_bf16", "avx512_fp16", "amx_tile",
                                   "amx_bf16", "avx512_vnni", "fma", "f16c"},
     {"amx_fp16", "asimd"}),
    ("amd_zen4.txt", {"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni"},
     {"avx512_fp16", "amx_tile", "amx_bf16"}),
    ("intel_broadwell_avx2.txt", {"sse4_2", "avx", "avx2", "fma", "f16c"},
     {"avx512f", "avx512_bf16"}),
    ("arm_neoverse_v1.txt", {"asimd", "asimdhp", "sve", "bf16"}, {"avx2", "fma"}),
    ("amd_epyc_zen3_dev_machine.txt", {"avx2", "fma", "f16c"},
     {"avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16"}),
    ("amd_epyc_zen4_dev_machine.txt", {"avx512f", "avx512_bf16", "avx512_vnni", "fma"},
     {"avx512_fp16", "amx_tile", "amx_bf16"}),
    ("intel_spr_amx_recorded.txt", {"avx512f", "avx512_bf16", "avx512_fp16", "amx_tile",
                                    "amx_bf16", "fma"}, {"amx_fp16", "asimd"}),
])
def test_isa_parsing_on_recorded_cpuinfo(name, present, absent):
  found = cpu(name).isa()
  assert set(found) == set(isa.ISA_FLAGS)
  assert all(found[f] for f in present) and not any(found[f] for f in absent)


def test_cpuinfo_fields():
  spr = cpu("intel_sapphire_rapids.txt")
  assert (spr.vendor, spr.family, spr.logical_cpus, spr.physical_cores, spr.mhz) == (
      "GenuineIntel", 6, 8, 4, 2400.0)
  arm = cpu("arm_neoverse_v1.txt")
  assert arm.vendor == "ARM implementer 0x41" and arm.mhz is None
  assert arm.logical_cpus == 4 and arm.physical_cores is None


def test_missing_cpuinfo_falls_back_to_numpy_and_says_so(tmp_path):
  found = isa.detect(str(tmp_path / "no-cpuinfo"))
  assert "numpy's CPU feature detection" in found.source and "not readable" in found.source
  assert found.flags == isa.numpy_features() and found.logical_cpus >= 1
  assert isa.peak_gflops(found, "float32")["gflops"] is None  # No clock there.


@pytest.mark.parametrize("name,dtype,per_cycle,gflops", [
    # 4 cores x 2.4 GHz: AVX-512 with 2 FMA units, AMX for bfloat16.
    ("intel_sapphire_rapids.txt", "float32", 64, 4 * 2.4 * 64),
    ("intel_sapphire_rapids.txt", "bfloat16", 2048, 4 * 2.4 * 2048),
    ("intel_sapphire_rapids.txt", "float16", 128, 4 * 2.4 * 128),  # AVX512_FP16
    # Zen 4: double-pumped AVX-512 (32 float32 FLOP/cycle), VDPBF16PS doubles it.
    ("amd_zen4.txt", "float32", 32, 4 * 3.7 * 32),
    ("amd_zen4.txt", "bfloat16", 64, 4 * 3.7 * 64),
    ("amd_zen4.txt", "float16", 32, 4 * 3.7 * 32),
    ("intel_broadwell_avx2.txt", "float32", 32, 2 * 2.3 * 32),
    ("intel_broadwell_avx2.txt", "bfloat16", 32, 2 * 2.3 * 32),
    ("amd_epyc_zen3_dev_machine.txt", "float32", 32, None),
])
def test_peak_formula_on_known_chips(name, dtype, per_cycle, gflops):
  peak = isa.peak_gflops(cpu(name), dtype)
  assert peak["flops_per_cycle"] == per_cycle
  if gflops is not None:
    assert peak["gflops"] == pytest.approx(gflops)
  assert "FLOP/cycle" in peak["assumptions"] and "cores" in peak["assumptions"]


def test_rounding_follows_ieee():
  f = Fraction
  assert fma.round_to(f(1) + f(1, 2**24), "float32") == 1  # tie -> even
  assert fma.round_to(f(1) + f(3, 2**24), "float32") == 1 + f(2, 2**23)
  assert fma.round_to(f(65520), "float16") == float("inf")  # rounds past the max
  assert fma.round_to(f(65519), "float16") == 65504
  assert fma.round_to(f(1, 2**25), "float16") == 0  # half the smallest subnormal
  assert fma.round_to(f(3, 2**26), "float16") == f(1, 2**24)
  assert fma.round_to(f(257), "bfloat16") == 256


@pytest.mark.parametrize("fmt,a,b,c,fused,unfused", [
    # a*b = 1 - 2^-46 exactly; rounding the product first loses it.
    ("float32", 1 + Fraction(1, 2**23), 1 - Fraction(1, 2**23), -1,
     -Fraction(1, 2**46), 0),
    # float16: (1 + 2^-10)^2 = 1 + 2^-9 + 2^-20; minus (1 + 2^-9).
    ("float16", 1 + Fraction(1, 2**10), 1 + Fraction(1, 2**10), -(1 + Fraction(1, 2**9)),
     Fraction(1, 2**20), 0),
    # No cancellation, exact: both agree.
    ("float32", Fraction(3), Fraction(5), Fraction(7), 22, 22),
])
def test_fused_and_unfused_on_hand_picked_cases(fmt, a, b, c, fused, unfused):
  assert fma.fused(a, b, c, fmt) == fused
  assert fma.unfused(a, b, c, fmt) == unfused
  exact = a * b + c
  assert fma.ulps_off(fma.fused(a, b, c, fmt), exact, fmt) <= 0.5


def test_fma_statistics():
  stats = fma.fma_accuracy("float16", 300)
  assert 0 < stats["differ_share"] < 1
  assert stats["fused_max_ulps"] <= 0.5  # One rounding: never more than half an ulp.
  assert stats["unfused_max_ulps"] > stats["fused_max_ulps"]
  dots = fma.dot_accuracy("float16", 64, 50)
  assert dots["acc32_mean_ulps"] < dots["acc16_mean_ulps"]
  assert dots["acc32_max_ulps"] <= 0.5 + 1e-9  # Exact-ish sum, one final rounding.


def test_probe_output_parsing():
  stdout = "\n".join([
      "onednn_verbose,v1,info,cpu,isa:Intel AVX2",
      "MPT-OP matmul float32",
      "onednn_verbose,v1,primitive,exec,cpu,gemm_api,,undef,src_f32::blocked:ab:f0 "
      "wei_f32::blocked:ab:f0 dst_f32::blocked:ab:f0,,,48x64:64x64,24.1",
      "MPT-OP matmul bfloat16",
      "onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core_amx,undef,"
      "src_bf16::blocked:ab:f0 wei_bf16::blocked:ab:f0 dst_bf16::blocked:ab:f0,,,"
      "128x128:128x128,0.1",
      "MPT-OP conv2d float16",
      # oneDNN 3.7's layout (TF 2.21), recorded on a Sapphire Rapids machine: the
      # source dtype is `src:f16:`, which the parser once printed as "on ?".
      "onednn_verbose,v1,primitive,exec,cpu,convolution,ref:any,backward_weights,"
      "src:f16::blocked:acdb::f0 wei:f16:a:blocked:abcd::f0 bia:undef::undef::: "
      "dst:f16::blocked:acdb::f0,,alg:convolution_direct,mb8_ic32oc64_ih32oh16kh7sh2,"
      "696.265",
      "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f16::blocked:"
      "abcd::f0 dst:f16::blocked:cdba::f0,,,64x32x7x7,0.167969",
      "MPT-OP conv2d bfloat16",
      'MPT-INFO {"tf_version": "2.21.0", "python": "3.11.7", "build": {}}'])
  stderr = ("I0000 cpu_feature_guard.cc:227] This TensorFlow binary is optimized...\n"
            "To enable the following instructions: AVX2 FMA, in other operations, "
            "rebuild TensorFlow with the appropriate compiler flags.")
  facts = tfbuild.parse(stdout, stderr)
  assert facts["not_compiled_for"] == ["AVX2", "FMA"]
  assert facts["onednn"] and facts["onednn_isa"] == "Intel AVX2"
  assert facts["onednn_dispatch"] == {
      "matmul_float32": ["gemm_api on float32"],
      "matmul_bfloat16": ["matmul:brg_matmul:avx512_core_amx on bfloat16"],
      "conv2d_float16": ["convolution:ref:any on float16"],  # The reorder is layout only.
      "conv2d_bfloat16": []}
  assert "?" not in str(facts["onednn_dispatch"])
  assert facts["tf_version"] == "2.21.0"


def test_report_says_in_words_which_estimates_the_measurements_refute():
  """The recorded Sapphire Rapids results: float32 measured above its "peak", AMX
  bfloat16 more than 4x below it (mpt/machine/ceilings.py)."""
  path = DATA / "microbench" / "intel_spr_amx_microbench.json"
  recorded = json.loads(path.read_text())
  assert "ceilings" not in recorded  # Recorded before ceilings: computed for the report.
  text = report.format_report(recorded)
  lines = {l.strip().split(":")[0]: l for l in text.splitlines()
           if re.match(r"  (float32|bfloat16|float16): [\d.]+ GFLOP/s = ", l)}
  assert lines["float32"].startswith("  float32: 332.8 GFLOP/s = 2 cores x 2600 MHz")
  assert lines["float32"].endswith(
      "-- unreliable estimate: measured conv2d 348 GFLOP/s beats it (105%)")
  assert lines["bfloat16"].endswith(
      "-- unreliable estimate: measured conv2d 1861 GFLOP/s misses it by 5.72x (17%)")
  assert lines["float16"].endswith(
      "-- plausible: measured matmul 345 GFLOP/s is 52% of it")
  assert ("    practical ceiling (best TensorFlow rate measured): matmul 340.6, conv2d "
          "348.4 GFLOP/s") in text.splitlines()
  # The ceilings a run stores in microbench.json give the same report.
  stored = {**recorded, "ceilings": ceilings.ceilings(recorded)}
  assert report.format_report(stored) == text


@pytest.mark.parametrize("overrides,words", [
    (dict(microbench_dtypes="float32,int4"), "unknown dtype 'int4'; valid: float32"),
    (dict(microbench_dtypes="float32,float32"), "lists a value twice"),
    (dict(microbench_sizes="256,abc"), "must list whole numbers"),
    (dict(microbench_sizes=""), "must be a comma-separated list"),
    (dict(microbench_sizes="0"), "out of range"),
    (dict(compare_python="/no/such/python"), "is not an executable file"),
    (dict(compare_python="/bin/true"), "could not run the microbenchmark (does it "
                                       "have TensorFlow?): no output"),
])
def test_bad_input_is_a_clear_error(tmp_path, overrides, words):
  cfg = config.Config(logdir=str(tmp_path / "logs"))
  with pytest.raises(UserError) as e:
    microbench.run(cfg, MicrobenchOptions(quick=True, **overrides))
  assert words in str(e.value)
  assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())


@pytest.mark.slow
def test_quick_end_to_end_with_a_second_interpreter(tmp_path):
  # mpt forked from the TF-importing server; the second interpreter a fresh process,
  # through a wrapper that leaves a mark, so the test knows it ran.
  wrapper, mark = tmp_path / "python", tmp_path / "ran"
  wrapper.write_text(f"#!/bin/sh\ntouch {mark}\nexec {sys.executable} \"$@\"\n")
  wrapper.chmod(0o755)
  proc = mpt_forked("--mode=microbench", "--quick", f"--compare_python={wrapper}",
                    f"--logdir={tmp_path}/logs", timeout=600,
                    env={"MPT_CACHE": str(tmp_path / "cache")})
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = proc.stdout
  assert "FMA vs multiply-then-add" in out and "Peak (theoretical)" in out
  assert "second column" in out
  # Each measured row has the second interpreter's figure and the ratio beside it.
  assert re.search(r"matmul\s+tensorflow\s+float32\s+64\s.*\|\s+[\d.]+\s+x[\d.]+", out), out
  run = next((tmp_path / "logs").iterdir())
  result = json.loads((run / "microbench.json").read_text())
  assert result["isa"] == isa.detect().isa()  # The stand-in cpuinfo (conftest.py).
  assert mark.exists() and result["compare"]["python"] == str(wrapper)
  assert result["compare"]["results"]["throughput"]
  # SIMD width: a+b and a*b per dtype, in TensorFlow and numpy, as elements/s.
  simd = {(r["op"], r["lib"], r["dtype"]) for r in result["simd"]}
  assert simd == {(f"elementwise_{op}", lib, d) for op in ("add", "mul")
                  for lib in ("tensorflow", "numpy") for d in throughput.SIMD_DTYPES}
  assert all(r["elements_per_s"] > 0 and r["bytes_per_s"] > r["elements_per_s"]
             for r in result["simd"])
  assert "Elementwise (SIMD width)" in out
  # conv2d in TensorFlow, per dtype, beside matmul.
  conv = [r for r in result["throughput"] if r["op"] == "conv2d"]
  assert {r["dtype"] for r in conv if r.get("gflops")} == {"float32", "bfloat16",
                                                           "float16"}
  gemm = [r for r in result["throughput"] if r["op"] == "matmul"]
  assert {(r["lib"], r["dtype"], r["size"]) for r in gemm} >= {
      ("tensorflow", "float32", 64), ("tensorflow", "bfloat16", 128),
      ("tensorflow", "float16", 64), ("numpy", "float32", 128)}
  assert all(r["gflops"] > 0 for r in gemm)
  assert result["tensorflow"]["tf_version"] and "compare" in result
  assert {f["dtype"] for f in result["fma"]} == {"float32", "float16"}
  assert set(result["ceilings"]) >= {"float32", "bfloat16", "float16"}
  # Each verdict is the rule's, on the stand-in CPU's estimate and the best TF rate.
  for dtype, found in result["ceilings"].items():
    best = max((r["gflops"] for r in result["throughput"] if r["lib"] == "tensorflow"
                and r["dtype"] == dtype and r.get("gflops")), default=None)
    estimate = isa.peak_gflops(isa.detect(), dtype)["gflops"]
    assert found["practical_gflops"] == best and found["estimate_gflops"] == estimate
    assert found["verdict"] == ceilings.verdict(estimate, best, "x")[0], dtype
  f32 = result["ceilings"]["float32"]
  estimate = f32["estimate_gflops"]  # None where the stand-in CPU gives no clock.
  shown = "-" if estimate is None else f"{estimate:.1f}"
  said = [l for l in out.splitlines() if l.startswith(f"  float32: {shown} GFLOP/s = ")]
  assert len(said) == 1 and f" -- {f32['verdict']}: " in said[0], out
  tags = read_events(run)
  assert set(tags) == {"microbench/report"}  # One text, no scalar card per figure,
  from tensorboard.backend.event_processing import event_accumulator
  acc = event_accumulator.EventAccumulator(str(run))
  acc.Reload()
  assert acc.Tags()["tensors"].count("microbench/rates") == 1  # and the plot, once:
  assert (run / "microbench.png").read_bytes().startswith(b"\x89PNG")
  assert rates.measured_gflops(result, "float32") > 0
  # --quick's rates are not the machine's: not cached for training runs to read.
  assert "Not cached as this machine's rates" in out
  cached = sorted((tmp_path / "cache" / "microbench").glob("*.json"))
  assert [p.name.endswith("-kernels.json") for p in cached] == [True]
  # The kernel table: printed, in microbench.json, and cached for training runs.
  assert "Kernels per op" in out and "Conv2DBackpropFilter" in out
  table = json.loads(cached[0].read_text())
  assert table["rows"] == result["kernels"]["rows"] and len(table["rows"]) == 38
