"""A user's own model without forking mpt: `--model=package.module:function` and
`--model=keras:NAME`, their options, their float32 output, and one line for each kind
of bad input."""

import json
import pathlib
import sys
import textwrap

import keras
import pytest

from helpers import USER_SCALE_LAYER, train_run
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

''' + USER_SCALE_LAYER + '''


class Block(keras.layers.Layer):
    def __init__(self, width, **kwargs):
        super().__init__(**kwargs)
        self.conv = keras.layers.Conv2D(width, 3, padding="same")
        self.bn = keras.layers.BatchNormalization()
    def call(self, x, training=False):
        return keras.ops.relu(self.bn(self.conv(x), training=training))


class Net(keras.Model):
    def __init__(self, num_classes, width, heads=1):
        super().__init__(name="users_subclassed")
        self.block, self.scale = Block(width, name="block"), Scale(name="scale")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.head = keras.layers.Dense(num_classes, name="head")
        self.heads = heads
    def call(self, x, training=False):
        y = self.head(self.pool(self.scale(self.block(x, training=training))))
        return {"logits": y, "aux": y} if self.heads == 2 else y


def subclassed(input_shape, num_classes, *, width=8):
    """Unbuilt: mpt builds it on the run's shape."""
    return Net(num_classes, width)


def needs_8px(input_shape, num_classes):
    class Fixed(keras.Model):
        def build(self, input_shape):
            if input_shape[1] != 8:
                raise ValueError(f"this net takes 8x8 images, not {input_shape}")
        def call(self, x):
            return keras.ops.reshape(x, (-1, 8 * 8 * 3))
    return Fixed()


def two_heads(input_shape, num_classes):
    return Net(num_classes, 4, heads=2)


def five_classes(input_shape, num_classes):
    return Net(5, 4)
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
    ("{m}:missing", ["has no function 'missing'", "its functions: five_classes, needs_8px, not_a_model, subclassed, tiny, two_heads"]),
    ("{m}:VALUE", ["has no function 'VALUE'"]),
    ("{m}:not_a_model", ["returned str, not a keras.Model"]),
    ("keras:NoSuchNet", ["keras.applications has no such model", "ResNet50"]),
    ("keras:ResNet50", ["keras:ResNet50", "32"]),  # Below its smallest input size.
    (":build", ["expected package.module:function"]),
    ("{m}:needs_8px", ["returned an unbuilt subclassed model that cannot be called on a "
                       "batch of shape (None, 16, 16, 3)", "takes 8x8 images"]),
    ("{m}:two_heads", ["the model's output is a dict (logits, aux), not one tensor",
                       "10 class scores"]),
    ("{m}:five_classes", ["shape (None, 5), not 10 classes"]),
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


def test_a_subclassed_model_is_wrapped_and_seen_inside(user_module, capsys):
  """An unbuilt subclassed model with a custom layer and layers inside a custom layer:
  built on the run's shape, wrapped (mpt's parts read `inputs`), every layer doing its
  own work seen by the dtype inspection, the fused-BatchNorm swap declined in one line."""
  from mpt import config
  from mpt.measure import dtypes
  from mpt.train.common.model import build_model
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  cfg = config.Config(model=f"{user_module}:subclassed", image_size=16,
                      batchnorm="fused")
  model = build_model(cfg, 10)
  report = dtypes.inspect_model(model)
  assert "keeping Keras' BatchNormalization for users_subclassed" in capsys.readouterr().out
  assert tuple(model.inputs[0].shape) == (None, 16, 16, 3)
  rows = {r["name"]: r for r in report["layers"]}
  assert [r["class"] for r in report["layers"]] == [
      "Conv2D", "BatchNormalization", "Scale", "GlobalAveragePooling2D", "Dense",
      "Activation"]
  conv = next(r for r in report["layers"] if r["class"] == "Conv2D")
  assert conv["flops"] == 2 * 16 * 16 * 8 * 3 * 3 * 3  # Multiply-adds, by hand.
  assert conv["output_dtype"] == "bfloat16" and rows["output_float32"]["output_dtype"] == "float32"
  # Its own multiply is not seen; named by its path inside the model mpt wrapped.
  assert report["uncounted_layers"] == ["users_subclassed/scale"]
  assert report["params"] == model.count_params() and report["gradients_match_variables"]


def test_a_subclassed_model_trains_from_the_command_line(tmp_path):
  """The user's shape end to end: `python -m mpt --model=users_nets:subclassed` in the
  user's folder, a child process; its run folder, tags and diagnosis read back."""
  import subprocess
  from helpers import read_events, tiny_flags
  from mpt.records import summary as summary_lib
  (tmp_path / "users_nets.py").write_text(textwrap.dedent(USER_MODULE))
  proc = subprocess.run(
      [sys.executable, "-m", "mpt", "--model=users_nets:subclassed", "--epochs=1",
       "--policy=mixed_bfloat16", "--warmup_steps=1", "--log_every=2",
       *tiny_flags(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "keeping Keras' BatchNormalization for users_subclassed" in proc.stdout
  run_dir = next((tmp_path / "logs").glob("*users_nets-subclassed*"))
  summary = summary_lib.read(run_dir / "summary.json")
  assert (summary.status, summary.steps, summary.policy) == ("completed", 5,
                                                             "mixed_bfloat16")
  dtypes = json.loads((run_dir / "dtypes.json").read_text())
  assert [l["class"] for l in dtypes["layers"]][:3] == ["Conv2D", "BatchNormalization",
                                                         "Scale"]
  assert summary.memory is not None and summary.memory.estimate.total_mb > 0
  events = read_events(run_dir)
  assert [s for s, _ in events["perf/step_time_ms"]] == [2, 4]
  assert "diagnosis/report" in events and "inspect/dtypes" in events
  assert "FLOPs not seen in custom layers' own ops" in \
      [v for _, v in events["inspect/dtypes"]][0]
  assert (run_dir / "diagnosis.md").exists() and "mpt: diagnosis of" in proc.stdout
