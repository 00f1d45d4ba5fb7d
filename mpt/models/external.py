"""Builders from outside the registry: a user's own function and keras.applications.

  --model=package.module:function   imports `function` from the user's code; the same
                                    contract as a registered builder: input shape,
                                    number of classes and keyword options in, an
                                    uncompiled keras.Model out, built under the global
                                    policy (the caller's; a builder never sets it)
  --model=keras:NAME                keras.applications.NAME(weights=None) at the run's
                                    image size and classes; its options (alpha, ...)
                                    come from --model_opts

Both answer bad input with one UserError line saying what was expected. The model's
output is forced to float32 by mpt/models/__init__.py's `build` when a builder did
not do it, so the loss starts in full precision under every policy.
"""

import functools
import importlib
import inspect
import sys

import keras

from mpt.errors import UserError

CONTRACT = ("a function (input_shape, num_classes, **options) returning an uncompiled "
            "keras.Model")
# keras.applications arguments that mpt sets itself (the rest are --model_opts).
_SET_BY_MPT = ("include_top", "weights", "input_tensor", "input_shape", "pooling",
               "classes", "classifier_activation", "name")


def resolve(name: str):
  """The builder `name` (`keras:NAME` or `package.module:function`) stands for."""
  if name.startswith("keras:"):
    return keras_application(name.partition(":")[2])
  module_name, _, attr = name.partition(":")
  if not module_name or not attr:
    raise UserError(f"--model={name!r}: expected package.module:function, {CONTRACT}")
  if "" not in sys.path:  # `mpt` as a console script: the user's folder, as -m has it.
    sys.path.insert(0, "")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise UserError(f"--model={name!r}: module {module_name!r} does not import ({e}); "
                    f"expected package.module:function, {CONTRACT}") from None
  builder = getattr(module, attr, None)
  if not callable(builder):
    found = sorted(n for n, v in vars(module).items()
                   if inspect.isfunction(v) and not n.startswith("_"))
    raise UserError(f"--model={name!r}: {module_name} has no function {attr!r} "
                    f"(its functions: {', '.join(found) or 'none'}); expected {CONTRACT}")
  return builder


def keras_application(app_name: str):
  """A builder for keras.applications.`app_name`, untrained, with its own options."""
  app = getattr(keras.applications, app_name, None)
  names = sorted(n for n, v in vars(keras.applications).items()
                 if n[:1].isupper() and callable(v))
  if app_name not in names:
    raise UserError(f"--model=keras:{app_name}: keras.applications has no such model; "
                    f"valid: {', '.join(names)}")
  params = inspect.signature(app).parameters
  options = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
             for n, p in params.items() if n not in _SET_BY_MPT]

  @functools.wraps(app)
  def build(input_shape, num_classes, **opts):
    try:
      # Logits in the policy's dtype; `build` adds the float32 softmax.
      return app(weights=None, input_shape=tuple(input_shape), classes=num_classes,
                 classifier_activation=None, **opts)
    except ValueError as e:  # e.g. an image size below the architecture's minimum.
      raise UserError(f"--model=keras:{app_name}: {str(e).splitlines()[0]}") from None

  build.__signature__ = inspect.Signature(
      [inspect.Parameter("input_shape", inspect.Parameter.POSITIONAL_OR_KEYWORD),
       inspect.Parameter("num_classes", inspect.Parameter.POSITIONAL_OR_KEYWORD)] +
      options)
  build.logits = True
  return build


def checked(name: str, model, input_shape: tuple, num_classes: int) -> keras.Model:
  """`model` as a Functional model with one tensor output; UserError saying what the
  builder returned otherwise. A subclassed model (no `inputs`: Keras 3 has them only on
  Functional and Sequential models) is called on a symbolic batch of the run's shape,
  which builds it if it is not built, and wrapped, so that every part of mpt reads it
  the same way (its layers stay its own, seen inside the wrapper)."""
  if not isinstance(model, keras.Model):
    raise UserError(f"--model={name!r} returned {type(model).__name__}, not a "
                    f"keras.Model; expected {CONTRACT}")
  if getattr(model, "inputs", None):
    outputs = model.outputs
  else:
    inputs = keras.Input(tuple(input_shape), name="image")
    try:
      outputs = model(inputs)
    except Exception as e:  # The user's call: any error is theirs to see, in one line.
      what = "an unbuilt" if not model.built else "a"
      raise UserError(f"--model={name!r} returned {what} subclassed model that cannot "
                      f"be called on a batch of shape {(None, *input_shape)}: "
                      f"{type(e).__name__}: "
                      f"{(str(e).strip().splitlines() or [''])[0][:300]}") from None
    model = keras.Model(inputs, outputs, name=model.name) if _one_tensor(outputs) \
        else model
  if not _one_tensor(outputs):
    raise UserError(f"--model={name!r}: the model's output is {_describe(outputs)}, not "
                    f"one tensor; mpt trains a classifier: one output of {num_classes} "
                    "class scores")
  if model.outputs[0].shape[-1] != num_classes:
    raise UserError(f"--model={name!r}: the model's output has shape "
                    f"{tuple(model.outputs[0].shape)}, not {num_classes} classes (the "
                    f"builder gets num_classes={num_classes})")
  return model


def _one_tensor(outputs) -> bool:
  if isinstance(outputs, (list, tuple)) and len(outputs) == 1:
    outputs = outputs[0]
  return isinstance(outputs, keras.KerasTensor)


def _describe(outputs) -> str:
  if isinstance(outputs, dict):
    return f"a dict ({', '.join(map(str, outputs))})"
  if isinstance(outputs, (list, tuple)):
    return f"a {type(outputs).__name__} of {len(outputs)}"
  return type(outputs).__name__


def float32_output(model: keras.Model, logits: bool) -> keras.Model:
  """The model with a float32 output: softmax after logits, else a cast if needed."""
  if not logits and keras.backend.standardize_dtype(model.outputs[0].dtype) == "float32":
    return model
  layer = keras.layers.Activation("softmax" if logits else "linear", dtype="float32",
                                  name="probs" if logits else "output_float32")
  return keras.Model(model.inputs, layer(model.outputs[0]), name=model.name)
