"""Model variants: a registry of builder functions, chosen by `--model`, with options
from `--model_opts=key=value,...`.

A variant is one builder plus one `@register` line. A builder takes the input shape,
the number of classes and keyword options, and never a dtype: the global Keras policy
(set by mpt/train/common/precision.py before the build) decides every layer's compute dtype. Only
the output is forced to float32 (`classifier_head`), so the loss and its gradients
start in full precision, as the TensorFlow mixed-precision guide asks.

    @register
    def my_net(input_shape, num_classes, *, width: int = 64, bn_momentum=0.9):
      '''One line: what this variant is for.'''
      ...
      return keras.Model(inputs, classifier_head(x, num_classes), name="my_net")

The variants live in convnets.py (seed_convnet, seed_convnet_aligned, resnet,
mobilenet) and vit.py; docs/usage.md "Adding a model variant" walks through one.
A user's own builder (`--model=package.module:function`) and keras.applications
(`--model=keras:NAME`) come through external.py, with the same contract;
fused_bn.py swaps Keras' BatchNormalization for TF's fused kernel (--batchnorm).
"""

import inspect
from typing import Callable

import keras

from mpt import flagvalues
from mpt import modelnames
from mpt.errors import UserError
from mpt.models import external

Builder = Callable[..., keras.Model]
_REGISTRY: dict[str, Builder] = {}


def register(builder: Builder) -> Builder:
  """Adds `builder` to the registry under its function name. A second builder under a
  taken name is a mistake (two modules defining the same variant, or a copied function
  not renamed): it would silently replace the first."""
  taken = _REGISTRY.get(builder.__name__)
  if taken is not None and taken is not builder:
    raise ValueError(f"a model named {builder.__name__!r} is already registered "
                     f"(by {taken.__module__}); rename one of them")
  _REGISTRY[builder.__name__] = builder
  return builder


def names() -> list[str]:
  return sorted(_REGISTRY)


def get(name: str) -> Builder:
  """The builder registered as `name`, or a user's / keras.applications builder for a
  `module:function` / `keras:NAME` name (models/external.py); UserError if none."""
  if ":" in name:  # `keras:NAME` or `package.module:function`.
    return external.resolve(name)
  if name not in _REGISTRY:
    raise UserError(modelnames.unknown(name, names()))
  return _REGISTRY[name]


# Run-wide options mpt passes to every builder that takes them (a variant without
# BatchNorm simply does not declare them).
RUN_OPTIONS = ("bn_momentum", "bn_synchronized")


def build(name: str, input_shape: tuple[int, int, int], num_classes: int,
          run_options: dict | None = None, **options) -> keras.Model:
  """Builds variant `name` under the current global dtype policy. `options` are the
  user's and must all be accepted; `run_options` (RUN_OPTIONS, set by mpt from its
  flags) go only to builders that declare them."""
  builder = get(name)
  accepted = [p for p in inspect.signature(builder).parameters
              if p not in ("input_shape", "num_classes")]
  options = {**{k: v for k, v in (run_options or {}).items() if k in accepted},
             **options}
  unknown = sorted(set(options) - set(accepted))
  if unknown:
    raise UserError(f"model {name!r} has no option {unknown[0]!r}; accepted: "
                    f"{', '.join(accepted) or 'none'}")
  model = builder(input_shape, num_classes, **options)
  if ":" not in name:
    return model
  return external.float32_output(external.checked(name, model, input_shape, num_classes),
                                 getattr(builder, "logits", False))


def _literal(value: str):
  for kind in (int, float):
    try:
      return kind(value)
    except ValueError:
      pass
  return value


def parse_opts(name: str, spec: str) -> dict:
  """`--model_opts="depth=10,width=32"` -> {"depth": 10, "width": 32}, each value
  converted to the type of the builder's default; UserError naming what is wrong."""
  params = inspect.signature(get(name)).parameters  # Checks the name, too.
  if not spec:
    return {}
  accepted = [p for p in params if p not in ("input_shape", "num_classes")
              and p not in RUN_OPTIONS]
  opts = {}
  for key, value in flagvalues.parse_kv(spec, "model_opts"):
    if key not in accepted:
      raise UserError(f"model {name!r} has no option {key!r}; accepted: "
                      f"{', '.join(accepted) or 'none'}")
    default = params[key].default
    # A user's option without a default, or defaulting to None: a number if it reads
    # as one, else the string.
    kind = type(default) if default not in (None, inspect.Parameter.empty) else _literal
    try:
      opts[key] = flagvalues.parse_bool(value) if kind is bool else kind(value)
    except (ValueError, KeyError):
      raise UserError(f"--model_opts: {key}={value!r} is not a {kind.__name__}") from None
  return opts


def classifier_head(x, num_classes: int):
  """Logits in the policy's dtype, softmax forced to float32 (the model's output)."""
  x = keras.layers.Dense(num_classes, name="logits")(x)
  return keras.layers.Activation("softmax", dtype="float32", name="probs")(x)


# The variants register themselves on import (after the registry above exists).
from mpt.models import convnets  # noqa: E402,F401
from mpt.models import vit  # noqa: E402,F401
