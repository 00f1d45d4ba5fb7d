"""One call of any Keras model, watched layer by layer: what each layer received and
returned, for models of every kind (Functional, Sequential, subclassed, custom layers,
nested models).

A Functional model names its layers' outputs (`layer.output`) and a probe model could
read them; a subclassed model (Keras 3.15: `inputs`/`outputs` exist only on Functional
and Sequential models) and the layers inside a custom layer have none. So the model is
called once, eagerly, while `keras.layers.Layer.__call__` is wrapped for that call
only: every layer call (nested ones included) is recorded with its inputs' shapes and
its outputs, whatever the model's style. Written for Keras 3.15 (every layer call goes
through `Layer.__call__`, a subclass may extend it and call super);
tests/measure/test_dtypes.py fails loudly when a Keras upgrade stops routing calls
through it (a subclassed model's layers would go unseen).

`input_shape(model)` finds the shape to call a model with: its `inputs`, else the
shape Keras built it with (`get_build_config`), else None (the caller says so).
"""

import contextlib
import dataclasses
import threading
from typing import Any

import keras

_LOCK = threading.Lock()


@dataclasses.dataclass
class Call:
  """One layer call seen: the layer, its first input's shape, its first output."""
  layer: keras.layers.Layer
  input_shape: tuple | None
  output: Any  # The first tensor the layer returned (None: it returned no tensor).
  calls: int = 1  # Times the layer was called in the model's call (shared layers).
  leaf: bool = True  # No other layer was called inside its call: its work is its own.


def _first_tensor(value) -> Any:
  for leaf in keras.tree.flatten(value):
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
      return leaf
  return None


@contextlib.contextmanager
def _watching(seen: dict[int, Call]):
  """Records every layer call made inside the block (one thread at a time)."""
  original = keras.layers.Layer.__call__

  stack: list[Call] = []

  def watched(layer, *args, **kwargs):
    if stack:
      stack[-1].leaf = False
    call = seen.get(id(layer))
    if call is not None:
      call.calls += 1
    else:
      first = _first_tensor(args[0] if args else next(iter(kwargs.values()), None))
      call = seen[id(layer)] = Call(
          layer, tuple(first.shape) if first is not None else None, None)
    stack.append(call)
    try:
      out = original(layer, *args, **kwargs)
    finally:
      stack.pop()
    if call.output is None:
      call.output = _first_tensor(out)
    return out

  with _LOCK:
    keras.layers.Layer.__call__ = watched
    try:
      yield
    finally:
      keras.layers.Layer.__call__ = original


def layer_calls(model: keras.Model, x) -> tuple[list[Call], Any]:
  """(every layer call inside one inference call of `model` on `x`, in call order,
  the model's output). The model's own call is not among them."""
  seen: dict[int, Call] = {}
  with _watching(seen):
    out = model(x, training=False)
  seen.pop(id(model), None)
  return list(seen.values()), out


def input_shape(model: keras.Model) -> tuple | None:
  """The model's input shape with its batch dimension (None, ...), or None if neither
  its inputs nor its build tell it."""
  inputs = getattr(model, "inputs", None)  # Functional and Sequential only.
  if inputs:
    return tuple(inputs[0].shape)
  config = model.get_build_config() if model.built else None
  shape = (config or {}).get("input_shape")
  if shape and all(isinstance(d, (int, type(None))) for d in shape):
    return tuple(shape)
  return None
