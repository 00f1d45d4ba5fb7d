"""When a run samples its numerics (docs/usage.md, `--numerics`): `auto` samples a
run that computes in 16 bits, by its policy or by a --layer_policy that gives some
layers a 16-bit policy, and every --mode=inspect; `on` and `off` say so whatever the
policy. The expectations are the docs' table, written out here. And which batch a
skipped step's replay reads (mpt/train/common/numerics.py `Watch`)."""

import pytest

from mpt import config
from mpt.train.common import numerics


@pytest.mark.parametrize("policy, layer_policy, flag, inspect, sampled", [
    ("float32", "", "auto", False, False),
    ("mixed_float16", "", "auto", False, True),
    ("mixed_bfloat16", "", "auto", False, True),
    ("float32", "conv.*=mixed_float16", "auto", False, True),
    ("float32", "conv.*=float32", "auto", False, False),
    ("mixed_float16", "conv.*=float32", "auto", False, True),
    ("float32", "", "auto", True, True),  # inspect: always, under auto.
    ("float32", "", "on", False, True),
    ("mixed_float16", "", "off", False, False),
    ("mixed_float16", "", "off", True, False),
])
def test_auto_samples_16_bit_runs_and_on_and_off_are_obeyed(
    policy, layer_policy, flag, inspect, sampled):
  cfg = config.Config(policy=policy, layer_policy=layer_policy, numerics=flag)
  assert numerics.wanted(cfg, inspect=inspect) is sampled


@pytest.mark.parametrize("default, entries, sampled", [
    ("float32", {}, False),
    ("float32", {"conv": "mixed_float16"}, True),  # Once read as float32: its default.
    ("mixed_bfloat16", {"head": "float32"}, True),
])
def test_a_scripts_policy_map_is_16_bit_where_any_of_its_layers_is(
    default, entries, sampled, tmp_path):
  """mpt.callbacks' `numerics="auto"`: the global policy may be a DTypePolicyMap
  (docs/usage.md's plan), 16-bit by its entries even where its default is float32."""
  import types
  import keras
  from mpt.train.common.besteffort import Parts
  policy = keras.dtype_policies.DTypePolicyMap(default)
  for path, name in entries.items():
    policy[path] = name
  end = types.SimpleNamespace(run_dir=tmp_path, parts=Parts({}), writer=None,
                              optimizers=types.SimpleNamespace(loss_scale=lambda: None),
                              opts=types.SimpleNamespace(api="mpt.callbacks"))
  previous = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy(policy)
  try:
    found = numerics.for_library(end, lambda: 0, 2, "auto")
  finally:
    keras.mixed_precision.set_global_policy(previous)
  assert bool(found) is sampled


def test_the_command_line_replays_the_batch_of_the_step_it_skipped(tmp_path):
  """A skipped step's batch, replayed by the command line's watch on the run's own
  stream (`train_from(k)`: from batch k on, 0-based, as mpt/train/cli/data.py gives
  it), is that step's: here only batch 2 (step 3) overflows float16 in its Dense."""
  import types
  import keras
  import numpy as np
  import tensorflow as tf
  from mpt.records import numerics as records
  from mpt.train.common import precision
  keras.mixed_precision.set_global_policy("mixed_float16")
  x = np.ones((6 * 2, 10), "float32")
  x[2 * 2:3 * 2] = 1e4  # 10 x 1e4 under all-ones weights: above float16's 65504.
  stream = tf.data.Dataset.from_tensor_slices((x, np.zeros((12, 1), "float32"))).batch(2)
  data = types.SimpleNamespace(train_from=lambda step: stream.skip(step))
  model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(
      1, kernel_initializer="ones", name="dense")])
  optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1e-9),
                                                  initial_scale=1.0)
  model.compile(optimizer, "mse")
  done = [0]
  count = keras.callbacks.LambdaCallback(
      on_train_batch_end=lambda batch, logs: done.__setitem__(0, done[0] + 1))
  loss = keras.losses.MeanSquaredError()
  watch = numerics.Watch(numerics.Source(
      lambda: model, numerics.of_data(data), lambda: numerics.sparse_loss(loss),
      lambda: precision.loss_scale(optimizer)), records.Numerics("mixed_float16", "dynamic"),
      tmp_path, 100, lambda: done[0])
  model.fit(data.train_from(0), epochs=1, verbose=0, shuffle=False,
            callbacks=[count, watch])
  assert [(o.step, o.layer, o.kind) for o in watch.found.overflows] == \
      [(3, "dense", "+Inf")], watch.found.overflows
