"""Model registry and the seed convnet, under every policy."""

import keras
import pytest

from mpt import models
from mpt import precision
from mpt.errors import UserError


@pytest.fixture(autouse=True)
def restore_policy():
  yield
  precision.set_policy("float32")


def test_unknown_model_lists_valid_names():
  with pytest.raises(UserError, match=r"unknown --model='nope'; valid: .*seed_convnet"):
    models.get("nope")


def test_unknown_option_lists_accepted_ones():
  with pytest.raises(UserError, match="no option 'width'; accepted: bn_momentum"):
    models.build("seed_convnet", (32, 32, 3), 10, width=2)


def test_seed_convnet_is_the_seeds():
  model = models.build("seed_convnet", (256, 256, 3), 10, bn_momentum=0.99)
  convs = [l for l in model.layers if isinstance(l, keras.layers.Conv2D)]
  assert [(c.filters, c.kernel_size, c.strides, c.padding) for c in convs] == [
      (32, (5, 5), (2, 2), "same"), (64, (7, 7), (2, 2), "same"),
      (128, (11, 11), (2, 2), "same")]
  assert all(c.activation.__name__ == "relu" for c in convs)
  bns = [l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)]
  assert [b.momentum for b in bns] == [0.99] * 3
  assert model.output_shape == (None, 10)
  # conv 2432 + 100416 + 991360, BatchNorm 128 + 256 + 512, dense 1290.
  assert model.count_params() == 1_096_394


@pytest.mark.parametrize("policy,compute", [("float32", "float32"),
                                            ("mixed_float16", "float16"),
                                            ("mixed_bfloat16", "bfloat16")])
def test_policy_decides_layer_dtypes_and_output_is_float32(policy, compute):
  precision.set_policy(policy)
  model = models.build("seed_convnet", (32, 32, 3), 10)
  for layer in model.layers[1:-1]:  # Everything between input and the output softmax.
    assert layer.compute_dtype == compute, layer.name
    assert all(w.dtype == "float32" for w in layer.weights), layer.name
  assert model.layers[-1].compute_dtype == "float32"
  out = model(keras.ops.zeros((2, 32, 32, 3)))
  assert out.dtype == "float32"
