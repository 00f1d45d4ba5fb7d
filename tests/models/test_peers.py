"""The benchmark's peers (experiments/peers/) are the seed convnet, layer for layer: the
plain Keras script's model and the PyTorch twin against mpt's `seed_convnet`, by
parameter counts, weight shapes and each stage's output shape."""

import importlib.util
import json
import subprocess
import sys

import keras
import numpy as np
import pytest

from helpers import ROOT
from mpt import models

PEERS = ROOT / "experiments" / "peers"

SIZES = [64, 33]  # An odd size too, where "same" padding is asymmetric in Keras.


@pytest.fixture(scope="module")
def keras_plain():
  """experiments/peers/keras_plain.py, imported by path (no lasting sys.path entry)."""
  spec = importlib.util.spec_from_file_location("keras_plain", PEERS / "keras_plain.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _mpt(size):
  keras.mixed_precision.set_global_policy("float32")
  return models.build("seed_convnet", (size, size, 3), 10)


def _stages(model):
  """(class name, output shape) of each layer with weights, in order."""
  return [(type(l).__name__, tuple(l.output.shape)[1:]) for l in model.layers if l.weights]


def _counts(model):
  count = lambda ws: sum(int(np.prod(w.shape)) for w in ws)
  return count(model.trainable_weights), count(model.non_trainable_weights)


@pytest.mark.parametrize("size", SIZES)
def test_plain_keras_script_builds_mpts_seed_convnet(keras_plain, size):
  ours, plain = _mpt(size), keras_plain.seed_convnet(size, fused=False)
  assert _stages(plain) == _stages(ours)
  assert _counts(plain) == _counts(ours)
  bn = [l for l in plain.layers if isinstance(l, keras.layers.BatchNormalization)]
  assert [(l.momentum, l.epsilon) for l in bn] == [(0.9, 1e-3)] * 3


def test_plain_keras_script_with_fused_batchnorm(keras_plain):
  from mpt.models import fused_bn
  plain = keras_plain.seed_convnet(64, fused=True)
  assert sum(isinstance(l, fused_bn.FusedBatchNormalization) for l in plain.layers) == 3
  assert _counts(plain) == _counts(_mpt(64))


# The PyTorch side runs in one child process of its own: importing torch (its triton
# package) into a process that loaded TensorFlow can segfault it (PyTorch 2.14).
TORCH_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import torch_seed
print(json.dumps({
    "describe": {size: torch_seed.describe(size) for size in (64, 33)},
    "train": {f"{layout}-{dtype}": torch_seed.train(16, 4, layout, dtype, steps=4,
                                                    warmup=1, profile=True)
              for layout, dtype in (("nchw", "float32"), ("channels_last", "bfloat16"))},
}))
"""


@pytest.fixture(scope="module")
def torch_side():
  if importlib.util.find_spec("torch") is None:  # Found without importing it here.
    pytest.skip("the PyTorch twin needs the peer extra (pip install -e '.[peer]')")
  proc = subprocess.run([sys.executable, "-c", TORCH_CHILD, str(PEERS)],
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_torch_stays_out_of_this_process(torch_side):
  assert "torch" not in sys.modules


@pytest.mark.parametrize("size", SIZES)
def test_torch_twin_matches_keras_layer_for_layer(torch_side, size):
  twin = torch_side["describe"][str(size)]
  keras_model = _mpt(size)
  trainable, moving = _counts(keras_model)
  assert (twin["parameters"], twin["moving"]) == (trainable, moving)
  # Weight shapes, Keras' HWIO kernels and (in, out) dense against PyTorch's layouts.
  keras_shapes = [tuple(w.shape) for w in keras_model.trainable_weights]
  to_keras = lambda s: (s[2], s[3], s[1], s[0]) if len(s) == 4 else s[::-1]
  assert [to_keras(tuple(s)) for s in twin["shapes"]] == keras_shapes
  # Each BatchNorm's output (NHWC) and the logits.
  keras_bn = [list(l.output.shape)[1:] for l in keras_model.layers
              if isinstance(l, keras.layers.BatchNormalization)]
  assert twin["batchnorm_shapes"] == keras_bn and twin["logits"] == [2, 10]
  assert twin["batchnorm"] == [[pytest.approx(0.1), 1e-3]] * 3


@pytest.mark.parametrize("cell", ["nchw-float32", "channels_last-bfloat16"])
def test_torch_twin_trains_and_profiles(torch_side, cell):
  result = torch_side["train"][cell]
  assert result["timed_steps"] == 3 and result["ms_per_step"] > 0
  assert any("conv" in op["type"] for op in result["top_ops"])
  assert sum(op["share"] for op in result["top_ops"]) <= 1.0 + 1e-9
