"""Config checks: every bad value ends in one UserError that names the flag."""

import pytest

from mpt import config
from mpt.errors import UserError


@pytest.mark.parametrize("field,value,words", [
    ("policy", "mixed_int8", "valid: float32, mixed_float16, mixed_bfloat16"),
    ("loop", "keras", "valid: fit, custom"),
    ("batch_size", 0, "--batch_size must be >= 1"),
    ("image_size", -3, "--image_size must be >= 1"),
    ("epochs", 0, "--epochs must be >= 1"),
    ("learning_rate", 0.0, "--learning_rate must be > 0"),
    ("bn_momentum", 1.0, "--bn_momentum must be in [0, 1)"),
    ("dataset", "", "--dataset is empty"),
])
def test_bad_values_raise_one_line(field, value, words):
  with pytest.raises(UserError, match=None) as e:
    config.validate(config.Config(**{field: value}))
  assert words in str(e.value)
  assert "\n" not in str(e.value)


def test_defaults_are_valid():
  assert config.validate(config.Config()) == config.Config()


def test_flagfile_replays_the_config():
  from absl import flags
  from mpt import main  # Defines the flags on absl's global FLAGS.
  cfg = config.Config(policy="mixed_bfloat16", loop="custom", jit_compile=True,
                      batch_size=7, learning_rate=0.5)
  fv = flags.FlagValues()
  for name in main.FLAGS:
    if name in {f.name for f in config.fields()}:
      fv[name] = main.FLAGS[name]
  fv(["prog"] + config.to_flagfile(cfg).split())
  assert config.Config(**{f.name: fv[f.name].value for f in config.fields()}) == cfg
