"""The real H200 captures (tests/data/gpu_captures/h200_seed_*, made by
experiments/gpu_jax_captures.py: Keras 3 on JAX, the seed convnet, float32 /
mixed_float16 / mixed_bfloat16 on one H200): mpt's reader on an Hopper GPU and on a
JAX capture. The oracles are independent of mpt's rules: the kernel events' own names
(cuDNN's and CUTLASS's Tensor Core kernels say xmma / MmaTensorOp), the
nvidia-smi line recorded with them.
"""

import functools
import importlib.util
import os
import re

import keras
import pytest

from helpers import ROOT, gpu_captures
from mpt.machine import gpu_kernels, gpu_profile, gpu_specs, traces, xspace
from mpt.models import convnets

CAPTURES = gpu_captures()  # Expanded from tests/data (helpers.py).
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")


def trace(policy):
  return CAPTURES / f"h200_seed_{policy}" / "h200.xplane.pb"


@functools.lru_cache(maxsize=None)
def profile(policy):
  return gpu_profile.read(trace(policy))


def events(policy):
  return [e for g in xspace.gpus(xspace.parse(trace(policy).read_bytes()))
          for e in g.kernels]


@pytest.mark.parametrize("policy", POLICIES)
def test_tensor_core_kernels_are_read_from_their_names(policy):
  # Oracle: the kernel events themselves, by the MMA markers their names carry.
  marked = sum(e.ps for e in events(policy)
               if re.search(r"_xmma_|MmaTensorOp", e.kernel)) / 1e9
  p = profile(policy)
  assert p.split.tensor_core == pytest.approx(marked, rel=1e-9)
  assert p.split.tensor_core / p.split.total > 0.6
  assert any("read from the kernel names" in n for n in p.notes)


def test_xprof_still_flags_no_hopper_kernel():
  """mpt reads Tensor Core use from names because xprof 2.24 knows only Volta's and
  Turing's; when xprof learns Ampere's and Hopper's, this fails and the note goes."""
  rows = gpu_kernels.parse(
      traces.convert(trace("mixed_float16"), ("kernel_stats",))["kernel_stats"][0])
  assert rows["rows"] and not any(r["tensor_core_used"] for r in rows["rows"])


def test_the_device_is_an_h200_by_its_memory():
  smi = (CAPTURES / "h200_seed_nvidia-smi.csv").read_text().splitlines()[1]
  assert smi == "NVIDIA H200, 580.159.04, 143771 MiB, 1980 MHz"
  d = profile("float32").device
  assert (d.compute_capability, d.sms, d.clock_mhz) == ([9, 0], 132, 1980)
  assert d.memory_gb == pytest.approx(143771 * 2**20 / 1e9, rel=0.01)
  assert gpu_specs.identify(d)[0] == "H200"


def test_jax_op_names_give_the_keras_layers():
  p = profile("float32")
  layers = {k.layer for k in p.kernels if k.family == "conv"}
  assert {"conv1", "conv2", "conv3"} <= layers
  assert not any("jvp" in layer or "jit(" in layer for layer in layers)


def test_float32_runs_its_convolutions_on_tf32_tensor_cores():
  tc = [k for k in profile("float32").kernels if k.tensor_core]
  assert tc and all(k.dtype == "float32" for k in tc)
  assert all("tf32" in k.kernel or "tfloat32" in k.kernel for k in tc)


def test_bfloat16s_first_convolution_left_the_tensor_cores():
  # cuDNN ran conv1's forward in bfloat16 on its CUDA-core engine (3 input channels);
  # float16 padded the channels (nhwcAddPaddingKernel) and stayed on Tensor Cores.
  def conv1_forward(policy):
    return [k for k in profile(policy).kernels
            if k.layer == "conv1" and k.family == "conv" and "transpose" not in k.op_name]
  bf16 = conv1_forward("mixed_bfloat16")
  assert any(not k.tensor_core and "convolve_common_engine" in k.kernel for k in bf16)
  assert all(k.tensor_core for k in conv1_forward("mixed_float16"))


def test_the_capture_script_builds_mpts_seed_convnet():
  backend = os.environ.get("KERAS_BACKEND")
  spec = importlib.util.spec_from_file_location(
      "gpu_jax_captures", ROOT / "experiments" / "gpu_jax_captures.py")
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  theirs = script.seed_convnet((32, 32, 3), 10)
  ours = convnets.seed_convnet((32, 32, 3), 10)
  assert [type(l).__name__ for l in theirs.layers] == [type(l).__name__ for l in ours.layers]
  assert [l.get_config() for l in theirs.layers] == [l.get_config() for l in ours.layers]
  assert keras.backend.backend() == "tensorflow"  # The script did not switch ours,
  assert os.environ.get("KERAS_BACKEND") == backend  # nor its children's.
