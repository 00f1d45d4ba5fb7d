"""Config checks: every bad value ends in one UserError that names the flag."""

import pytest

from mpt import config
from mpt.errors import UserError

from helpers import DATA


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


def test_other_modes_flags_are_exactly_the_mode_options_fields():
  from mpt import main
  others = {f.name for cls in main.OPTIONS if cls is not config.Config
            for f in config.fields(cls)}
  assert config.OTHER_MODES_FLAGS == others | {"mode"}
  assert not others & {f.name for f in config.fields()}  # No flag in two places.


def test_a_flags_txt_written_before_the_options_split_still_reads():
  old = DATA / "runs" / "f16_custom" / "flags.txt"
  text = old.read_text()
  assert "--batch_sizes=" in text and "--mode=train" in text  # The old 55-flag layout.
  cfg = config.from_flagfile(text)
  assert (cfg.policy, cfg.loop) == ("mixed_float16", "custom")
  assert config.from_flagfile(config.to_flagfile(cfg)) == cfg


def test_an_unknown_flag_in_a_flags_file_is_still_an_error():
  with pytest.raises(UserError, match="unknown flag --no_such_flag"):
    config.from_flagfile("--policy=float32\n--no_such_flag=1\n")
