"""A user's own model without forking mpt: `--model=package.module:function` and
`--model=keras:NAME`, their options, their float32 output, and one line for each kind
of bad input."""

import json
import pathlib
import sys
import textwrap

import keras
import pytest

from helpers import train_run
from mpt import models
from mpt.errors import UserError

USER_MODULE = '''
import keras

def tiny(input_shape, num_classes, *, width=4):
    """A user's builder: no float32 output layer of its own."""
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(width, 3, strides=2, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(x),
                       name="users_tiny")

def not_a_model(input_shape, num_classes):
    return "a string"

VALUE = 3
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
  """The user's module in the current folder, found as mpt finds it there (the
  current folder on sys.path, as `python -m` has it and the console script lacks):
  this process's sys.path without it, and the module imported afresh each test."""
  (tmp_path / "users_nets.py").write_text(textwrap.dedent(USER_MODULE))
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", [p for p in sys.path
                                    if p not in ("", ".", str(tmp_path))])
  monkeypatch.delitem(sys.modules, "users_nets", raising=False)
  yield "users_nets"
  sys.modules.pop("users_nets", None)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_import_string_model_trains_under_each_policy(tiny, user_module, policy):
  summary = train_run(tiny(model=f"{user_module}:tiny", model_opts="width=8",
                           policy=policy, epochs=1, steps_per_epoch=1, warmup_steps=0))
  assert summary["status"] == "completed" and summary["steps"] == 1
  assert summary["model"] == f"{user_module}:tiny"
  run_dir = pathlib.Path(summary["run_dir"])
  dtypes = json.loads((run_dir / "dtypes.json").read_text())
  conv = next(l for l in dtypes["layers"] if l["class"] == "Conv2D")
  assert conv["params"] == 3 * 3 * 3 * 8 + 8  # width=8 reached the builder.
  assert run_dir.name.endswith(f"{user_module}-tiny_{policy}_fit")


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_keras_application_trains_under_each_policy(tiny, policy):
  summary = train_run(tiny(model="keras:MobileNet", model_opts="alpha=0.25",
                           policy=policy, epochs=1, steps_per_epoch=1, warmup_steps=0,
                           batch_size=4, image_size=32))
  assert summary["status"] == "completed" and summary["steps"] == 1


def test_output_is_float32_whatever_the_builder_did(user_module):
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    user = models.build(f"{user_module}:tiny", (16, 16, 3), 5)
    app = models.build("keras:MobileNetV3Small", (32, 32, 3), 5, minimalistic=True)
  finally:
    keras.mixed_precision.set_global_policy("float32")
  for model in (user, app):
    assert keras.backend.standardize_dtype(model.outputs[0].dtype) == "float32"
    assert model.outputs[0].shape[-1] == 5
  # The builder's softmax is kept (a float32 cast after it); the application's logits
  # get mpt's float32 softmax.
  assert user.layers[-1].name == "output_float32" and app.layers[-1].name == "probs"


@pytest.mark.parametrize("name,words", [
    ("no_such_module_xyz:build", ["'no_such_module_xyz' does not import",
                                  "package.module:function"]),
    ("{m}:missing", ["has no function 'missing'", "its functions: not_a_model, tiny"]),
    ("{m}:VALUE", ["has no function 'VALUE'"]),
    ("{m}:not_a_model", ["returned str, not a keras.Model"]),
    ("keras:NoSuchNet", ["keras.applications has no such model", "ResNet50"]),
    ("keras:ResNet50", ["keras:ResNet50", "32"]),  # Below its smallest input size.
    (":build", ["expected package.module:function"]),
])
def test_bad_model_names_say_what_was_expected(user_module, name, words):
  with pytest.raises(UserError) as e:
    models.build(name.format(m=user_module), (16, 16, 3), 10)
  message = str(e.value)
  assert "\n" not in message
  for word in words:
    assert word in message, message


def test_options_of_external_builders_are_checked(user_module):
  assert models.parse_opts(f"{user_module}:tiny", "width=16") == {"width": 16}
  assert models.parse_opts("keras:MobileNetV3Small", "alpha=0.5,minimalistic=true") == \
      {"alpha": 0.5, "minimalistic": True}
  with pytest.raises(UserError, match="has no option 'depth'; accepted: width"):
    models.parse_opts(f"{user_module}:tiny", "depth=3")
  with pytest.raises(UserError, match="has no option 'weights'"):
    models.parse_opts("keras:ResNet50", "weights=imagenet")  # mpt sets it: None.
