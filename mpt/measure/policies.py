"""Which dtype each layer of a built model computes in, the model's layers under another
policy for a block (and back as they were), and a per-layer plan as the object Keras 3
applies itself (a `keras.dtype_policies.DTypePolicyMap`, written as policy_map.json).

A built Keras 3 layer computes in its policy's dtype from its next trace on, and all
three policies keep variables in float32, so a model need not be rebuilt to be timed
or sampled under another policy: `switched` sets the layers' policies, the caller
traces (a traced graph keeps the dtypes it was traced with) or calls, and the block's
end puts every layer's policy object back, the very object it had.

Keras 3.15's behaviour, relied on here only (tests/measure/test_policies.py fails
loudly when a Keras upgrade changes it):
- `layer.dtype_policy = p` on a layer that holds a DTypePolicyMap (a model built under
  one as its global policy) writes p into that shared map at the layer's path, so the
  block's end puts the map's entries back rather than setting the map on the layer;
- a layer made without `dtype=` under a global policy holds that one policy object (a
  map, too), a layer made with `dtype=` an object of its own, and so does every layer
  of a clone (`keras.models.clone_model`, --batchnorm=fused). A layer "follows the
  model" when it holds the model's object; under a 16-bit model policy also when it
  holds one of the same name (a clone's layers do; a float32 pin stands out), and
  under a map when the map gives its path the map's default. So the command line
  builds the model it times under a 16-bit policy (mpt/train/before_step1/cost.py).
"""

import contextlib
import pathlib
import re
from typing import Callable, Iterator

import keras

from mpt import config
from mpt import files
from mpt import speech
from mpt.models import fused_bn

PolicyMap = keras.dtype_policies.DTypePolicyMap
SIXTEEN_BIT = set(config.SIXTEEN.values())  # mpt/config.py: the one table.
# A chooser: (a layer, whether it follows the model's policy) -> the policy it gets
# inside the block, or None: it keeps its own.
Chooser = Callable[[keras.layers.Layer, bool], str | None]


def layers_of(model: keras.Model) -> list[keras.layers.Layer]:
  """The model itself and every layer in it, nested ones included."""
  return [model] + fused_bn.all_layers(model)


def resolved(layer: keras.layers.Layer) -> keras.DTypePolicy:
  """The policy `layer` computes under (under a map: the map's entry for its path)."""
  held = layer.dtype_policy
  if isinstance(held, PolicyMap):
    return held[layer.path] if layer.path else held.default_policy
  return held


def follows(model: keras.Model) -> dict[int, bool]:
  """{id(layer): whether it follows the model's policy} for the model and its layers
  (False: a policy of its own, such as a float32 softmax under a mixed policy)."""
  layers = layers_of(model)
  common = model.dtype_policy
  held = {id(l): l.dtype_policy for l in layers}
  if isinstance(common, PolicyMap):
    return {id(l): held[id(l)] is common and resolved(l) is common.default_policy
            for l in layers}
  by_name = common.compute_dtype in SIXTEEN_BIT  # A float32 pin then stands out.
  found = {id(l): held[id(l)] is common or (by_name and held[id(l)].name == common.name)
           for l in layers}
  # Under float32 a wrapper's copies (a Bidirectional's forward and backward layers,
  # made from its layer's config) hold a float32 object of their own, as a pin does:
  # a layer kept by a following layer, and not in a model's graph (where a float32
  # pin sits), follows with it.
  todo = [l for l in layers if found[id(l)]]
  while todo:
    parent = todo.pop()
    graph = {id(l) for l in getattr(parent, "layers", [])} \
        if isinstance(parent, keras.Model) else set()
    for child in fused_bn.held(parent):
      if (id(child) in found and not found[id(child)] and id(child) not in graph
          and resolved(child).name == resolved(parent).name):
        found[id(child)] = True
        todo.append(child)
  return found


@contextlib.contextmanager
def _switched(layers: list, own: dict[int, bool], choose: Chooser):
  had = {id(l): l.dtype_policy for l in layers}
  maps = {id(p): (p, list(p.items())) for p in had.values() if isinstance(p, PolicyMap)}
  dtypes = {id(l): resolved(l).compute_dtype for l in layers}
  changed = []
  try:
    for layer in layers:
      policy = choose(layer, own.get(id(layer), True))
      if policy is not None and policy != resolved(layer).name:
        layer.dtype_policy = policy
        changed.append(layer)
    yield dtypes
  finally:
    for layer in changed:  # Under a map, the setter wrote the map: put back below.
      if not (isinstance(had[id(layer)], PolicyMap) and layer.path):
        layer.dtype_policy = had[id(layer)]
    for found, items in maps.values():
      for path in list(found):
        del found[path]
      for path, policy in items:
        found[path] = policy


@contextlib.contextmanager
def switched(model: keras.Model, choose: Chooser) -> Iterator[dict[int, str]]:
  """Inside the block each layer computes under `choose(layer, follows)` (None: as
  it was); yields {id(layer): the compute dtype it had}. The block's end gives every
  switched layer back the policy object it held, the model's own included, and a
  DTypePolicyMap the entries it had."""
  with _switched(layers_of(model), follows(model), choose) as dtypes:
    yield dtypes


@contextlib.contextmanager
def one_layer(layer: keras.layers.Layer, policy: str) -> Iterator[None]:
  """`layer` alone under `policy` inside the block, then as it was."""
  with _switched([layer], {}, lambda l, own: policy):
    yield


def plain(policy: keras.DTypePolicy) -> keras.DTypePolicy:  # A map: its default.
  return policy.default_policy if isinstance(policy, PolicyMap) else policy


def sixteen(policy: keras.DTypePolicy) -> str | None:
  """The 16-bit policy a global policy, or a map's default and entries, computes in
  (config.sixteen_bit's rule); None where every layer is float32."""
  pairs = [(path, p.name) for path, p in policy.items()] \
      if isinstance(policy, PolicyMap) else []
  return config.sixteen_bit(plain(policy).name, pairs)


def entries(policy: keras.DTypePolicy) -> str:
  """A map's entries as `path=policy,...` ("" for a plain policy)."""
  if not isinstance(policy, PolicyMap):
    return ""
  return ",".join(f"{path}={p.name}" for path, p in policy.items())


def matches(layer: keras.layers.Layer, pattern: str) -> bool:
  """Whether a --layer_policy pattern names `layer`: its class, or its whole name."""
  return type(layer).__name__ == pattern or bool(re.fullmatch(pattern, layer.name))


def uniform(policy: str, pairs: list[tuple[str, str]] = ()) -> Chooser:
  """The chooser of a run under `policy`: the layers that follow the model take it,
  and the first of `pairs` ((pattern, policy): --layer_policy's, or a per-class
  plan's) that `matches` a layer puts it in that policy; other layers with a policy
  of their own keep it."""
  def choose(layer: keras.layers.Layer, follows_model: bool) -> str | None:
    if not isinstance(layer, keras.Model):
      named = next((p for pattern, p in pairs if matches(layer, pattern)), None)
      if named:
        return named
    return policy if follows_model else None
  return choose


def to_float32(layer: keras.layers.Layer, follows_model: bool) -> str | None:
  """Every 16-bit layer in float32 (the numerics' pass), its own policy or not."""
  return "float32" if resolved(layer).compute_dtype in SIXTEEN_BIT else None


def to_float16(layer: keras.layers.Layer, follows_model: bool) -> str | None:
  """mixed_float16 for every layer that computes in a 16-bit dtype now or follows the
  model's policy (in a float32 run: the layers mixed_float16 would make 16-bit); a
  layer pinned to float32 stays."""
  if resolved(layer).compute_dtype in SIXTEEN_BIT or follows_model:
    return "mixed_float16"
  return None


def map_of(model: keras.Model, pairs: list[tuple[str, str]] = ()
           ) -> tuple[PolicyMap, list[str]]:
  """(the DTypePolicyMap of `model` as it computes now, the layers of the plan `pairs`
  it cannot hold): its own policy as the default, and each layer that computes under
  another keyed by its path (a script that builds the same model under this map as its
  global policy gets the same dtypes). Keras 3.15 gives a path only to a layer with
  weights, and a layer without one computes under the map's default: such a layer that
  a pattern of the plan moved is named in the list (a layer that pins its own
  `dtype=` keeps it in the script's code anyway)."""
  default = plain(model.dtype_policy)
  found = PolicyMap(default_policy=keras.DTypePolicy(default.name))
  unkeyed = []
  for layer in fused_bn.all_layers(model):
    mine = resolved(layer)
    if mine.name == default.name or isinstance(layer, keras.Model):
      continue
    if layer.path:
      found[layer.path] = keras.DTypePolicy(mine.name)
    elif any(matches(layer, pattern) for pattern, _ in pairs):
      unkeyed.append(layer.name)
  return found, unkeyed


def plan_map(model: keras.Model, policy: str, pairs: list[tuple[str, str]]
             ) -> tuple[PolicyMap, list[str]]:
  """`map_of` `model` under `policy` with `pairs` ((pattern, policy): a per-layer
  plan) over it, the model left as it was."""
  with switched(model, uniform(policy, pairs)):
    return map_of(model, pairs)


def write_map(run_dir: pathlib.Path, found: tuple[PolicyMap, list[str]],
              why: str) -> pathlib.Path:
  """policy_map.json in `run_dir` from `map_of`'s (map, layers it cannot hold): the
  map as Keras serialises it, under `policy_map`, with the Keras version that wrote
  it, why, and the layers the map cannot hold (`unkeyed`)."""
  where = pathlib.Path(run_dir) / speech.MAP_FILE
  files.write_json(where, {"keras_version": keras.__version__, "why": why,
                           "policy_map": keras.saving.serialize_keras_object(found[0]),
                           "unkeyed": found[1]})
  return where
