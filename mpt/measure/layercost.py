"""Per-layer cost here: each layer's forward and backward time under each policy at the
run's shapes, the cast between dtypes, and the optimizer's update (the record is
mpt/records/layers.py, which prices uniform policies and per-layer plans from it).

The model is called once, eagerly, at batch 2 with every layer call watched
(mpt/measure/observe.py): each leaf layer's first argument (its shapes) and the layer
that made each of its inputs (the edges where a plan may add casts). Layers of one
class with the same settings and input shapes are timed once: a fresh copy of the
layer (`from_config`) under each policy, called on random inputs at the run's batch
already in the policy's compute dtype (the cast into it is priced at the edges), in
a tf.function that runs its forward pass and the gradients of its inputs and weights.
Its calls are timed by the one timer (mpt/measure/timer.py), its figure less one empty
tf.function call's dispatch. A policy whose op family the machine's cached kernel
table (mpt/machine/kernels.py) measured PATHOLOGICAL times float32's is not run at
all: its time is float32's by that ratio (oneDNN's reference float16 convolution on a
Sapphire Rapids takes seconds per layer, the kernel table already knows it).
"""

import itertools
import time
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from mpt import config
from mpt.machine import fastpath
from mpt.measure import observe
from mpt.measure import timer
from mpt.records.cost import times
from mpt.records.layers import Edge, LayerCosts, LayerRow

ROW_BUDGET_S = 1.0  # Each layer row's calls besides two of float32's.
CAST_SIZES = (1 << 14, 1 << 22)  # Elements: a cast's fixed cost, and its rate.
Clock = Callable[[], float]


class _Leaf:
  """A tensor of the argument: its per-example shape and dtype."""

  def __init__(self, t):
    self.shape = tuple(t.shape)[1:]
    self.dtype = keras.backend.standardize_dtype(t.dtype)

  def __repr__(self) -> str:
    return f"{self.dtype}{list(self.shape)}"


def _signature(layer: keras.layers.Layer, spec) -> str:
  settings = {k: v for k, v in layer.get_config().items()
              if k not in ("name", "dtype", "trainable")}
  return f"{type(layer).__name__}|{settings!r}|{spec!r}"


def survey(model: keras.Model, x) -> tuple[list[tuple[LayerRow, Any, Any]],
                                           list[Edge], list[str]]:
  """([(row, a layer of it, its argument's spec)], the edges at batch 1, layers not
  timeable) of one call of `model` on `x` (a batch of 2)."""
  calls, _ = observe.layer_calls(model, x)
  leaves = [c for c in calls if c.leaf and c.argument is not None]
  names = observe.unique_names(calls)
  made_by = {id(t): names[id(c.layer)] for c in leaves for t in c.outputs}
  made_by.update({id(t): None for t in keras.tree.flatten(x) if hasattr(t, "shape")})
  rows: dict[str, tuple[LayerRow, Any, Any]] = {}
  edges, skipped = [], []
  for call in leaves:
    name = names[id(call.layer)]
    try:  # The argument's structure with each tensor as a _Leaf.
      spec = keras.tree.map_structure(
          lambda t: _Leaf(t) if hasattr(t, "shape") else t, call.argument)
      key = _signature(call.layer, spec)
    except (NotImplementedError, TypeError, ValueError) as e:
      skipped.append(f"{name}: {type(e).__name__}")
      continue
    tensors = [t for t in keras.tree.flatten(call.argument) if hasattr(t, "shape")]
    if key not in rows:
      shapes = [list(t.shape)[1:] for t in tensors]
      rows[key] = (LayerRow(type(call.layer).__name__, [], 0, shapes), call.layer, spec)
    rows[key][0].names.append(name)
    rows[key][0].calls += call.calls
    for t in tensors:
      if id(t) in made_by and t.dtype.is_floating:
        per_example = int(np.prod(tuple(t.shape)[1:]))
        edges.append(Edge(made_by[id(t)], name, per_example))
  return list(rows.values()), edges, skipped


def _inputs(spec, batch: int, dtype: str, seed: int = 0):
  """Random inputs of `spec` at `batch`, floats in `dtype` (integers: zeros)."""
  def make(leaf):
    if not isinstance(leaf, _Leaf):
      return leaf
    shape = (batch,) + tuple(d or 8 for d in leaf.shape)
    if "float" in leaf.dtype:
      return tf.cast(tf.random.stateless_uniform(shape, (seed, 1)), dtype)
    return tf.zeros(shape, leaf.dtype)
  return keras.tree.map_structure(make, spec)


def _step(layer: keras.layers.Layer, policy: str, spec, batch: int, jit: bool):
  """A fresh copy of `layer` under `policy` and its forward + backward as a callable
  (traced and run once on the first call)."""
  settings = {**layer.get_config(), "dtype": policy}
  settings.pop("name", None)
  fresh = type(layer).from_config(settings)
  dtype = config.POLICY_DTYPE[policy]
  args = _inputs(spec, batch, dtype)
  floats = [t for t in keras.tree.flatten(args) if t.dtype.is_floating]

  @tf.function(jit_compile=jit)
  def step(args, floats):
    with tf.GradientTape() as tape:
      tape.watch(floats)
      out = keras.tree.flatten(fresh(args, training=True))[0]
    if not out.dtype.is_floating:
      return [out]
    wrt = floats + fresh.trainable_variables
    grads = tape.gradient(out, wrt, output_gradients=tf.ones_like(out))
    return [g for g in grads if g is not None] or [out]

  return lambda: step(args, floats)


def _settled(make: timer.Make, clock: Clock) -> float:
  """One function's call, ms, by the one timer (`make()` gives it, traced)."""
  return timer.run([("it", make)], clock=clock)["it"].ms or 0.0


def _overhead(clock: Clock) -> float:
  """One call of an empty tf.function, ms: what timing a layer adds to it."""
  x = tf.zeros((8,))
  nothing = tf.function(lambda t: t)
  return _settled(lambda: lambda: nothing(x), clock)


def _time_row(row: LayerRow, layer, spec, batch: int, jit: bool, table, clock: Clock,
              overhead: float) -> None:
  """Fills `row.ms` and `row.notes` for every policy, by the one timer (interleaved,
  until settled; ROW_BUDGET_S of calls besides two of float32's). A policy the kernel
  table marks PATHOLOGICAL times float32's for this class's ops (fastpath.pathological,
  the step cost's rule) is predicted by that ratio."""
  family = fastpath.LAYER_FAMILIES.get(row.cls)
  skip = fastpath.pathological(table, [family] if family else [])
  timings = timer.run(
      [(p, lambda p=p: _step(layer, p, spec, batch, jit)) for p in config.POLICY_DTYPE
       if p not in skip],
      calls=timer.baseline_budget("float32", 2, ROW_BUDGET_S, "the layer's budget"),
      clock=clock, catch=(tf.errors.OpError, ValueError, TypeError, NotImplementedError))
  for policy, t in timings.items():
    if t.failed or t.ms is None:
      row.notes[policy] = t.stopped or "not timed"
      continue
    row.ms[policy] = round(max(t.ms - overhead, 0.0), 4)
    if t.stopped:
      row.notes[policy] = (f"{t.bound}: " if t.bound else "") + t.stopped
  for policy, ratio in skip.items():
    if row.ms.get("float32") is not None:
      row.ms[policy] = round(row.ms["float32"] * ratio, 4)
      row.notes[policy] = (f"predicted from the kernel table ({times(ratio)} float32's "
                           "ops here), not run")


def _casts(clock: Clock, overhead: float) -> dict[str, list[float]]:
  """{"a>b": [intercept ms, ms per million elements]} of a cast and its gradient's."""
  found = {}
  for src, dst in itertools.permutations(("float32", "bfloat16", "float16"), 2):
    cast = tf.function(lambda x, g, dst=dst, src=src: (tf.cast(x, dst), tf.cast(g, src)))
    ms = []
    for n in CAST_SIZES:
      x, g = tf.zeros((n,), src), tf.zeros((n,), dst)
      ms.append(_settled(lambda: lambda: cast(x, g), clock))
    slope = max(ms[1] - ms[0], 0.0) / ((CAST_SIZES[1] - CAST_SIZES[0]) / 1e6)
    found[f"{src}>{dst}"] = [round(max(ms[0] - overhead, 0.0), 4), round(slope, 4)]
  return found


def _optimizer(model: keras.Model, make_optimizer: Callable[[str], Any],
               clock: Clock) -> dict[str, float]:
  """The optimizer's update of the model's weights, ms, with and without loss scaling."""
  found = {}
  for policy in ("float32", *filter(config.scales, config.POLICY_DTYPE)):
    opt = make_optimizer(policy)
    weights = [tf.Variable(tf.zeros(v.shape, "float32")) for v in model.trainable_variables]
    grads = [tf.zeros(v.shape, "float32") for v in model.trainable_variables]
    if not weights:
      return {}
    update = tf.function(lambda g: opt.apply(g, weights))
    found[policy] = round(_settled(lambda: lambda: update(grads), clock), 4)
  return found


def measure(model: keras.Model, x, batch: int, key: dict[str, Any],
            make_optimizer: Callable[[str], Any], jit: bool = False,
            table: dict | None = None, clock: Clock = time.perf_counter) -> LayerCosts:
  """Every leaf layer of `model` (called on `x`, a batch of 2) timed under each
  policy at `batch`; `table`: the machine's kernel table (predicts pathological
  rows). Sets the global policy back to what it was."""
  start, was = clock(), keras.mixed_precision.global_policy()  # The object itself.
  rows, edges, skipped = survey(model, x)
  found = LayerCosts(key, batch, [r for r, _, _ in rows],
                     [Edge(e.producer, e.consumer, e.elements * batch) for e in edges],
                     skipped=skipped)
  found.overhead_ms = round(_overhead(clock), 4)
  try:
    for row, layer, spec in rows:
      try:
        _time_row(row, layer, spec, batch, jit, table, clock, found.overhead_ms)
      except (NotImplementedError, TypeError, ValueError, KeyError) as e:
        found.skipped.append(f"{row.names[0]}: not rebuilt ({type(e).__name__})")
        row.notes = {p: "not rebuilt from its config" for p in config.POLICY_DTYPE}
    found.casts = _casts(clock, found.overhead_ms)
    found.optimizer_ms = _optimizer(model, make_optimizer, clock)
  finally:
    keras.mixed_precision.set_global_policy(was)
  found.seconds = round(clock() - start, 2)
  return found
