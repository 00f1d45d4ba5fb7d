"""What a GPU did, read from real captures (tests/data/gpu_captures/README.md): the
device planes, the totals xprof 2.24 reports for them, the Tensor Core split with
eligibility derived from the op type (checked against the kernel table TF itself wrote
at capture time), a partial eight-GPU capture, bad input as one line; and xprof's
converter in a child process that may die without taking the caller along."""

import functools
import sys
import tempfile

import pytest
from xprof.protobuf import kernel_stats_pb2

from helpers import DATA, gpu_captures
from mpt import errors
from mpt.machine import gpu_profile, kernel_families, traces, xspace

CAPTURES = gpu_captures()  # Expanded from tests/data (helpers.py).
# From the source READMEs: the device plane's stats, and xprof 2.24's summary.txt
# (kernel_stats total, overview step_avg_ms). (cc, SMs, MHz, GB/s, GB, kernel ms, step ms)
FACTS = {
    "v100_alexnet": ([7, 0], 80, 1530.0, 898.048, 16.914, 21.64, 74.2),
    "t4_alexnet": ([7, 5], 40, 1590.0, 320.064, 15.812, 1299.02, 3758.4),
    "p100_alexnet": ([6, 0], 56, 1328.5, 732.16, 17.072, 68.85, 131.9),
    "p4_alexnet": ([6, 1], 20, 1113.5, 192.192, 7.982, 160.27, 201.0),
    "bert_8xv100": ([7, 0], 80, 1530.0, 898.048, 16.946, 29.69, 21.3),
}


def trace(name):
  return next((CAPTURES / name).glob("*.xplane.pb"))


@functools.lru_cache(maxsize=None)
def profile(name):
  return gpu_profile.read(trace(name))


def share(p, part):
  return getattr(p.split, part) / p.split.total


@pytest.mark.parametrize("name", sorted(FACTS))
def test_device_plane_and_totals_match_the_capture_readmes(name):
  cc, sms, mhz, gbs, gb, kernel_ms, step_ms = FACTS[name]
  p = profile(name)
  assert (p.device.compute_capability, p.device.sms) == (cc, sms)
  assert p.device.clock_mhz == pytest.approx(mhz)
  assert p.device.memory_bandwidth_gbs == pytest.approx(gbs)
  assert p.device.memory_gb == pytest.approx(gb, abs=1e-3)
  assert p.split.total == pytest.approx(kernel_ms, abs=0.01)
  assert sum(k.ms for k in p.kernels) == pytest.approx(p.split.total)
  assert p.step_ms == pytest.approx(step_ms, abs=0.05)
  assert sum(p.by_family.values()) == pytest.approx(p.split.total)
  assert sum(p.by_layer.values()) == pytest.approx(p.split.total)
  assert 0 < p.device_busy_share <= 1 and p.input_share == 0.0
  assert p.trace == str(trace(name))


@pytest.mark.parametrize("name,eligible", [("v100_alexnet", 0.72), ("t4_alexnet", 0.90)])
def test_float32_on_tensor_core_gpus_uses_none_and_could_use_most(name, eligible):
  p = profile(name)
  assert p.device.tensor_cores is True
  assert p.split.tensor_core == 0.0 and p.sixteen_bit_share == 0.0
  assert share(p, "eligible_not_tc") == pytest.approx(eligible, abs=0.01)
  assert p.eligible_from == "op type"
  assert any("derived from the op type" in n for n in p.notes)
  assert any("names none" in n for n in p.notes)  # xprof 2.24 drops old op names.


@pytest.mark.parametrize("name", ["p100_alexnet", "p4_alexnet"])
def test_pascal_gpus_have_no_tensor_cores(name):
  p = profile(name)
  assert p.device.tensor_cores is False and p.split.tensor_core == 0.0


@pytest.mark.parametrize("name", ["v100_alexnet", "t4_alexnet"])
def test_eligibility_by_op_type_agrees_with_tf_capture_time_kernel_table(name):
  """TF's own table (TF 2.3) flags ops by name; on every op it flags, mpt's time is
  TF's and the op is a convolution or matmul. mpt flags more: the fused forward
  convolutions (named after their Relu) and a second MatMul in a scope ("MatMul_1"),
  which TF's name rule misses."""
  db = kernel_stats_pb2.KernelStatsDb()
  db.ParseFromString(next((CAPTURES / name).glob("*.kernel_stats.pb")).read_bytes())
  flagged = {}
  for r in db.reports:
    if r.is_op_tensor_core_eligible:
      flagged[r.op_name] = flagged.get(r.op_name, 0.0) + r.total_duration_ns / 1e6
  p = profile(name)
  mine = [k for k in p.kernels if k.op_name in flagged]
  assert sum(k.ms for k in mine) == pytest.approx(sum(flagged.values()), abs=0.01)
  assert {k.family for k in mine if k.eligible} == {"conv", "matmul"}
  assert {kernel_families.family(k.op_type) for k in mine} <= kernel_families.ELIGIBLE
  more = [k for k in p.kernels if k.eligible and k.op_name not in flagged]
  assert {(k.op_type, k.op_type == "_FusedConv2D" or k.op_name.endswith("MatMul_1"))
          for k in more} == {("_FusedConv2D", True), ("MatMul", True)}
  fused = sum(k.ms for k in more if k.op_type == "_FusedConv2D")
  assert fused > 0.2 * p.split.total


def test_layers_fold_gradients_into_their_layer():
  p = profile("v100_alexnet")
  top = max(p.by_layer, key=p.by_layer.get)
  assert top == "alex_net_3/conv2d_13"
  assert not any("gradient_tape" in layer or layer.endswith("Conv2D")
                 for layer in p.by_layer)
  grad = next(k for k in p.kernels if k.op_type == "Conv2DBackpropFilter")
  assert grad.op_name.startswith("gradient_tape/") and grad.family == "conv"


def test_partial_eight_gpu_float16_capture_reads_and_says_what_is_missing():
  p = profile("bert_8xv100")
  assert p.gpus == 8 and p.device.name == "/device:GPU:6"  # 14.87 ms against 14.83.
  assert any("kernels on 2 of 8 GPUs" in n and "GPU:4" in n for n in p.notes)
  assert any("no convolution or matmul" in n for n in p.notes)
  assert share(p, "memory_bound") == 1.0
  assert set(p.by_family) == {"cast", "elementwise", "random", "copy"}
  assert p.sixteen_bit_share > 0.9  # Eigen::half kernels; xprof counts otherwise:
  assert any("30.5%" in n for n in p.notes)
  assert not any(layer.startswith("replica_") for layer in p.by_layer)


def test_a_cpu_only_capture_has_no_device(tmp_path):
  space = xspace.parse(trace("v100_alexnet").read_bytes())
  for plane in list(space.planes):
    if plane.name.startswith("/device:GPU"):
      space.planes.remove(plane)
  cpu = tmp_path / "host.xplane.pb"
  cpu.write_bytes(space.SerializeToString())
  p = gpu_profile.read(cpu)
  assert (p.device, p.gpus, p.kernels) == (None, 0, [])
  assert any("CPU-only" in n for n in p.notes)


@pytest.mark.parametrize("op_type,kernel,family", [
    ("Conv2DBackpropFilter", "void cudnn::detail::wgrad_alg0_engine<float>", "conv"),
    ("_FusedConv2D", "void tensorflow::functor::ShuffleInTensor3Simple<float>",
     "transpose"),
    ("Conv2D", "void nchwToNhwcKernel", "transpose"),
    ("Conv2D", "redzone_checker", "other"),
    ("DepthwiseConv2dNative", "", "conv"),
    ("MatMul", "volta_sgemm_128x64_nt", "matmul"),
    ("BatchMatMulV2", "", "matmul"), ("Einsum", "", "matmul"),
    ("FusedBatchNormGradV3", "bn_bw_1C11_kernel_new", "batchnorm"),
    ("Cast", "void Eigen::internal::EigenMetaKernel<...>", "cast"),
    ("Transpose", "SwapDimension1And2InTensor3UsingTiles", "transpose"),
    ("BiasAddGrad", "void cub::DeviceSegmentedReduceKernel", "reduction"),
    ("MaxPoolGrad", "pooling_bw_kernel_max_nchw", "reduction"),
    ("Sum", "", "reduction"), ("Maximum", "", "elementwise"),
    ("RandomUniform", "FillPhiloxRandomKernelLaunch", "random"),
    ("ReluGrad", "void Eigen::internal::EigenMetaKernel<...>", "elementwise"),
    ("BiasAdd", "void tensorflow::BiasNCHWKernel<float>", "elementwise"),
    ("ResourceApplyAdam", "ApplyAdamKernel", "elementwise"),
    ("ConcatV2", "", "copy"), ("", "MemcpyH2D", "copy"),
    ("", "void Eigen::internal::EigenMetaKernel<...>", "elementwise"),
    ("", "volta_h884gemm_64x64_ldg8_nn", "matmul"),
    ("", "void tensorflow::BiasNHWCKernel<float>", "elementwise"),
    ("", "void tensorflow::BiasGradNCHW_SharedAtomics<float>", "reduction"),
    ("dot_general", "", "matmul"), ("Unique", "mystery", "other"),
])
def test_kernel_families(op_type, kernel, family):
  assert kernel_families.family(op_type, kernel) == family


@pytest.mark.parametrize("content,words", [
    (lambda b: b[: len(b) * 3 // 5], "not a readable profiler capture"),
    (lambda b: b"hello, not a protobuf\n" * 40, "not a readable profiler capture"),
    (lambda b: b"", "holds no profiler planes"),
])
def test_bad_captures_are_one_line_user_errors(tmp_path, content, words):
  bad = tmp_path / "bad.xplane.pb"
  bad.write_bytes(content(trace("v100_alexnet").read_bytes()))
  with pytest.raises(errors.UserError) as e:
    gpu_profile.read(bad)
  assert words in str(e.value) and str(bad) in str(e.value) and "\n" not in str(e.value)


def test_a_missing_capture_is_a_user_error(tmp_path):
  with pytest.raises(errors.UserError, match="cannot read the profile"):
    gpu_profile.read(tmp_path / "gone.xplane.pb")


@pytest.mark.parametrize("answer", [(None, None, None), ("", "application/json", None),
                                    (None, None, "RuntimeError: unknown plane")])
def test_a_capture_xprof_cannot_convert_may_be_from_a_newer_tf(monkeypatch, answer):
  monkeypatch.setattr(traces, "convert", lambda trace, tools: {t: answer for t in tools})
  with pytest.raises(errors.UserError) as e:
    gpu_profile.read(trace("p4_alexnet"))
  said = str(e.value)
  assert "newer TensorFlow/xprof than the installed xprof 2.24" in said
  assert "\n" not in said and "1e6c44adc064.xplane.pb" in said


def test_find_traces(tmp_path):
  assert gpu_profile.find_traces(tmp_path) == []
  assert gpu_profile.find_traces(tmp_path / "absent") == []
  runs = []
  for run in ("2020_12_21_16_42_56", "2020_12_22_03_42_42"):
    folder = tmp_path / "logs" / "train" / "plugins" / "profile" / run
    folder.mkdir(parents=True)
    runs.append(folder / "host.xplane.pb")
    runs[-1].write_bytes(b"")
  (tmp_path / "logs" / "train" / "events.out.tfevents.1").write_bytes(b"")
  assert gpu_profile.find_traces(tmp_path) == runs[::-1]  # Newest run first.
  assert gpu_profile.find_traces(runs[0].parent) == [runs[0]]
  assert gpu_profile.find_traces(runs[0]) == [runs[0]]


# --- xprof's converter, in a child process, on a copy ---

def test_the_converter_works_on_a_copy_and_leaves_the_capture_alone():
  before = sorted(p.name for p in (CAPTURES / "p4_alexnet").iterdir())
  tables = traces.convert(trace("p4_alexnet"), ["kernel_stats", "no_such_tool"])
  data, kind, error = tables["kernel_stats"]
  assert kind == "application/json" and error is None and '"kernel_name"' in data
  assert tables["no_such_tool"][0] is None or tables["no_such_tool"][2]
  assert sorted(p.name for p in (CAPTURES / "p4_alexnet").iterdir()) == before


ABORT = ("import os, sys; sys.stderr.write('F0101 00:00:00.0 1 x.cc:1] Check failed: "
         "plane != nullptr\\n'); sys.stderr.flush(); os.abort()")


def test_a_converter_that_aborts_is_an_exception_not_a_dead_caller(monkeypatch,
                                                                   tmp_path):
  """The caller lives on (the abort is the child's), and the scratch copy of the
  trace the child was given is gone, as after a conversion that worked."""
  monkeypatch.setattr(traces, "child_command", lambda: [sys.executable, "-c", ABORT])
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # Where the scratch goes.
  before = sorted(p.name for p in (CAPTURES / "p4_alexnet").iterdir())
  with pytest.raises(traces.ConverterError) as e:
    traces.tool_data(trace("p4_alexnet"), "kernel_stats", quiet=True)
  assert "signal SIGABRT" in str(e.value) and "Check failed" in str(e.value)
  with pytest.raises(errors.UserError, match="converter died .* SIGABRT"):
    gpu_profile.read(trace("p4_alexnet"))
  assert list(tmp_path.iterdir()) == []
  assert sorted(p.name for p in (CAPTURES / "p4_alexnet").iterdir()) == before


def test_a_converter_past_its_time_is_stopped(monkeypatch):
  sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
  monkeypatch.setattr(traces, "child_command", lambda: sleep)
  with pytest.raises(traces.ConverterError, match="ran past 0.5 s"):
    traces.convert(trace("p4_alexnet"), ["kernel_stats"], timeout_s=0.5)


def test_a_trace_that_is_not_there_is_an_os_error(tmp_path):
  with pytest.raises(OSError):
    traces.tool_data(tmp_path / "gone.xplane.pb", "kernel_stats")


@pytest.mark.parametrize("stats,op", [
    ({"level 0": "net/conv2d/Conv2D:Conv2D", "annotation": "x"},
     ("net/conv2d/Conv2D", "Conv2D")),  # TF 2.3/2.4.
    ({"tf_op": "net/dense/MatMul:MatMul"}, ("net/dense/MatMul", "MatMul")),
    ({"annotation": "it/_2:_Recv#from=it,to=loss/Cast#"}, ("it/_2", "_Recv")),
    ({"tf_op": "jit(step)/dot_general"}, ("jit(step)/dot_general", "")),
    ({"correlation_id": 7}, ("", "")),
])
def test_the_op_a_kernel_event_ran_for(stats, op):
  assert xspace.op_of(stats) == op


def test_a_kernel_table_that_names_ops_is_read_row_by_row_with_xprofs_flags(monkeypatch):
  """A newer capture's table (tests/data/gpu/kernel_stats_synthetic.json: xprof's
  columns, invented rows) in place of the P4's: xprof's flags are used as they are."""
  real = traces.convert
  table = (DATA / "gpu" / "kernel_stats_synthetic.json").read_text()
  monkeypatch.setattr(traces, "convert", lambda trace, tools: {
      **real(trace, tools), "kernel_stats": (table, "application/json", None)})
  p = gpu_profile.read(trace("p4_alexnet"))
  assert p.eligible_from == "xprof" and len(p.kernels) == 8
  assert not any("derived" in n or "names none" in n for n in p.notes)
  assert p.split.tensor_core == pytest.approx(5.2005 + 4.1 + 0.9)
  assert p.split.eligible_not_tc == pytest.approx(6.1204 + 1.80025)
  assert p.split.memory_bound == pytest.approx(0.64 + 0.31)
  assert p.split.other == pytest.approx(0.0015)  # redzone_checker.
  assert p.by_layer["model/conv2d_1"] == pytest.approx(6.1204 + 4.1 + 0.64)
  assert p.sixteen_bit_share == pytest.approx((6.1204 + 5.2005 + 4.1 + 0.9 + 0.64)
                                              / 19.07265)  # The float16 Cast too.
