"""Policy, hardware fast-path checks (with fake hardware) and dynamic loss scaling."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from mpt import models
from mpt import precision
from mpt import steps as steps_lib


@pytest.fixture(autouse=True)
def restore_policy():
  yield
  precision.set_policy("float32")


@pytest.mark.parametrize("policy,flags,gpus,expect", [
    ("float32", set(), [], None),
    ("mixed_float16", {"avx2", "fma"}, [], "--policy=float32"),
    ("mixed_float16", {"avx2", "avx512_bf16"}, [], "--policy=mixed_bfloat16"),
    ("mixed_float16", {"avx512_fp16"}, [], None),
    ("mixed_float16", {"amx_fp16"}, [], None),
    ("mixed_bfloat16", {"avx512_bf16"}, [], None),
    ("mixed_bfloat16", {"amx_bf16"}, [], None),
    ("mixed_bfloat16", {"avx2"}, [], "no AVX512_BF16/AMX-BF16"),
    ("mixed_float16", set(), [(6, 1)], "compute capability 6.1 has no Tensor Core"),
    ("mixed_float16", set(), [(7, 0)], None),
    ("mixed_bfloat16", {"avx512_bf16"}, [(7, 5)], "--policy=mixed_float16"),
    ("mixed_bfloat16", set(), [(8, 0)], None),
])
def test_slow_path_warning_on_fake_hardware(policy, flags, gpus, expect):
  message = precision.slow_path_warning(policy, flags, gpus)
  if expect is None:
    assert message is None
  else:
    assert expect in message and "\n" not in message


def test_describe_prints_compute_and_variable_dtype():
  policy = precision.set_policy("mixed_float16")
  assert precision.describe(policy) == (
      "Policy: mixed_float16  compute dtype: float16  variable dtype: float32")


@pytest.mark.parametrize("policy,scaled", [("float32", False), ("mixed_float16", True),
                                           ("mixed_bfloat16", False)])
def test_only_float16_gets_a_loss_scale_optimizer(policy, scaled):
  opt = precision.make_optimizer(policy, 1e-3)
  assert isinstance(opt, keras.optimizers.LossScaleOptimizer) == scaled
  assert (precision.loss_scale(opt) is not None) == scaled


def test_custom_step_skips_non_finite_gradients_and_halves_the_scale():
  precision.set_policy("mixed_float16")
  keras.utils.set_random_seed(0)
  model = models.build("seed_convnet", (16, 16, 3), 10)
  opt = precision.make_optimizer("mixed_float16", 1e-3)
  steps = steps_lib.Steps(model, opt)
  labels = tf.constant([1, 2, 3, 4], tf.int32)
  good = tf.random.uniform((4, 16, 16, 3))
  before = [w.numpy().copy() for w in model.trainable_weights]
  scale = precision.loss_scale(opt)

  poisoned = tf.tensor_scatter_nd_update(good, [[0, 0, 0, 0]], [np.inf])
  logs = steps.train_step(poisoned, labels)  # Inf input -> non-finite gradients.
  assert not np.isfinite(float(logs["loss"]))
  assert precision.loss_scale(opt) == scale / 2
  assert precision.skipped_steps(opt, steps_run=1) == 1
  for w, b in zip(model.trainable_weights, before):
    np.testing.assert_array_equal(w.numpy(), b)  # The update was skipped.

  steps.train_step(good, labels)
  assert precision.skipped_steps(opt, steps_run=2) == 1
  assert precision.loss_scale(opt) == scale / 2
  assert any(not np.array_equal(w.numpy(), b)
             for w, b in zip(model.trainable_weights, before))
