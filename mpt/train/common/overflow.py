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
tf.function traced once with `tf.debugging.enable_check_numerics` on, which stops at
the first op whose output holds an Inf or a NaN and names it; the op's name scope,
read as the step traced (stepflops.layer_scopes), gives the layer whose gradient it
is.

Nothing of the run moves: the replay runs the model in inference mode (Dropout off,
BatchNormalization reads its moving statistics and updates none) and applies no
update; the weights, optimizer, loss scale and random generators are the run's own,
untouched. Inference mode is the one difference from the skipped step, said in the
record's use. At most MAX_REPLAYS replays per run (the rest counted, said). Best
effort: the caller records a failure and the training goes on.
"""

import functools
import re
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
    self._traced: dict[int, tuple[Any, dict[str, str]]] = {}  # By the model's id.

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
    tf.debugging.enable_check_numerics()  # In the graph it traces now: kept there.
    try:
      if key not in self._traced:
        traced = tf.function(_step(model, loss), autograph=False)
        with stepflops.layer_scopes([model]) as scopes:
          traced.get_concrete_function(x, y, scale_t)
        self._traced[key] = traced, scopes
      traced, scopes = self._traced[key]
      traced(x, y, scale_t)
    except tf.errors.InvalidArgumentError as e:
      _parse(str(e), found, model, traced.get_concrete_function(x, y, scale_t).graph,
             scopes)
    finally:
      tf.debugging.disable_check_numerics()


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


def _step(model: keras.Model, loss):
  """The replayed step's backward pass: the scaled loss' gradients of an
  inference-mode forward pass."""
  def run(x, y, scale):
    with tf.GradientTape() as tape:
      prediction = model(x, training=False)
      value = tf.cast(loss(x, y, prediction), tf.float32) * scale
    return tape.gradient(value, model.trainable_variables)
  return run


def _parse(message: str, found: Overflow, model: keras.Model, graph,
           scopes: dict[str, str]) -> None:
  """The op, its input and the layer from TensorFlow's check_numerics message: it
  names the op's type and its inputs; the op itself is the one of `graph` (the
  replayed step's) with that type and those inputs, and its name scope, read by the
  layers' own names (`scopes`, recorded as the step traced), its layer's path."""
  op = re.search(r'op "(\w+)"', message)
  if op and op.group(1) == "Const":  # Not finite by design: no op overflowed there.
    node = re.search(r"Detected at node (\S+)", message)
    found.unchecked = (
        f"the backward pass holds a constant that is not finite by design "
        f"({node.group(1).removesuffix('/CheckNumericsV2') if node else 'a Const'}), "
        "where TensorFlow's check stops")
    return
  found.op = op.group(1) if op else "?"
  kind = re.search(r"Tensor had (\S+) values", message)
  found.kind = kind.group(1) if kind else ("NaN" if "NaN" in message else "Inf")
  inputs = re.findall(r'\d+: Tensor\("([^"]+)"', message)
  if not inputs:
    return
  found.tensor = inputs[0]
  named = [o.name for o in graph.get_operations() if o.type == found.op and
           [t.name for t in o.inputs][:len(inputs)] == inputs]
  name = named[0] if named else inputs[0]
  found.backward = name.startswith("gradient_tape/")
  path = stepflops.named(stepflops.scope_of(name), scopes)
  found.layer = path.removeprefix(f"{model.name}/") if path != model.name else path


def describe(found: Overflow) -> str:
  """One line: what went non-finite where."""
  if found.unchecked:
    return (f"step {found.step} replayed at loss scale {found.loss_scale:g}: forward "
            f"finite; backward not checked: {found.unchecked}")
  if found.op is None:
    return (f"step {found.step} replayed at loss scale {found.loss_scale:g}: every op "
            "finite (the skip came from a part the replay does not run)")
  where = f"the gradient of {found.layer}" if found.backward else found.layer
  return (f"step {found.step} skipped: {found.op} in {where} went {found.kind} "
          f"(at loss scale {found.loss_scale:g}; replayed in {found.seconds:.2f} s)")
