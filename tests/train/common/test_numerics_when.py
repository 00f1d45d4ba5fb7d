"""When a run samples its numerics (docs/usage.md, `--numerics`): `auto` samples a
run that computes in 16 bits, by its policy or by a --layer_policy that gives some
layers a 16-bit policy, and every --mode=inspect; `on` and `off` say so whatever the
policy. The expectations are the docs' table, written out here."""

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
