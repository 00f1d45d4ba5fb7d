"""The benchmark's peers (experiments/peers/) are the seed convnet, layer for layer: the
plain Keras script's model and the PyTorch twin against mpt's `seed_convnet`, by
parameter counts, weight shapes and each stage's output shape."""

import sys

import keras
import numpy as np
import pytest

from helpers import ROOT
from mpt import models

sys.path.insert(0, str(ROOT / "experiments" / "peers"))
import keras_plain  # noqa: E402

SIZES = [64, 33]  # An odd size too, where "same" padding is asymmetric in Keras.


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
def test_plain_keras_script_builds_mpts_seed_convnet(size):
  ours, plain = _mpt(size), keras_plain.seed_convnet(size, fused=False)
  assert _stages(plain) == _stages(ours)
  assert _counts(plain) == _counts(ours)
  bn = [l for l in plain.layers if isinstance(l, keras.layers.BatchNormalization)]
  assert [(l.momentum, l.epsilon) for l in bn] == [(0.9, 1e-3)] * 3


def test_plain_keras_script_with_fused_batchnorm():
  from mpt.models import fused_bn
  plain = keras_plain.seed_convnet(64, fused=True)
  assert sum(isinstance(l, fused_bn.FusedBatchNormalization) for l in plain.layers) == 3
  assert _counts(plain) == _counts(_mpt(64))


@pytest.mark.parametrize("size", SIZES)
def test_torch_twin_matches_keras_layer_for_layer(size):
  torch = pytest.importorskip("torch", reason="the PyTorch twin needs the peer extra")
  import torch_seed
  keras_model, twin = _mpt(size), torch_seed.SeedConvnet()
  trainable, moving = _counts(keras_model)
  assert sum(p.numel() for p in twin.parameters()) == trainable
  assert sum(b.numel() for n, b in twin.named_buffers()
             if not n.endswith("num_batches_tracked")) == moving
  # Weight shapes, Keras' HWIO kernels and (in, out) dense against PyTorch's layouts.
  keras_shapes = [tuple(w.shape) for w in keras_model.trainable_weights]
  to_keras = lambda s: (s[2], s[3], s[1], s[0]) if len(s) == 4 else s[::-1]
  assert [to_keras(tuple(p.shape)) for p in twin.parameters()] == keras_shapes
  # Each BatchNorm's output (NHWC) and the logits.
  x = torch.rand(2, 3, size, size)
  keras_bn = [tuple(l.output.shape)[1:] for l in keras_model.layers
              if isinstance(l, keras.layers.BatchNormalization)]
  assert [s[1:] for s in twin.feature_shapes(x)] == keras_bn
  assert tuple(twin(x).shape) == (2, 10)
  bn = [m for m in twin.modules() if isinstance(m, torch.nn.BatchNorm2d)]
  assert [(m.momentum, m.eps) for m in bn] == [(pytest.approx(0.1), 1e-3)] * 3


@pytest.mark.parametrize("layout,dtype", [("nchw", "float32"),
                                          ("channels_last", "bfloat16")])
def test_torch_twin_trains_and_profiles(layout, dtype):
  pytest.importorskip("torch", reason="the PyTorch twin needs the peer extra")
  import torch_seed
  result = torch_seed.train(16, 4, layout, dtype, steps=4, warmup=1, profile=True)
  assert result["timed_steps"] == 3 and result["ms_per_step"] > 0
  assert any("conv" in op["type"] for op in result["top_ops"])
  assert sum(op["share"] for op in result["top_ops"]) <= 1.0 + 1e-9
