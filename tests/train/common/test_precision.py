"""Policy, its description and dynamic loss scaling."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from mpt import models
from mpt.train.common import precision
from mpt.train.common import steps as steps_lib


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
  # The poison is injected into the loss itself (the fault injector's factor), not
  # into the input: how a CPU's float16 kernels carry an Inf pixel through a
  # convolution and BatchNorm differs between ISAs (AMX returns a finite loss), but
  # an infinite loss has non-finite gradients on every machine.
  factor = tf.Variable(1.0, trainable=False)
  steps = steps_lib.Steps(model, opt, loss=steps_lib.make_loss(factor))
  labels = tf.constant([1, 2, 3, 4], tf.int32)
  images = tf.random.uniform((4, 16, 16, 3))
  before = [w.numpy().copy() for w in model.trainable_weights]
  scale = precision.loss_scale(opt)

  factor.assign(np.inf)
  logs = steps.train_step(images, labels)
  assert not np.isfinite(float(logs["loss"]))
  assert precision.loss_scale(opt) == scale / 2
  assert precision.skipped_steps(opt, steps_run=1) == 1
  for w, b in zip(model.trainable_weights, before):
    np.testing.assert_array_equal(w.numpy(), b)  # The update was skipped.

  factor.assign(1.0)
  steps.train_step(images, labels)
  assert precision.skipped_steps(opt, steps_run=2) == 1
  assert precision.loss_scale(opt) == scale / 2
  assert any(not np.array_equal(w.numpy(), b)
             for w, b in zip(model.trainable_weights, before))


def test_optimizer_skips_a_constructed_non_finite_gradient():
  """The mechanism alone, with no model: any non-finite gradient skips the update of
  every variable and halves the scale; the next finite one is applied."""
  opt = precision.make_optimizer("mixed_float16", 0.5)
  a, b = tf.Variable([1.0, 2.0]), tf.Variable([3.0])
  opt.build([a, b])
  scale = precision.loss_scale(opt)
  for poison in (np.inf, -np.inf, np.nan):
    opt.apply([tf.constant([1.0, poison]) * scale, tf.constant([1.0]) * scale], [a, b])
    assert (a.numpy().tolist(), b.numpy().tolist()) == ([1.0, 2.0], [3.0])
    scale /= 2
    assert precision.loss_scale(opt) == scale
  opt.apply([tf.constant([1.0, 1.0]) * scale, tf.constant([1.0]) * scale], [a, b])
  assert a.numpy()[0] < 1.0 and b.numpy()[0] < 3.0  # Unscaled, then applied.
