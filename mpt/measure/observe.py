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
  # Its first call's first argument (a tensor, or a list/dict of them, as Add and
  # Concatenate take), and every tensor it returned: mpt/measure/layercost.py times
  # the layer on that argument's shapes and finds which layer made each input.
  argument: Any = None
  outputs: list = dataclasses.field(default_factory=list)
  # Its path inside the model called: the names of the layers it was called from,
  # then its own (`transformer_encoder/multi_head_attention/query`).
  path: str = ""


def first_tensor(value) -> Any:
  for leaf in keras.tree.flatten(value):
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
      return leaf
  return None


@contextlib.contextmanager
def watching(seen: dict[int, Call]):
  """Records every layer call made inside the block into `seen`, by the layer's id
  (one thread at a time); a gradient tape around it sees the same calls."""
  original = keras.layers.Layer.__call__

  stack: list[Call] = []

  def watched(layer, *args, **kwargs):
    if stack:
      stack[-1].leaf = False
    call = seen.get(id(layer))
    if call is not None:
      call.calls += 1
    else:
      argument = args[0] if args else next(iter(kwargs.values()), None)
      first = first_tensor(argument)
      # The outermost call is the model's own (layer_calls): not part of a path.
      # (Model.__call__ reaches the wrapped Layer.__call__ again: skip its repeats.)
      path = "/".join([c.layer.name for c in stack if c is not stack[0]] + [layer.name])
      call = seen[id(layer)] = Call(
          layer, tuple(first.shape) if first is not None else None, None,
          argument=argument, path=path)
    stack.append(call)
    try:
      out = original(layer, *args, **kwargs)
    finally:
      stack.pop()
    if call.output is None:
      call.output = first_tensor(out)
      call.outputs = [t for t in keras.tree.flatten(out) if hasattr(t, "shape")]
    return out

  with _LOCK:
    keras.layers.Layer.__call__ = watched
    try:
      yield stack  # The calls running now, innermost last.
    finally:
      keras.layers.Layer.__call__ = original


def unique_names(calls: list[Call]) -> dict[int, str]:
  """A unique name per layer called, by id: its path inside the model (a layer nested
  in another is `outer/inner`), where two paths are still equal a later one with a
  prime. A prefix every leaf shares (a model wrapping the one that holds them all)
  is left out."""
  paths = {id(c.layer): (c.path or c.layer.name).split("/") for c in calls}
  leaves = [paths[id(c.layer)] for c in calls if c.leaf]
  common = 0
  while leaves and all(len(p) > common + 1 and p[common] == leaves[0][common]
                       for p in leaves):
    common += 1
  found, used = {}, set()
  for call in calls:
    parts = paths[id(call.layer)]
    name = "/".join(parts[common:]) or parts[-1]
    while name in used:
      name += "'"
    used.add(name)
    found[id(call.layer)] = name
  return found


def layer_calls(model: keras.Model, x) -> tuple[list[Call], Any]:
  """(every layer call inside one inference call of `model` on `x`, in call order,
  the model's output). The model's own call is not among them."""
  seen: dict[int, Call] = {}
  with watching(seen):
    out = model(x, training=False)
  seen.pop(id(model), None)
  return list(seen.values()), out


def input_shape(model: keras.Model) -> tuple | None:
  """The model's (first) input shape with its batch dimension (None, ...): its
  `inputs`, else the shape Keras built it with (`get_build_config`), else None (the
  caller says so)."""
  inputs = getattr(model, "inputs", None)  # Functional and Sequential only.
  if inputs:
    return tuple(inputs[0].shape)
  config = model.get_build_config() if model.built else None
  shape = (config or {}).get("input_shape")
  if shape and all(isinstance(d, (int, type(None))) for d in shape):
    return tuple(shape)
  return None


def has_call(model: keras.Model) -> bool:
  """Whether the model can be called: a Functional or Sequential model, or a subclass
  with its own call() (a GAN or a VAE that only holds its parts has none)."""
  return getattr(model, "inputs", None) is not None or \
      type(model).call is not keras.Model.call


def part_names(holder: keras.Model | None, models: list[keras.Model]) -> list[str]:
  """A unique name per part: its own, or where two parts share one (a copy made by
  clone_model has its original's name) the attribute `holder` keeps each under
  (`network`, `ema_network`); a name used already gets a prime."""
  attributes = {id(v): k for k, v in vars(holder).items()
                if isinstance(v, keras.Model)} if holder is not None else {}
  shared = {m.name for m in models if [n.name for n in models].count(m.name) > 1}
  found = []
  for model in models:
    name = attributes.get(id(model), model.name) if model.name in shared else model.name
    while name in found:
      name += "'"
    found.append(name)
  return found


def parts(model: keras.Model) -> list[keras.Model]:
  """The models a model with no call() holds (its generator and discriminator, its
  encoder and decoder), nested ones found through those with no call of their own."""
  found = []
  for layer in model.layers:
    if isinstance(layer, keras.Model):
      found += [layer] if has_call(layer) else parts(layer)
  return found


def sample_input(model: keras.Model, batch: int = 2, seed: int = 0):
  """An input the model can be called with, made from what it declares: its inputs'
  structure (list, dict, nested), shapes and dtypes (strings, integers and floats), or
  the shape it was built with; None when it declares neither. Unknown dimensions other
  than the batch's are 8."""
  declared = getattr(model, "input", None) if getattr(model, "inputs", None) else None
  if declared is None:
    shape = input_shape(model)
    return None if shape is None else _tensor(shape, "float32", batch, seed)
  return keras.tree.map_structure(
      lambda t: _tensor(tuple(t.shape), t.dtype, batch, seed), declared)


def _tensor(shape: tuple, dtype: str, batch: int, seed: int):
  import tensorflow as tf  # Only where a model is called.
  shape = (batch,) + tuple(8 if d is None else d for d in shape[1:])
  dtype = keras.backend.standardize_dtype(dtype)
  if dtype == "string":
    return tf.fill(shape, "mpt sample text")
  if dtype == "bool" or "int" in dtype:
    return tf.zeros(shape, dtype)
  return tf.cast(tf.random.stateless_uniform(shape, seed=(seed, 0)), dtype)


def describe_inputs(x) -> dict[str, list]:
  """Per-example shapes of an input structure, by input name (a dict's keys, a
  list's positions, `input` for a single tensor)."""
  leaves = keras.tree.flatten_with_path(x) if not hasattr(x, "shape") else [((), x)]
  found = {}
  for path, leaf in leaves:
    if hasattr(leaf, "shape"):
      name = "/".join(str(p) for p in path) or "input"
      found[name] = [None if d is None else int(d) for d in tuple(leaf.shape)[1:]]
  return found


def image_size(inputs: dict[str, list]) -> int | None:
  """The image size of a model fed one (height, width, channels) input of square
  images with at most 4 channels; None for anything else (vectors, sequences,
  several inputs)."""
  if len(inputs) != 1:
    return None
  shape = next(iter(inputs.values()))
  if len(shape) == 3 and shape[0] and shape[0] == shape[1] and (shape[2] or 0) <= 4:
    return int(shape[0])
  return None
