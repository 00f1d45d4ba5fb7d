"""--layer_policy: chosen layers in another policy than --policy, in both loops, read
back from the run (dtypes.json's per-layer compute dtypes, the loss scale, flags.txt,
summary.json), and bad patterns refused in one line before training."""

import json
import pathlib

import keras
import pytest

from mpt import config
from mpt.errors import UserError
from mpt.train import model as model_lib

from helpers import mpt_forked, tiny_flags, train_run


def _model() -> keras.Model:
  x = keras.Input((8, 8, 3))
  y = keras.layers.Conv2D(4, 3, name="conv1")(x)
  y = keras.layers.DepthwiseConv2D(3, name="dw1")(y)
  y = keras.layers.Conv2D(4, 1, name="conv2")(y)
  y = keras.layers.GlobalAveragePooling2D(name="gap")(y)
  return keras.Model(x, keras.layers.Dense(2, name="head")(y))


def _computes(model: keras.Model) -> dict[str, str]:
  return {layer.name: layer.dtype_policy.compute_dtype for layer in model.layers[1:]}


def test_a_class_or_a_whole_name_sets_the_layers_and_the_first_match_decides():
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    model = _model()
  finally:
    keras.mixed_precision.set_global_policy("float32")
  counts = model_lib.apply_layer_policy(model, config.layer_policies(
      "DepthwiseConv2D=float32,conv2=float32,conv[0-9]=mixed_float16"))
  assert _computes(model) == {"conv1": "float16", "dw1": "float32", "conv2": "float32",
                              "gap": "bfloat16", "head": "bfloat16"}
  assert counts == {"DepthwiseConv2D": 1, "conv2": 1, "conv[0-9]": 1}
  with pytest.raises(UserError, match="'conv2' sets no layer: an earlier pattern"):
    model_lib.apply_layer_policy(model, [("conv.", "float32"), ("conv2", "float32")])
  # A name is matched whole: `conv` alone names no layer.
  with pytest.raises(UserError, match=r"'conv' matches no layer of .*Conv2D"):
    model_lib.apply_layer_policy(model, [("conv", "float32")])


def test_the_value_is_checked_before_any_model_is_built():
  assert config.layer_policies("") == []
  assert config.layer_policies("Dense=float32, a.*=mixed_float16") == [
      ("Dense", "float32"), ("a.*", "mixed_float16")]
  for bad, words in [("Dense", "is not PATTERN=POLICY"),
                     ("Dense=float16", "unknown policy 'float16'"),
                     ("(=float32", "is not a regular expression")]:
    with pytest.raises(UserError, match=words.replace("(", r"\(")):
      config.validate(config.Config(layer_policy=bad))
  with pytest.raises(UserError, match="--policy=auto"):
    config.validate(config.Config(layer_policy="Dense=float32", policy="auto"))
  assert config.scales_loss(config.Config(layer_policy="conv1=mixed_float16"))
  assert not config.scales_loss(config.Config(layer_policy="conv1=mixed_bfloat16"))


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_both_loops_train_the_plan_with_loss_scaling_for_a_float16_layer(tiny, loop):
  done = train_run(tiny(loop=loop, epochs=1, steps_per_epoch=3, run_name=loop,
                        layer_policy="conv1=mixed_float16,Dense=mixed_bfloat16"))
  run = pathlib.Path(done["run_dir"])
  rows = {r["name"]: r for r in json.loads((run / "dtypes.json").read_text())["layers"]}
  assert rows["conv1"]["compute_dtype"] == "float16"
  assert rows["conv1"]["output_dtype"] == "float16"
  assert rows["conv2"]["compute_dtype"] == "float32"
  assert {r["compute_dtype"] for r in rows.values() if r["class"] == "Dense"} == \
      {"bfloat16"}
  # Global float32, one float16 layer: the optimizer scales the loss all the same.
  assert done["loss_scale"] is not None and done["loss_scale"] > 1
  assert done["layer_policy"] == "conv1=mixed_float16,Dense=mixed_bfloat16"
  assert "--layer_policy=conv1=mixed_float16,Dense=mixed_bfloat16\n" in (
      run / "flags.txt").read_text()


@pytest.mark.parametrize("value, words", [
    ("nolayer=float32", "'nolayer' matches no layer of"),
    ("Conv2D=float8", "unknown policy 'float8'")])
def test_a_bad_pattern_is_one_line_and_exit_2(tmp_path, value, words):
  proc = mpt_forked(*tiny_flags(tmp_path, "--epochs=1", f"--layer_policy={value}"))
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [l for l in proc.stderr.splitlines() if words in l]
  assert len(errors) == 1, proc.stderr[-2000:]
  assert not list((tmp_path / "logs").glob("*/summary.json"))
