"""Per-layer numerics of a model on real batches: each layer's output and the gradient
flowing into it against float16's range, and its output's error in bfloat16 (the
record and the shares derived from it: mpt/records/numerics.py).

`sample(model, batches, loss, ...)` runs the model's forward and backward pass on each
batch (its first MAX_EXAMPLES examples), eagerly, in float32: every layer computing in a 16-bit dtype is switched to
float32 for the pass and back after it (a built Keras 3 layer takes a new policy and
keeps its float32 variables; a traced step keeps the policy it was traced with), so
the values are the run's own weights and batches at full precision, and the answer is
"what float16 would do" under any policy. Every layer call is watched
(mpt/measure/observe.py); the gradient tape takes the loss's gradient with respect to
each layer's output. The pass runs in training mode, as the step does, and the
model's non-trainable state (BatchNorm's moving statistics, dropout's seed) is put
back after it: the training it samples goes on as if it had not looked.

Then each leaf layer is called again on the first BF16_EXAMPLES examples of its
recorded input, once in float32 and once under mixed_bfloat16: the relative error
of its output is bfloat16's own in that layer, its inputs exact. A layer that cannot
be called alone (several arguments, a mask) gets none.
"""

import collections
import contextlib
import functools
import math
import time
from typing import Any, Callable, Iterable

import keras
import numpy as np
import tensorflow as tf

from mpt.measure import observe
from mpt.measure import policies
from mpt.records.numerics import F16_MAX, LayerNumerics, Sample, Values

BF16_EXAMPLES = 8
# Examples of each batch a sample reads: its float32 pass keeps every layer's output
# and gradient, so a large batch would raise the run's measured peak memory (and its
# time) for a share of values the first 64 already give.
MAX_EXAMPLES = 64
# Layers whose output sums or normalises over many values: bfloat16's error in what
# they read moves what they make (a softmax's logits, a normalisation's statistics).
REDUCTIONS = ("Softmax", "LayerNormalization", "BatchNormalization",
              "FusedBatchNormalization", "GroupNormalization", "UnitNormalization",
              "RMSNormalization", "GlobalAveragePooling1D", "GlobalAveragePooling2D",
              "GlobalAveragePooling3D", "MultiHeadAttention", "Attention",
              "GroupQueryAttention")
Loss = Callable[[Any, Any, Any], Any]  # (x, y, prediction) -> the scalar loss.
# Ops whose outputs are a variable's value: weights stay float32 under a mixed policy.
VARIABLE_READS = ("ReadVariableOp",)
# A context manager that calls its argument (op_type, outputs) after each op run
# eagerly inside it (keras_fit.eager_ops: TF internals live in mpt/train).
OpWatch = Callable[[Callable[[str, list, list], None]], Any]


def values(t) -> Values:
  """`t`'s magnitudes as a Values (computed in float32)."""
  a = np.abs(np.asarray(tf.cast(t, tf.float32))).ravel()
  finite = np.isfinite(a)
  nonzero = a[finite & (a > 0)]
  _, exponents = np.frexp(nonzero)  # |v| = m * 2^e with m in [0.5, 1).
  bins, counts = np.unique(exponents - 1, return_counts=True)
  return Values(
      count=int(a.size), zeros=int(np.sum(a == 0)), nonfinite=int(np.sum(~finite)),
      overflow=int(np.sum(a > F16_MAX)),  # inf too, not NaN.
      max=float(np.max(a)) if a.size else 0.0,
      min_nonzero=float(np.min(nonzero)) if nonzero.size else None,
      hist={str(int(b)): int(n) for b, n in zip(bins, counts)})


def _range(array: np.ndarray) -> Values:
  """Only the range of an array's magnitudes (count, non-finite, above 65504, the
  largest): what an op's values inside a layer are judged by, at a fraction of a
  histogram's cost (every op of every layer is read)."""
  a = np.abs(array.astype(np.float32, copy=False)).ravel()
  finite = np.isfinite(a)
  return Values(count=int(a.size), nonfinite=int(a.size - np.count_nonzero(finite)),
                overflow=int(np.count_nonzero(a > F16_MAX)),
                max=float(a.max()) if a.size else 0.0)


def is_reduction(layer: keras.layers.Layer) -> bool:
  activation = getattr(getattr(layer, "activation", None), "__name__", "")
  return type(layer).__name__ in REDUCTIONS or activation in ("softmax", "log_softmax")


@contextlib.contextmanager
def in_float32(model: keras.Model):
  """Every layer of `model` (itself included) computing in float32 inside the block;
  yields {id(layer): (the compute dtype it had, whether its policy is its own)}
  (mpt/measure/policies.py: which layers follow the model's policy)."""
  own = policies.follows(model)
  with policies.switched(model, policies.to_float32) as dtypes:
    yield {i: (dtype, not own[i]) for i, dtype in dtypes.items()}


@contextlib.contextmanager
def state_kept(variables):
  """`variables` as they were before the block (the numerics' pass: the model's
  non-trainable ones; a script's timed step, mpt/train/before_step1/scriptcost.py: all of them)."""
  kept = [(v, tf.identity(v.value)) for v in variables]
  try:
    yield
  finally:
    for v, value in kept:
      v.assign(value)


def _pass(model: keras.Model, x, y, loss: Loss | None, ops: OpWatch | None,
          inside: dict[int, tuple[Values, str]], float16: dict[int, set[str]] | None):
  """(the watched layer calls, their gradients or None, the loss) of one batch; with
  `ops`, each layer's own ops' outputs into `inside` (`_note`)."""
  seen: dict[int, observe.Call] = {}
  x = keras.tree.map_structure(
      lambda t: tf.convert_to_tensor(t) if isinstance(t, np.ndarray) else t, x)
  with tf.GradientTape() as tape:
    for t in keras.tree.flatten(x):
      if isinstance(t, tf.Tensor) and t.dtype.is_floating:
        tape.watch(t)
    with observe.watching(seen) as stack, (
        ops(functools.partial(_note, stack, inside, float16)) if ops
        else contextlib.nullcontext()):
      prediction = model(x, training=True)
    value = loss(x, y, prediction) if loss else None
  calls = [c for c in seen.values() if c.layer is not model and c.output is not None
           and c.output.dtype.is_floating and not isinstance(c.layer, keras.Model)]
  grads = tape.gradient(value, [c.output for c in calls]) if value is not None \
      else [None] * len(calls)
  return calls, grads, None if value is None else float(value)


def _float16_ops(model: keras.Model, x, ops: OpWatch) -> dict[int, set[str]] | None:
  """Per layer, the types of its own ops whose outputs are float16 under
  mixed_float16 (policies.to_float16), from one example's forward pass: the values
  float16 would have to hold (a LayerNormalization computes its statistics in
  float32 under any policy; MultiHeadAttention's scores are float16). None where
  the pass fails (then every op of a layer counts)."""
  found: dict[int, set[str]] = collections.defaultdict(set)

  def note(stack, op_type, inputs, outputs):
    if stack and any(getattr(t, "dtype", None) == tf.float16 for t in outputs):
      found[id(stack[-1].layer)].add(op_type)
  n = int(keras.tree.flatten(x)[0].shape[0])
  try:
    with policies.switched(model, policies.to_float16), \
        state_kept(model.non_trainable_variables):
      with observe.watching({}) as stack, ops(functools.partial(note, stack)):
        model(_first(x, 1, n), training=True)
  except Exception:  # Best effort: every op counts.
    return None
  return found


def _scaled_after(layer) -> float | None:
  """The factor `layer` multiplies its product by after forming it, where known:
  Keras 3.15's MultiHeadAttention without dropout runs dot_product_attention, which
  forms q.k and scales it by 1/sqrt(key_dim) after (with dropout it scales the
  query first)."""
  if isinstance(layer, keras.layers.MultiHeadAttention) and not layer.dropout:
    return 1.0 / math.sqrt(layer.key_dim)
  return None


def _note(stack: list[observe.Call], inside: dict[int, tuple[Values, str]],
          float16: dict[int, set[str]] | None, op_type: str, inputs: list,
          outputs: list) -> None:
  """One op's outputs, run inside the innermost layer call now running, merged into
  that layer's `inside` (its values, the type of the op that made the largest):
  where `float16` is known, only an op of a type that computes in float16 there."""
  if not stack or op_type in VARIABLE_READS:
    return
  key = id(stack[-1].layer)
  if float16 is not None and op_type not in float16.get(key, ()):
    return
  for t in outputs:
    if not (hasattr(t, "numpy") and t.dtype.is_floating):
      continue
    found = _range(np.asarray(t.numpy()))
    if key not in inside:
      inside[key] = (found, op_type)
      continue
    held, op = inside[key]
    inside[key] = (held.merge(found), op_type if found.max > held.max else op)


def _inputs(call: observe.Call, made_by: dict[int, int]) -> list[int]:
  """The ids of the layers whose outputs `call` reads, once each, in order
  (`made_by`: each output tensor's id to its layer's)."""
  found = [made_by.get(id(t)) for t in keras.tree.flatten(call.argument)]
  return list(dict.fromkeys(i for i in found if i not in (None, id(call.layer))))


def _first(argument, n: int, batch: int):
  """`argument` with each tensor of `batch` examples cut to its first `n`."""
  if argument is None:
    return None
  return keras.tree.map_structure(
      lambda t: t[:n] if hasattr(t, "shape") and len(t.shape) and t.shape[0] == batch
      else t, argument)


def bf16_error(layer: keras.layers.Layer, argument, n: int, batch: int) -> float | None:
  """||y_bf16 - y_f32|| / ||y_f32|| of `layer` on the first `n` examples of its
  (float32) `argument`; None where it cannot be called on that alone."""
  part = _first(argument, n, batch)
  try:
    exact = layer(part, training=False)
    with policies.one_layer(layer, "mixed_bfloat16"):
      rounded = layer(part, training=False)
  except (TypeError, ValueError, tf.errors.OpError, NotImplementedError):
    return None
  exact = np.asarray(tf.cast(observe.first_tensor(exact), tf.float64))
  rounded = np.asarray(tf.cast(observe.first_tensor(rounded), tf.float64))
  norm = float(np.linalg.norm(exact))
  return float(np.linalg.norm(rounded - exact)) / norm if norm else 0.0


def sample(model: keras.Model, batches: Iterable[tuple[Any, Any]], loss: Loss | None,
           step: int, loss_scale: float | None,
           clock: Callable[[], float] = time.perf_counter,
           ops: OpWatch | None = None) -> Sample:
  """One sample of `model`'s numerics on `batches` of (x, y) at `step`. With `ops`
  (a way to see each op TensorFlow runs eagerly: keras_fit.eager_ops), each
  layer's row also holds `inside`: the values its own ops made in its call (the
  attention scores inside MultiHeadAttention, a custom layer's products)."""
  start = clock()
  rows: dict[int, LayerNumerics] = {}
  losses, examples, first = [], 0, None
  inside: dict[int, tuple[Values, str]] = {}
  batches = list(batches)
  float16 = _float16_ops(model, batches[0][0], ops) if ops and batches else None
  with in_float32(model) as dtypes, state_kept(model.non_trainable_variables):
    for x, y in batches:
      n = int(keras.tree.flatten(x)[0].shape[0])
      x, y = _first(x, MAX_EXAMPLES, n), _first(y, MAX_EXAMPLES, n)
      calls, grads, value = _pass(model, x, y, loss, ops, inside, float16)
      first = first or (calls, x)
      examples += int(keras.tree.flatten(x)[0].shape[0])
      losses += [value] if value is not None else []
      for call, grad in zip(calls, grads):
        out = values(call.output)
        g = values(grad) if grad is not None else None
        row = rows.get(id(call.layer))
        if row is None:
          dtype, pinned = dtypes.get(id(call.layer), ("float32", False))
          rows[id(call.layer)] = LayerNumerics(
              "", type(call.layer).__name__, dtype, out, g, pinned=pinned)
        else:
          row.output = row.output.merge(out)
          row.grad = row.grad.merge(g) if row.grad and g else row.grad or g
    if first:
      _name_and_round(rows, *first)
  layers = {id(c.layer): c.layer for c in first[0]} if first else {}
  for key, (found, op) in inside.items():
    if key in rows:
      rows[key].inside, rows[key].inside_op = found, op
      rows[key].scaled_after = _scaled_after(layers.get(key))
  return Sample(step=step, examples=examples, loss_scale=loss_scale,
                loss=float(np.mean(losses)) if losses else None,
                layers=list(rows.values()), seconds=round(clock() - start, 3))


def _name_and_round(rows: dict[int, LayerNumerics], calls: list[observe.Call], x):
  """Names the rows, records the layers each reads and marks those a reduction
  reads, and measures bfloat16's error in each leaf layer (on the first batch)."""
  names = observe.unique_names(calls)
  made_by = {id(t): id(c.layer) for c in calls for t in c.outputs}
  reads = {id(c.layer): _inputs(c, made_by) for c in calls}
  feeds = {i for c in calls if is_reduction(c.layer) for i in reads[id(c.layer)]}
  batch = int(keras.tree.flatten(x)[0].shape[0])
  for call in calls:
    row = rows[id(call.layer)]
    row.name = names[id(call.layer)]
    row.reduction = is_reduction(call.layer) or id(call.layer) in feeds
    row.reads = [names[i] for i in reads[id(call.layer)]]
    if call.leaf and call.argument is not None:
      row.bf16_error = bf16_error(call.layer, call.argument, BF16_EXAMPLES, batch)
