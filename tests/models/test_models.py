"""Model registry and the seed convnet, under every policy."""

import json
import pathlib

import keras
import pytest

from mpt import models
from mpt.errors import UserError
from mpt.train.common import precision

from helpers import train_run


def test_unknown_model_lists_valid_names():
  with pytest.raises(UserError, match=r"unknown --model='nope'; valid: .*seed_convnet"):
    models.get("nope")


def test_the_names_checked_before_tensorflow_loads_are_the_registrys():
  """mpt/modelnames.py reads the `@register` builders from source (a flag is checked
  before any process starts); a builder registered another way would be missed."""
  from mpt import modelnames
  assert modelnames.builtin() == tuple(models.names())


def test_unknown_option_lists_accepted_ones():
  with pytest.raises(UserError, match="no option 'width'; accepted: bn_momentum"):
    models.build("seed_convnet", (32, 32, 3), 10, width=2)


def test_seed_convnet_is_the_seeds():
  model = models.build("seed_convnet", (256, 256, 3), 10, bn_momentum=0.99)
  convs = [l for l in model.layers if isinstance(l, keras.layers.Conv2D)]
  assert [(c.filters, c.kernel_size, c.strides, c.padding) for c in convs] == [
      (32, (5, 5), (2, 2), "same"), (64, (7, 7), (2, 2), "same"),
      (128, (11, 11), (2, 2), "same")]
  assert all(c.activation.__name__ == "relu" for c in convs)
  bns = [l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)]
  assert [b.momentum for b in bns] == [0.99] * 3
  assert model.output_shape == (None, 10)
  # conv 2432 + 100416 + 991360, BatchNorm 128 + 256 + 512, dense 1290.
  assert model.count_params() == 1_096_394


@pytest.mark.parametrize("policy,compute", [("float32", "float32"),
                                            ("mixed_float16", "float16"),
                                            ("mixed_bfloat16", "bfloat16")])
def test_policy_decides_layer_dtypes_and_output_is_float32(policy, compute):
  precision.set_policy(policy)
  model = models.build("seed_convnet", (32, 32, 3), 10)
  for layer in model.layers[1:-1]:  # Everything between input and the output softmax.
    assert layer.compute_dtype == compute, layer.name
    assert all(w.dtype == "float32" for w in layer.weights), layer.name
  assert model.layers[-1].compute_dtype == "float32"
  out = model(keras.ops.zeros((2, 32, 32, 3)))
  assert out.dtype == "float32"


VARIANTS = ["seed_convnet", "seed_convnet_aligned", "resnet", "mobilenet", "vit"]
# Small options so that every variant trains a step on 32 px inputs in a second.
SMALL = {"resnet": dict(depth=10, width=16), "mobilenet": dict(alpha=0.25),
         "vit": dict(patch=8, dim=32, depth=2, heads=2, mlp=64)}
# The float32 layers a 16-bit policy may leave: the forced-float32 output and the
# normalisations Keras computes in float32.
EXPECTED_FLOAT32 = ("dtype forced to float32", "normalises in float32")


def test_every_variant_is_registered_with_a_one_line_purpose():
  assert models.names() == sorted(VARIANTS)
  for name in VARIANTS:
    doc = models.get(name).__doc__
    assert doc and doc.strip().split("\n")[0], name


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_builds_has_a_float32_output_and_trains_a_step(name, policy):
  from mpt.measure import dtypes as mpt_inspect
  from mpt.train.common import steps as steps_lib
  precision.set_policy(policy)
  model = models.build(name, (32, 32, 3), 10, **SMALL.get(name, {}))
  assert model.output_shape == (None, 10) and model.output.dtype == "float32"
  report = mpt_inspect.inspect_model(model)
  assert report["params"] > 0 and report["forward_flops_per_example"] > 0
  if policy != "float32":
    unexpected = [r for r in report["float32_layers"]
                  if not any(words in r["reason"] for words in EXPECTED_FLOAT32)]
    assert unexpected == [], unexpected
    assert report["flops_share_16bit"] > 0.9
  optimizer = precision.make_optimizer(policy, 1e-3, "dynamic")
  steps = steps_lib.Steps(model, optimizer, global_batch=4)
  images = keras.random.uniform((4, 32, 32, 3))
  logs = steps.train_step(images, keras.ops.convert_to_tensor([0, 1, 2, 3]))
  assert 0 < float(logs["loss"]) < 100  # Finite: about ln(10) at the start.


@pytest.mark.parametrize("name", [v for v in VARIANTS if v != "seed_convnet"])
def test_every_other_variant_trains_end_to_end(tiny, name):
  opts = ",".join(f"{k}={v}" for k, v in SMALL.get(name, {}).items())
  summary = train_run(tiny(model=name, model_opts=opts, epochs=1,
                                          steps_per_epoch=3, checkpoint_every=0))
  assert (summary["status"], summary["model"], summary["steps"]) == ("completed", name, 3)
  assert summary["model_opts"] == opts and 0 <= summary["val_accuracy"] <= 1
  run = pathlib.Path(summary["run_dir"])
  dtypes = json.loads((run / "dtypes.json").read_text())
  size = summary["image_size"]
  built = models.build(name, (size, size, 3), 10, **SMALL.get(name, {}))
  assert dtypes["params"] == built.count_params()
  assert f"--model={name}" in (run / "flags.txt").read_text()
  assert (run / "diagnosis.json").is_file()


def test_aligned_variant_pads_the_first_conv_and_the_logits():
  model = models.build("seed_convnet_aligned", (32, 32, 3), 10)
  from mpt.measure import dtypes as mpt_inspect
  report = mpt_inspect.inspect_model(model)
  assert report["misaligned_layers"] == []
  seed = mpt_inspect.inspect_model(models.build("seed_convnet", (32, 32, 3), 10))
  assert seed["misaligned_layers"] == ["conv1", "logits"]


@pytest.mark.parametrize("name,spec,words", [
    ("resnet", "depth=10,width=abc", "width='abc' is not a int"),
    ("resnet", "height=3", "no option 'height'; accepted: depth, width"),
    ("resnet", "depth", "'depth' is not key=value"),
    ("vit", "patch=8,colour=red", "no option 'colour'; accepted: patch, dim, depth"),
    ("nope", "a=1", "unknown --model='nope'; valid: mobilenet, resnet"),
])
def test_model_opts_errors_name_what_is_accepted(name, spec, words):
  with pytest.raises(UserError) as e:
    models.parse_opts(name, spec)
  assert words in str(e.value)


def test_an_unknown_model_is_an_error_even_without_options():
  with pytest.raises(UserError, match="unknown --model='nope'"):
    models.parse_opts("nope", "")


def test_model_opts_are_typed_from_the_defaults():
  assert models.parse_opts("resnet", "depth=10, width=32") == {"depth": 10, "width": 32}
  assert models.parse_opts("mobilenet", "alpha=0.5") == {"alpha": 0.5}
  with pytest.raises(UserError, match="valid depths are 10, 18, 34"):
    models.build("resnet", (32, 32, 3), 10, depth=50)


def test_registering_a_taken_name_is_an_error():
  def seed_convnet(input_shape, num_classes):
    """Not the real one."""
  with pytest.raises(ValueError, match="'seed_convnet' is already registered"):
    models.register(seed_convnet)
  assert models.get("seed_convnet") is not seed_convnet
