"""Model variants: a registry of builder functions, chosen by `--model`.

A variant is one builder plus one `@register` line. A builder takes the input shape,
the number of classes and keyword options, and never a dtype: the global Keras policy
(set by mpt/precision.py before the build) decides every layer's compute dtype. Only
the output is forced to float32, so the loss and its gradients start in full
precision, as the TensorFlow mixed-precision guide asks.

    @register
    def my_net(input_shape, num_classes, *, bn_momentum=0.9):
      ...
      return keras.Model(inputs, outputs)
"""

import inspect
from typing import Callable

import keras

from mpt.errors import UserError

Builder = Callable[..., keras.Model]
_REGISTRY: dict[str, Builder] = {}


def register(builder: Builder) -> Builder:
  """Adds `builder` to the registry under its function name."""
  _REGISTRY[builder.__name__] = builder
  return builder


def names() -> list[str]:
  return sorted(_REGISTRY)


def get(name: str) -> Builder:
  """The builder registered as `name`; UserError listing the valid names if none."""
  if name not in _REGISTRY:
    raise UserError(f"unknown --model={name!r}; valid: {', '.join(names())}")
  return _REGISTRY[name]


# Run-wide options mpt passes to every builder that takes them (a variant without
# BatchNorm simply does not declare them).
RUN_OPTIONS = ("bn_momentum", "bn_synchronized")


def build(name: str, input_shape: tuple[int, int, int], num_classes: int,
          run_options: dict | None = None, **options) -> keras.Model:
  """Builds variant `name` under the current global dtype policy.

  `options` are the user's and must all be accepted; `run_options` (RUN_OPTIONS,
  set by mpt from its flags) go only to builders that declare them.
  """
  builder = get(name)
  accepted = [p for p in inspect.signature(builder).parameters
              if p not in ("input_shape", "num_classes")]
  options = {**{k: v for k, v in (run_options or {}).items() if k in accepted},
             **options}
  unknown = sorted(set(options) - set(accepted))
  if unknown:
    raise UserError(f"model {name!r} has no option {unknown[0]!r}; accepted: "
                    f"{', '.join(accepted) or 'none'}")
  return builder(input_shape, num_classes, **options)


def classifier_head(x, num_classes: int):
  """Logits in the policy's dtype, softmax forced to float32 (the model's output)."""
  x = keras.layers.Dense(num_classes, name="logits")(x)
  return keras.layers.Activation("softmax", dtype="float32", name="probs")(x)


@register
def seed_convnet(input_shape, num_classes, *, bn_momentum: float = 0.9,
                 bn_synchronized: bool = False) -> keras.Model:
  """The seed experiment's convnet: three strided convs with BatchNorm, GAP, dense.

  Filters are multiples of 8 as the TF guide asks; the first conv still sees 3 input
  channels. Keras' BatchNorm default momentum is 0.99 (the seed's); mpt defaults to 0.9
  so that short runs validate with settled moving statistics. `bn_synchronized`:
  batch statistics over all replicas (mpt sets it under a multi-replica strategy).
  """
  inputs = keras.Input(input_shape, name="image")
  x = inputs
  for i, (filters, kernel) in enumerate(((32, 5), (64, 7), (128, 11)), start=1):
    x = keras.layers.Conv2D(filters, kernel, strides=2, padding="same",
                            activation="relu", name=f"conv{i}")(x)
    x = keras.layers.BatchNormalization(momentum=bn_momentum,
                                        synchronized=bn_synchronized, name=f"bn{i}")(x)
  x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
  return keras.Model(inputs, classifier_head(x, num_classes), name="seed_convnet")
