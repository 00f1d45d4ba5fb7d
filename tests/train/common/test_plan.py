"""A run's flags resolved once: the Plan's typed answers, and what they replace."""

import dataclasses

import pytest

from mpt import config
from mpt.errors import UserError
from mpt.train.common.plan import Plan


def test_a_float32_run_with_layers_in_float16_is_16_bit_and_scales_its_loss():
  """The answer that the terminal line, numerics and loss scaling once each re-derived
  from the strings (the line read only --policy: "all in float32")."""
  plan = Plan.of(config.Config(policy="float32", layer_policy="Conv2D=mixed_float16"))
  assert plan.layers == (("Conv2D", "mixed_float16"),)
  assert plan.sixteen == "mixed_float16" and plan.scales_loss
  bf16 = dataclasses.replace(plan, layer_policy="Conv2D=mixed_bfloat16")
  assert bf16.sixteen == "mixed_bfloat16" and not bf16.scales_loss
  assert Plan.of(config.Config()).sixteen is None


def test_replacing_a_field_resolves_again_and_a_plan_is_not_resolved_twice():
  plan = Plan.of(config.Config(model="resnet", model_opts="width=16", profile_steps="7,8",
                               fault_steps="3,4"))
  assert plan.opts == {"width": 16} and plan.profile == (7, 8) and plan.faults == (3, 4)
  assert Plan.of(plan) is plan
  chosen = dataclasses.replace(plan, policy="mixed_bfloat16", profile_steps="off")
  assert isinstance(chosen, Plan) and chosen.sixteen == "mixed_bfloat16"
  assert chosen.profile is None and chosen.opts == {"width": 16}
  # The flags alone go to flags.txt, a replay reads them back as they were.
  assert config.from_flagfile(config.to_flagfile(chosen)) == config.Config(
      **{f.name: getattr(chosen, f.name) for f in config.fields()})


@pytest.mark.parametrize("flags,words", [
    (dict(profile_steps="3,4"), "after the 5 warm-up steps"),
    (dict(model="resnet", model_opts="depth=x"), "model_opts"),
    (dict(layer_policy="Conv2D=float64"), "layer_policy"),
    (dict(fault_steps="x"), "fault_steps"),
])
def test_a_bad_flag_is_refused_when_the_plan_is_resolved(flags, words):
  with pytest.raises(UserError, match=words):
    Plan.of(config.Config(**flags))
