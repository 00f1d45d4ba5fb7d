"""Which op made a step overflow: a skipped step's batch replayed once, on the side,
eagerly, with every op's output checked.

A loss-scaling optimizer skips a step whose gradients are not finite and halves its
scale; the run goes on, and the step's cause is gone. Here, when a step was skipped,
its batch is run again through the model in the run's own dtypes, eagerly (no trace:
a replay costs a forward and a backward pass). First the forward pass and the loss,
each op's output read as it runs (keras_fit.eager_ops) inside the Keras layer
call that runs it: the first op that made an Inf or a NaN is named with its layer (an
attention layer's q.k product, a custom layer's own). Where they are finite, the
backward pass: the loss' gradient at the scale the skipped step used, each op the
tape runs read as it runs (keras_fit.eager_gradient_ops), with the forward op whose
gradient it computes; the first op whose output is not finite is named, in the
gradient of the layer that ran that forward op. The replay stops there.

Nothing of the run moves: the replay runs the model in inference mode (Dropout off,
BatchNormalization reads its moving statistics and updates none) and applies no
update; the weights, optimizer, loss scale and random generators are the run's own,
untouched. Inference mode is the one difference from the skipped step, said in the
record's use. At most MAX_REPLAYS replays per run (the rest counted, said). Best
effort: the caller records a failure and the training goes on.
"""

import functools
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from mpt.measure import observe
from mpt.records.numerics import Overflow
from mpt.train.common import keras_fit

MAX_REPLAYS = 3
LOSS = "the loss"  # What the loss' own ops belong to (no layer of the model).


def replay(model: keras.Model, x, y, loss, scale: float | None, step: int) -> Overflow:
  """Skipped step `step` replayed: the first non-finite op of `model` on (x, y),
  forward, then (given `loss`, a callable of (x, y, prediction)) the gradient of the
  loss times `scale`."""
  start = time.perf_counter()
  found = Overflow(step=step, loss_scale=scale)
  forward = _Forward(model)
  with tf.GradientTape() as tape:
    value = forward.run(x, y, loss, scale)
  if forward.first:
    found.op, found.kind, found.output = forward.first[:3]
    found.layer = forward.name(forward.first[3])
  elif value is not None:
    _backward(tape, value, model, forward, found)
  found.seconds = round(time.perf_counter() - start, 3)
  return found


def _not_finite(outputs) -> tuple[str, str] | None:
  """(kind, "dtype [shape]") of the first float output holding an Inf or a NaN."""
  for t in outputs:
    if t is None or not (hasattr(t, "numpy") and t.dtype.is_floating):
      continue
    values = np.asarray(t.numpy(), dtype=np.float32)
    if not np.isfinite(values).all():
      kind = "NaN" if np.isnan(values).any() else \
          "+Inf" if np.isposinf(values).any() else "-Inf"
      return kind, f"{t.dtype.name} {list(t.shape)}"
  return None


class _Forward:
  """The forward pass and the loss, eagerly in the run's dtypes, each op read in the
  layer call that runs it: the first non-finite op (`first`: op, kind, output,
  layer), and each op's layer kept for the backward pass (by its outputs, and by its
  type and inputs: the tape keeps, of each op, only the tensors its gradient reads)."""

  def __init__(self, model: keras.Model):
    self.model = model
    self.first: tuple | None = None
    self.calls: dict[int, observe.Call] = {}
    self.by_output: dict[int, Any] = {}
    self.by_input: dict[tuple[str, int, int], list[tuple[tuple[int, ...], Any]]] = {}

  def run(self, x, y, loss, scale: float | None):
    with observe.watching(self.calls) as stack, keras_fit.eager_ops(
        functools.partial(self._note, stack)):
      prediction = self.model(x, training=False)
      if self.first or loss is None:
        return None
      return tf.cast(loss(x, y, prediction), tf.float32) * (scale or 1.0)

  def _note(self, stack, op_type, inputs, outputs):
    layer = stack[-1].layer if stack else LOSS
    for t in outputs:
      self.by_output[id(t)] = layer
    ids = tuple(id(t) for t in inputs)
    for position, i in enumerate(ids):
      self.by_input.setdefault((op_type, position, i), []).append((ids, layer))
    if self.first is None:
      bad = _not_finite(outputs)
      if bad:
        self.first = (op_type, *bad, layer)

  def layer_of(self, forward) -> Any:
    """The layer that ran `forward` (the tape's mock of a forward op), or None."""
    for t in forward.outputs or ():
      if t is not None and id(t) in self.by_output:
        return self.by_output[id(t)]
    kept = [(p, id(t)) for p, t in enumerate(forward.inputs or ()) if t is not None]
    if not kept:
      return None
    for ids, layer in self.by_input.get((forward.type, *kept[0]), ()):
      if all(p < len(ids) and ids[p] == i for p, i in kept):
        return layer
    return None

  def name(self, layer) -> str:
    """Named as the numerics sample names its rows (the model's layers, not the
    model; the loss as such)."""
    if layer is LOSS:
      return LOSS
    calls = [c for c in self.calls.values() if c.layer is not self.model and
             not isinstance(c.layer, keras.Model)]
    return observe.unique_names(calls).get(id(layer), self.model.name)


class _Stop(Exception):
  """The backward pass' cause is found: the rest of the gradient is not computed."""


def _backward(tape, value, model: keras.Model, forward: _Forward,
              found: Overflow) -> None:
  """The first op of the backward pass whose output is not finite, in the gradient of
  the layer whose forward op it differentiates. An op outside any op's gradient (the
  tape's own sums), or of a forward op the tape kept no tensor of, belongs to the
  next op's layer that is known: a layer's gradient ops run together."""
  made: list = []

  def check(op_type, differentiated, inputs, outputs):
    if not made:
      bad = _not_finite(outputs)
      if not bad:
        return
      made.extend([op_type, *bad])
    layer = forward.layer_of(differentiated) if differentiated is not None else None
    if layer is not None:
      made.append(layer)
      raise _Stop
  with keras_fit.eager_gradient_ops(check):
    try:
      tape.gradient(value, model.trainable_variables)
    except _Stop:
      pass
  if made:
    found.op, found.kind, found.output = made[:3]
    found.layer = forward.name(made[3]) if len(made) > 3 else model.name
    found.backward = True


def describe(found: Overflow) -> str:
  """One line: what went non-finite where."""
  if found.op is None:
    return (f"step {found.step} replayed at loss scale {found.loss_scale:g}: every op "
            "finite (the skip came from a part the replay does not run)")
  where = f"the gradient of {found.layer}" if found.backward else found.layer
  return (f"step {found.step} skipped: {found.op} in {where} went {found.kind} "
          f"(at loss scale {found.loss_scale:g}; replayed in {found.seconds:.2f} s)")
