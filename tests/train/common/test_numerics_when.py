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
