"""Config checks: every bad value ends in one UserError that names the flag; the one
policy table and the one reader of list, key=value and bool flag values."""

import pytest

from mpt import config
from mpt import flagvalues
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


def test_the_policy_lists_derive_from_the_one_table_in_their_old_order():
  assert config.POLICY_DTYPE == {"float32": "float32", "mixed_bfloat16": "bfloat16",
                                 "mixed_float16": "float16"}
  # --help, error messages and the diagnosis list float16's policy first, as ever.
  assert list(config.SIXTEEN.items()) == [("mixed_float16", "float16"),
                                          ("mixed_bfloat16", "bfloat16")]
  assert config.POLICIES == ("float32", "mixed_float16", "mixed_bfloat16", "auto")


@pytest.mark.parametrize("text,lenient,value", [
    ("true", False, True), ("FALSE", False, False), ("True", True, True),
    ("1", True, True), ("0", True, False), ("yes", True, False)])
def test_parse_bool(text, lenient, value):
  assert flagvalues.parse_bool(text, lenient) is value


@pytest.mark.parametrize("text", ["1", "yes", "", " true"])
def test_parse_bool_refuses_anything_but_true_or_false(text):
  with pytest.raises(ValueError):
    flagvalues.parse_bool(text)


def test_parse_list_reads_items_and_names_each_fault_in_the_flags_words():
  assert flagvalues.parse_list(" 4, 8 ,16", "sizes", int) == [4, 8, 16]
  assert flagvalues.parse_list("3,3", "steps", int, unique=False) == [3, 3]
  for spec, kwargs, words in [
      ("4,,8", {}, "--sizes='4,,8' must be a comma-separated list"),
      ("", dict(empty="has an empty item"), "--sizes='' has an empty item"),
      ("4,x", dict(kind=int, what="whole numbers"), "--sizes='4,x' must list whole"),
      ("4,04", dict(kind=int), "--sizes='4,04' lists a value twice"),
      ("true,maybe", dict(kind=flagvalues.parse_bool), "must list values")]:
    with pytest.raises(UserError) as e:
      flagvalues.parse_list(spec, "sizes", **kwargs)
    assert words in str(e.value)


def test_parse_kv_yields_pairs_until_an_item_is_not_one():
  assert list(flagvalues.parse_kv("a=1, b = x ,c=", "opts")) == [
      ("a", "1"), ("b", "x"), ("c", "")]
  pairs = flagvalues.parse_kv("a=1,b,c=2", "opts")
  assert next(pairs) == ("a", "1")  # Read in order: a caller checks `a` first.
  with pytest.raises(UserError, match=r"--opts='a=1,b,c=2': 'b' is not key=value"):
    next(pairs)


@pytest.mark.parametrize("spec,words", [
    ("3", "must be two step numbers A,B"), ("3,", "must be two step numbers A,B"),
    ("1,2,3", "must be two step numbers A,B"), ("5,2", "the window is reversed"),
    ("0,2", "steps count from 1")])
def test_parse_steps(spec, words):
  assert flagvalues.parse_steps("3, 3", "profile_steps") == (3, 3)
  assert flagvalues.parse_steps("", "profile_steps") is None
  with pytest.raises(UserError, match=words):
    flagvalues.parse_steps(spec, "profile_steps")


@pytest.mark.parametrize("policies, scaled", [
    (("mixed_float16",), True), (("mixed_bfloat16",), False), (("float32",), False),
    (("float32", "mixed_bfloat16", "mixed_float16"), True), ((), False)])
def test_only_float16_scales_the_loss(policies, scaled):
  """The one rule of loss scaling: float16's narrow range needs it, bfloat16's (float32's
  exponent) does not; used by the optimizer, the per-layer sums, a script's timing."""
  assert config.scales(*policies) is scaled
