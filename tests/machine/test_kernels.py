"""The kernel table and the measured fast-path rule, on real recorded evidence:
ONEDNN_VERBOSE logs of a Sapphire Rapids machine (../shared/machines/intel-spr-amx),
the probe output of the AMD EPYC Zen 4 dev machine, and a synthetic machine where
nothing is slow (tests/data/kernels/README.md says where each came from)."""

import json

import pytest

from mpt.machine import fastpath
from mpt.machine import kernels
from mpt.machine import onednn
from mpt.machine import probe_ops

from helpers import DATA

SPR_FLAGS = {"avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"}
ZEN4_FLAGS = {"avx512f", "avx512_bf16", "avx2", "fma"}
SPR_OPS = {("convolution", "forward_training"): "Conv2D",
           ("convolution", "backward_data"): "Conv2DBackpropInput",
           ("convolution", "backward_weights"): "Conv2DBackpropFilter",
           ("matmul", "undef"): "MatMul", ("gemm_api", "undef"): "MatMul"}
CONVNET = ["conv", "matmul", "batchnorm"]


def table(name):
  return json.loads((DATA / "kernels" / name).read_text())


def spr_logs():
  return {d: (DATA / "onednn" / f"intel_spr_amx_{d}.log").read_text()
          for d in kernels.DTYPES}


def row(t, op, dtype):
  return next(r for r in t["rows"] if r["op"] == op and r["dtype"] == dtype)


def from_verbose_logs(logs: dict[str, str], op_of: dict[tuple[str, str], str],
                      cpu: str, source: str) -> dict:
  """A table from recorded ONEDNN_VERBOSE logs (one per dtype), timed by oneDNN's own
  exec times: `op_of[(kind, prop)]` names the TF op each primitive served. How
  tests/data/kernels/intel_spr_amx_recorded.json was built (no machine to probe)."""
  rows = []
  for dtype, text in logs.items():
    for p in onednn.parse(text):
      op = op_of.get((p.kind, p.prop))
      if op:
        rows.append({"op": op, "dtype": dtype, "impl": p.label, "ms": p.ms,
                     "reference": p.reference})
  return {"schema": kernels.SCHEMA, "source": source, "cpu": cpu, "logical_cpus": None,
          "onednn_isa": next(filter(None, map(onednn.isa, logs.values())), None),
          "tf_version": None, "rows": kernels.with_ratios(rows), "seconds": None}


def test_spr_logs_float16_backward_weights_is_the_reference_kernel():
  by = {(p.kind, p.prop, p.src_dtype): p for d, text in spr_logs().items()
        for p in onednn.parse(text)}
  f16 = by["convolution", "backward_weights", "float16"]
  assert f16.impl == "ref:any" and f16.reference and f16.ms == pytest.approx(696.265)
  bf16 = by["convolution", "backward_weights", "bfloat16"]
  assert bf16.impl == "brgconv_bwd_w:avx10_1_512_amx" and not bf16.reference
  assert all("amx" in p.impl for (kind, _, dt), p in by.items()
             if dt == "bfloat16" and kind in ("convolution", "matmul"))
  assert by["convolution", "backward_weights", "float32"].impl == "jit:avx512_core"
  assert "AMX" in onednn.isa(spr_logs()["float16"])


def test_the_recorded_spr_table_is_what_the_logs_say():
  rebuilt = from_verbose_logs(spr_logs(), SPR_OPS, "Intel(R) Xeon(R) Processor",
                              table("intel_spr_amx_recorded.json")["source"])
  assert rebuilt == table("intel_spr_amx_recorded.json")
  f16 = row(rebuilt, "Conv2DBackpropFilter", "float16")
  assert f16["impl"] == "convolution:ref:any on float16" and f16["ratio"] > 100


def test_older_and_unreadable_verbose_lines():
  old = onednn.parse_line("onednn_verbose,exec,cpu,convolution,jit:avx2,"
                          "backward_weights,src_f32::blocked:aBcd8b:f0 "
                          "diff_dst_f32::blocked:aBcd8b:f0,,alg:convolution_direct,"
                          "mb8_ic32oc64,0.5")
  assert (old.kind, old.impl, old.prop, old.src_dtype, old.ms) == (
      "convolution", "jit:avx2", "backward_weights", "float32", 0.5)
  assert onednn.parse_line("onednn_verbose,v1,primitive,exec,x").kind == "unknown"
  assert onednn.parse_line("onednn_verbose,v1,info,cpu,isa:x") is None
  # A probe whose log cannot be read says "unknown" for that op, and goes on.
  parsed = kernels.parse_probe("MPT-OP Conv2D float32\nonednn_verbose,v1,primitive,"
                               "exec,garbage\nMPT-MS 2.0\nMPT-OP MatMul float32\nMPT-MS 1\n")
  assert [(r["op"], r["impl"], r["ms"]) for r in parsed["rows"]] == [
      ("Conv2D", "unknown", 2.0), ("MatMul", "Eigen", 1.0)]


def test_the_dev_machine_probe_output_parses():
  text = (DATA / "onednn" / "amd_epyc_zen4_probe_stdout.txt").read_text()
  parsed = kernels.parse_probe(text)
  assert parsed == {k: v for k, v in table("amd_epyc_zen4_recorded.json").items()
                    if k in parsed}
  ops = {r["op"] for r in parsed["rows"]}
  assert {"Conv2DBackpropFilterWithBias", "DepthwiseConv2dNativeBackpropFilter",
          "MatMul/grad_weights", "FusedBatchNormGradV3", "Cast"} <= ops
  assert all(len({r["dtype"] for r in parsed["rows"] if r["op"] == op}) ==
             (2 if op == "Cast" else 3) for op in ops)
  # No AVX512_FP16 there: float16 convolutions are TF's own (Eigen) kernels or
  # float32 sgemm, never a float16 oneDNN kernel.
  f16 = [r for r in parsed["rows"] if r["dtype"] == "float16" and r["op"].startswith("Conv")]
  assert all(r["impl"] == "Eigen" or r["impl"].endswith("on float32") for r in f16)
  assert row(parsed, "Conv2D", "bfloat16")["impl"].endswith("avx512_core_bf16 on bfloat16")
  assert "?" not in json.dumps(parsed)


def test_spr_float16_warns_names_the_kernel_and_suggests_bfloat16():
  found = fastpath.verdict("mixed_float16", table("intel_spr_amx_recorded.json"),
                           CONVNET, SPR_FLAGS, [], "this CPU (Xeon)")
  assert found.slow and found.evidence == "probe" and found.ratio > 10
  assert (found.op, found.reference) == ("Conv2DBackpropFilter", True)
  assert found.fastest == "mixed_bfloat16"
  text = found.text
  for words in ("mixed_float16", "float16 Conv2DBackpropFilter", "ref:any",
                "reference kernel", "--policy=mixed_bfloat16"):
    assert words in text, (words, text)
  # The flags (AVX512_FP16) promised a fast path: the verdict says they were wrong.
  assert "promise a fast float16 path" in found.contradicts


def test_spr_bfloat16_is_fast_and_float32_is_told_about_it():
  t = table("intel_spr_amx_recorded.json")
  bf16 = fastpath.verdict("mixed_bfloat16", t, CONVNET, SPR_FLAGS, [], "Xeon")
  assert not bf16.slow and bf16.text is None and bf16.ratio < 0.5
  f32 = fastpath.verdict("float32", t, CONVNET, SPR_FLAGS, [], "Xeon")
  assert not f32.slow and f32.fastest == "mixed_bfloat16"


def test_dev_machine_float16_warns_and_suggests_bfloat16():
  found = fastpath.verdict("mixed_float16", table("amd_epyc_zen4_recorded.json"),
                           CONVNET, ZEN4_FLAGS, [], "this CPU (AMD EPYC)")
  assert found.slow and found.fastest == "mixed_bfloat16"
  assert found.contradicts is None  # The flags said float16 is emulated: agreed.
  assert "--policy=mixed_bfloat16" in found.text


def test_nothing_slow_means_no_warning():
  t = table("nothing_slow_synthetic.json")
  for policy in ("mixed_float16", "mixed_bfloat16"):
    found = fastpath.verdict(policy, t, CONVNET, set(), [], "synthetic")
    assert not found.slow and found.text is None
    # No AVX512_FP16/BF16 in the flags, yet measured fast: said in words.
    assert "but its kernels measured" in found.contradicts


def test_without_a_table_the_flags_decide():
  found = fastpath.verdict("mixed_float16", None, CONVNET, ZEN4_FLAGS, [], "Zen")
  assert found.evidence == "flags" and found.slow
  assert found.fastest == "mixed_bfloat16" and "emulated" in found.text
  assert fastpath.verdict("mixed_float16", None, CONVNET, SPR_FLAGS, [], "x").text is None


def test_families_come_from_the_layers():
  assert fastpath.families_of(["Conv2D", "BatchNormalization", "Dense", "Flatten"]) == [
      "batchnorm", "conv", "matmul"]
  assert fastpath.families_of(["DepthwiseConv2D"]) == ["depthwise"]
  assert fastpath.families_of(["Lambda"]) == ["conv", "depthwise", "matmul", "batchnorm"]


def test_cache_unreadable_or_stale_is_measured_again_with_a_note(monkeypatch, tmp_path):
  monkeypatch.delenv("MPT_KERNELS", raising=False)
  monkeypatch.setenv("MPT_CACHE", str(tmp_path))
  fresh = {**table("amd_epyc_zen4_recorded.json"), "source": "probe"}
  probes = []
  monkeypatch.setattr(kernels, "probe", lambda: probes.append(1) or dict(fresh))
  path = kernels.cache_path()
  path.parent.mkdir(parents=True)
  path.write_text("{not json")
  got, note = kernels.table()
  assert got["source"] == "probe" and "unreadable; measured again" in note
  assert json.loads(path.read_text())["rows"] == fresh["rows"]  # Rebuilt.
  got, note = kernels.table()
  assert got["source"] == f"cache: {path}" and note is None and len(probes) == 1
  path.write_text(json.dumps({**fresh, "schema": 0}))
  got, note = kernels.table()
  assert "stale" in note and len(probes) == 2


def test_a_stand_in_table_and_none(monkeypatch, tmp_path):
  monkeypatch.setenv("MPT_KERNELS", "none")
  assert kernels.table() == (None, None)
  monkeypatch.setenv("MPT_KERNELS", str(tmp_path / "missing.json"))
  got, note = kernels.table()
  assert got is None and "cannot be read" in note


def test_a_real_probe_of_this_machine_fills_every_row():
  """This host's kernels, whatever they are: the rows and their times are checked, not
  which kernel ran. A kernel may be "unknown": a oneDNN build that logs a layout
  onednn.py does not read (the recorded logs above hold the parser to real ones)."""
  t = kernels.probe(budget_s=0.3)
  assert "note" not in t, t.get("note")
  ops = {op for family in probe_ops.FAMILIES.values() for op in family}
  assert {(r["op"], r["dtype"]) for r in t["rows"]} == {
      (op, d) for op in ops for d in kernels.DTYPES if (op, d) != ("Cast", "float32")}
  assert all(r["ms"] > 0 and r["impl"] for r in t["rows"])
  assert all(r["ratio"] == 1.0 for r in t["rows"] if r["dtype"] == "float32")
  assert all(r["ratio"] == pytest.approx(r["ms"] / row(t, r["op"], "float32")["ms"])
             for r in t["rows"] if r["op"] != "Cast")
  import tensorflow as tf
  assert t["tf_version"] == tf.__version__ and t["cpu"]  # The child's TF is this one.


def test_the_printed_table_marks_the_reference_kernel():
  lines = kernels.format_table(table("intel_spr_amx_recorded.json"))
  line = next(l for l in lines if l.split()[0] == "Conv2DBackpropFilter")
  assert "REF ref:any" in line and "231x" in line and "avx10_1_512_amx" in line
