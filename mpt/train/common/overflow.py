"""Which op made a step overflow: a skipped step's batch replayed once, on the side,
with every op's output checked.

A loss-scaling optimizer skips a step whose gradients are not finite and halves its
scale; the run goes on, and the step's cause is gone. Here, when a step was skipped,
its batch is run again through the model in the run's own dtypes: first the forward
pass alone, eagerly, each op's output read as it runs (keras_fit.eager_op_outputs)
inside the Keras layer call that runs it, so the first op that made an Inf or a NaN
is named with its layer, at the cost of one forward pass and no trace (an attention
layer's q.k product, a custom layer's own). Where the forward pass is finite, the
backward pass: the loss' gradient at the scale the skipped step used, inside a
tf.function traced once that returns, for each op it creates (those TensorFlow's own
numerics check instruments, keras_fit.graph_op_outputs), whether its output holds an
Inf or a NaN: the first such op in the graph's order is named, and its name scope,
read as the step traced (stepflops.layer_scopes), gives the layer whose gradient it
is. (TensorFlow's check_numerics would stop at a constant that is not finite by
design, such as the NaN of --deterministic's loss, and logs each stop at length.)

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
from mpt.train.common import stepflops

MAX_REPLAYS = 3


class Replayer:
  """Replays skipped steps of one run: the forward pass eagerly, and where it is
  finite the backward pass, its step traced once with the numerics checks in its
  graph and run again for each later skipped step (their time then is a step's, not
  a trace's)."""

  def __init__(self):
    # By the model's id: the traced step, the ops it checks, its layers' scopes.
    self._traced: dict[int, tuple[Any, list, dict[str, str]]] = {}

  def __call__(self, model: keras.Model, x, y, loss, scale: float | None,
               step: int) -> Overflow:
    """The first non-finite op of `model` on (x, y): forward, then (given `loss`, a
    callable of (x, y, prediction)) the gradient of the loss times `scale`."""
    start = time.perf_counter()
    found = Overflow(step=step, loss_scale=scale)
    if not _forward(model, x, found) and loss is not None:
      self._backward(model, x, y, loss, scale, found)
    found.seconds = round(time.perf_counter() - start, 3)
    return found

  def _backward(self, model: keras.Model, x, y, loss, scale: float | None,
                found: Overflow) -> None:
    key = id(model)  # The run's loss is the same each time (a new callable of it).
    scale_t = tf.constant(scale or 1.0, tf.float32)
    if key not in self._traced:
      step, ops = _checked_step(model, loss)
      traced = tf.function(step, autograph=False)
      with stepflops.layer_scopes([model]) as scopes:
        traced.get_concrete_function(x, y, scale_t)
      self._traced[key] = traced, ops, scopes
    traced, ops, scopes = self._traced[key]
    made = _first_made(traced(x, y, scale_t).numpy(), ops)
    if made is None:
      return
    (op, name, tensor, _, _), found.kind = made
    found.op, found.tensor = op, tensor
    found.backward = name.startswith("gradient_tape/")
    path = stepflops.named(stepflops.scope_of(name), scopes)
    found.layer = path.removeprefix(f"{model.name}/") if path != model.name else path


def _forward(model: keras.Model, x, found: Overflow) -> bool:
  """The forward pass, eagerly in the run's dtypes: the first op whose output holds
  an Inf or a NaN, its output and the layer call it ran in, into `found`. False:
  every op finite."""
  seen: dict[int, observe.Call] = {}
  first: dict[str, Any] = {}

  def note(stack, op_type, outputs):
    if first or not stack:
      return
    for t in outputs:
      if not (hasattr(t, "numpy") and t.dtype.is_floating):
        continue
      values = np.asarray(t.numpy(), dtype=np.float32)
      if not np.isfinite(values).all():
        kind = "NaN" if np.isnan(values).any() else \
            "+Inf" if np.isposinf(values).any() else "-Inf"
        first.update(op=op_type, kind=kind, layer=stack[-1].layer,
                     output=f"{t.dtype.name} {list(t.shape)}")
        return
  with observe.watching(seen) as stack, keras_fit.eager_op_outputs(
      functools.partial(note, stack)):
    model(x, training=False)
  if not first:
    return False
  # Named as the numerics sample names its rows (the model's layers, not the model).
  calls = [c for c in seen.values() if c.layer is not model and
           not isinstance(c.layer, keras.Model)]
  found.op, found.kind, found.output = first["op"], first["kind"], first["output"]
  found.layer = observe.unique_names(calls).get(id(first["layer"]), model.name)
  return True


def _checked_step(model: keras.Model, loss):
  """(the replayed step's backward pass, the ops it checks): an inference-mode
  forward pass and the scaled loss' gradients, returning per float tensor the ops
  of the loss and the gradients read or make in the step's own graph (the forward
  pass was checked eagerly) two sums: of the tensor times zero (NaN where it holds
  an Inf or a NaN) and of its magnitudes (NaN where it holds a NaN, else Inf). The ops, filled as it traces, in
  creation order (an order in which each op follows its inputs): (type, name, first
  input's name, its output's row, its float inputs' rows). A constant is not
  checked: one that is not finite holds that value by design (a -inf mask, the NaN
  --deterministic's loss selects for invalid labels)."""
  ops: list[tuple[str, str, str | None, int, list[int]]] = []

  def run(x, y, scale):
    graph = scale.graph  # The step's own graph (an argument's, as it traces).
    rows: dict[str, int] = {}
    sums = []

    def row(t) -> int:
      if t.name not in rows:
        rows[t.name] = len(sums)
        wide = tf.cast(t, tf.float32)
        sums.append(tf.stack([tf.reduce_sum(wide * 0.0), tf.reduce_sum(tf.abs(wide))]))
      return rows[t.name]

    def check(op_type, op_name, op_graph, inputs, outputs):
      if op_graph is not graph or op_type == "Const":
        return
      read = [row(t) for t in inputs if t.dtype.is_floating and t.graph is graph]
      for t in outputs:
        if t.dtype.is_floating:
          ops.append((op_type, op_name, inputs[0].name if inputs else None, row(t), read))
    with tf.GradientTape() as tape:
      prediction = model(x, training=False)  # Checked already, run eagerly.
      with keras_fit.graph_op_outputs(check):
        value = tf.cast(loss(x, y, prediction), tf.float32) * scale
    with keras_fit.graph_op_outputs(check):
      tape.gradient(value, model.trainable_variables)
    return tf.stack(sums) if sums else tf.zeros([0, 2])
  return run, ops


def _first_made(sums: np.ndarray, ops: list) -> tuple | None:
  """The first op (of `_checked_step`'s) whose output is not finite while every
  float input it read is: the op that made the Inf or NaN, not one that passed it
  on; with its kind. None: none."""
  bad = np.isnan(sums[:, 0])
  for op in ops:
    out, read = op[3], op[4]
    if bad[out] and not bad[read].any():
      return op, "NaN" if np.isnan(sums[out, 1]) else "Inf"
  return None


def describe(found: Overflow) -> str:
  """One line: what went non-finite where."""
  if found.op is None:
    return (f"step {found.step} replayed at loss scale {found.loss_scale:g}: every op "
            "finite (the skip came from a part the replay does not run)")
  where = f"the gradient of {found.layer}" if found.backward else found.layer
  return (f"step {found.step} skipped: {found.op} in {where} went {found.kind} "
          f"(at loss scale {found.loss_scale:g}; replayed in {found.seconds:.2f} s)")
