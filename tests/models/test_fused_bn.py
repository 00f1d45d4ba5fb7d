"""The fused BatchNorm against Keras' own layer: same outputs, gradients and moving
statistics (within each dtype's rounding), in training and inference, and the swap."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from mpt import models
from mpt.models import fused_bn

# Max abs difference allowed per compute dtype: about 2 units in the last place of
# outputs up to ~8 in magnitude (bfloat16 ulp 0.0625 there, float16 0.0039), as either
# layer may round once more than the other in 16 bits, depending on the CPU's kernel.
# The moving statistics stay float32.
TOLERANCE = {"float32": 1e-5, "bfloat16": 1.3e-1, "float16": 8e-3}
# Gradients and inference outputs, relative to their largest magnitude.
RELATIVE = {"float32": 4e-5, "bfloat16": 1.2e-1, "float16": 1.6e-2}


def _pair(policy):
  keras.mixed_precision.set_global_policy(policy)
  ref = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-3)
  fused = fused_bn.FusedBatchNormalization(momentum=0.9, epsilon=1e-3)
  shape = (6, 5, 7, 8)
  ref.build(shape)
  fused.build(shape)
  rng = np.random.default_rng(0)
  gamma, beta = rng.uniform(0.5, 1.5, 8), rng.normal(size=8)
  for layer in (ref, fused):
    layer.gamma.assign(gamma.astype("float32"))
    layer.beta.assign(beta.astype("float32"))
  x = tf.constant(rng.normal(2.0, 3.0, shape).astype("float32"))
  return ref, fused, x


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_training_step_matches_keras(policy):
  ref, fused, x = _pair(policy)
  tol = TOLERANCE[keras.mixed_precision.global_policy().compute_dtype]
  results = []
  for layer in (ref, fused):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = layer(x, training=True)
      loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.cast(x, tf.float32))
    dx, dgamma = tape.gradient(loss, [x, layer.gamma])
    results.append((y, dx, dgamma, layer.moving_mean.numpy(),
                    layer.moving_variance.numpy()))
  (y0, dx0, dg0, mm0, mv0), (y1, dx1, dg1, mm1, mv1) = results
  assert y1.dtype == y0.dtype
  np.testing.assert_allclose(tf.cast(y1, tf.float32), tf.cast(y0, tf.float32), atol=tol)
  np.testing.assert_allclose(mm1, mm0, rtol=1e-5)
  np.testing.assert_allclose(mv1, mv0, rtol=1e-4)  # Population variance, as Keras.
  rel = RELATIVE[keras.mixed_precision.global_policy().compute_dtype]
  np.testing.assert_allclose(dg1, dg0, atol=rel * float(tf.reduce_max(tf.abs(dg0))))
  np.testing.assert_allclose(dx1, dx0, atol=rel * float(tf.reduce_max(tf.abs(dx0))))


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_inference_uses_the_moving_statistics(policy):
  ref, fused, x = _pair(policy)
  for layer in (ref, fused):
    layer.moving_mean.assign(np.linspace(-1, 1, 8).astype("float32"))
    layer.moving_variance.assign(np.linspace(0.5, 4, 8).astype("float32"))
  tol = TOLERANCE[keras.mixed_precision.global_policy().compute_dtype]
  np.testing.assert_allclose(tf.cast(fused(x, training=False), tf.float32),
                             tf.cast(ref(x, training=False), tf.float32), atol=tol)


def test_every_registered_model_swaps_and_keeps_its_shape_and_weights_count():
  for name in models.names():
    model = models.build(name, (32, 32, 3), 10, **models.parse_opts(name, ""))
    fused, replaced, kept = fused_bn.with_fused_batchnorm(model)
    n_bn = sum(isinstance(l, keras.layers.BatchNormalization) for l in model.layers)
    assert (replaced, kept) == (n_bn, 0), name
    assert fused.count_params() == model.count_params(), name
    assert fused.output_shape == model.output_shape
    assert not any(isinstance(l, keras.layers.BatchNormalization) for l in fused.layers)
    # The same starting point as Keras' layers: the same seed compares like with like.
    for a, b in zip(model.weights, fused.weights):
      np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"{name} {a.path}")
    x = np.random.default_rng(0).random((2, 32, 32, 3), dtype=np.float32)
    np.testing.assert_allclose(fused(x, training=False), model(x, training=False),
                               rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_both_loops_train_with_it_and_inspect_and_checkpoints_see_it(tiny, loop):
  import json
  from mpt.train.cli import run
  summary = run.train_and_evaluate(tiny(loop=loop, policy="mixed_bfloat16",
                                        batchnorm="fused", epochs=2))
  assert summary["status"] == "completed" and summary["batchnorm"] == "fused"
  assert np.isfinite(summary["train_loss"]) and summary["val_accuracy"] is not None
  report = json.loads(open(f"{summary['run_dir']}/dtypes.json").read())
  bns = [l for l in report["layers"] if l["class"] == "FusedBatchNormalization"]
  assert len(bns) == 3 and all(l["flops"] > 0 and l["output_dtype"] == "bfloat16"
                               for l in bns)
  reader = tf.train.load_checkpoint(f"{summary['run_dir']}/checkpoints")
  moving = [k for k in reader.get_variable_to_shape_map() if "moving_mean" in k]
  assert len(moving) == 3
  # Trained statistics, not the initial zeros: the layer updated them.
  assert all(np.abs(reader.get_tensor(k)).sum() > 0 for k in moving)


def test_synchronized_batchnorm_keeps_keras_layer_and_says_so(tiny, capsys):
  from mpt.train.common import model as model_lib
  from helpers import CPU_DEVICES
  model = model_lib.build_model(tiny(batchnorm="fused", strategy="mirrored",
                                     cpu_devices=CPU_DEVICES), 10, replicas=2)
  assert "only Keras' layer does; keeping Keras' layer" in capsys.readouterr().out
  assert any(isinstance(l, keras.layers.BatchNormalization) for l in model.layers)
