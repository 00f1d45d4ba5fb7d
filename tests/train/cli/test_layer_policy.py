"""--layer_policy: chosen layers in another policy than --policy, in both loops, read
back from the run (dtypes.json's per-layer compute dtypes, the loss scale, flags.txt,
summary.json), and bad patterns refused in one line before training."""

import json
import pathlib

import keras
import pytest

from mpt import config
from mpt.errors import UserError
from mpt.records.layers import Edge, LayerCosts, LayerRow
from mpt.train.common import model as model_lib

from helpers import mpt_forked, script_forked, tiny_flags, train_run


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
  # The plan as the DTypePolicyMap a script applies, read back by Keras.
  plan = keras.saving.deserialize_keras_object(
      json.loads((run / "policy_map.json").read_text())["policy_map"])
  assert plan.default_policy.name == "float32"
  assert {path: p.name for path, p in plan.items()} == {
      name: {"float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}[r["compute_dtype"]]
      for name, r in rows.items() if r["compute_dtype"] != "float32"}


@pytest.mark.parametrize("value, words", [
    ("nolayer=float32", "'nolayer' matches no layer of"),
    ("Conv2D=float8", "unknown policy 'float8'")])
def test_a_bad_pattern_is_one_line_and_exit_2(tmp_path, value, words):
  proc = mpt_forked(*tiny_flags(tmp_path, "--epochs=1", f"--layer_policy={value}"))
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [l for l in proc.stderr.splitlines() if words in l]
  assert len(errors) == 1, proc.stderr[-2000:]
  assert not list((tmp_path / "logs").glob("*/summary.json"))


APPLY = '''
import json, sys, keras, numpy as np
from mpt import models
plan = json.load(open(sys.argv[1]))
keras.mixed_precision.set_global_policy(keras.saving.deserialize_keras_object(plan["policy_map"]))
model = models.build("seed_convnet", (16, 16, 3), 10)
layers = [l for l in model.layers if l.name != "image"]
outs = keras.Model(model.inputs, [l.output for l in layers])(np.ones((2, 16, 16, 3), "float32"))
print(json.dumps({l.name: keras.backend.standardize_dtype(o.dtype) for l, o in zip(layers, outs)}))
'''


def test_inspects_plan_is_the_map_a_script_applies(tmp_path):
  """The plan round trip: per-layer costs (a recorded stand-in in which the seed
  convnet's BatchNormalization is slower in bfloat16) make --mode=inspect write its
  plan as policy_map.json; a script loads it with keras.saving, sets it as the global
  policy, builds the seed convnet, and its layers' outputs come in the plan's dtypes."""
  bf16 = "mixed_bfloat16"
  rows = [LayerRow("Conv2D", ["conv1", "conv2", "conv3"], 3, [[16, 16, 3]],
                   {"float32": 20.0, bf16: 5.0, "mixed_float16": 90.0}),
          LayerRow("BatchNormalization", ["bn1", "bn2", "bn3"], 3, [[8, 8, 32]],
                   {"float32": 1.0, bf16: 4.0, "mixed_float16": 4.0})]
  edges = [Edge(f"conv{i}", f"bn{i}", 100) for i in (1, 2, 3)]
  casts = {f"{a}>{b}": [0.01, 0.0] for a in ("float32", "bfloat16", "float16")
           for b in ("float32", "bfloat16", "float16") if a != b}
  recorded = tmp_path / "layers.json"
  recorded.write_text(json.dumps(LayerCosts({"model": "seed_convnet"}, 32, rows, edges,
                                            casts).to_dict()))
  proc = mpt_forked("--mode=inspect", f"--policy={bf16}", "--image_size=16",
                    "--numerics=off", "--batchnorm=keras", f"--logdir={tmp_path}/logs",
                    "--run_name=i",
                    env={"MPT_LAYERS": str(recorded)})
  assert proc.returncode == 0, proc.stderr
  # inspect's per-layer table (docs/usage.md, --mode=inspect) and its layers.json.
  assert "| layer class | layers | float32 ms | mixed_bfloat16 ms |" in proc.stdout
  assert "| BatchNormalization | 3 | 3.0 | 12.0 (4x) | 12.0 (4x) |" in proc.stdout  # 3 layers.
  written = json.loads((tmp_path / "logs" / "i" / "layers.json").read_text())
  assert [r["cls"] for r in written["rows"]] == ["Conv2D", "BatchNormalization"]
  where = tmp_path / "logs" / "i" / "policy_map.json"
  plan = json.loads(where.read_text())
  assert plan["keras_version"] == keras.__version__ and "BatchNormalization" in plan["why"]
  assert "a script applies it with keras.mixed_precision.set_global_policy" in proc.stdout
  script = tmp_path / "apply.py"
  script.write_text(APPLY)
  done = script_forked(script, str(where), cwd=tmp_path, timeout=120)  # Start not tested.
  assert done.returncode == 0, done.stderr[-2000:]
  dtypes = json.loads(done.stdout.strip().splitlines()[-1])
  assert dtypes == {"conv1": "bfloat16", "bn1": "float32", "conv2": "bfloat16",
                    "bn2": "float32", "conv3": "bfloat16", "bn3": "float32",
                    "gap": "bfloat16", "logits": "bfloat16", "probs": "float32"}
