"""Which op made a step overflow: a skipped step's batch replayed once, on the side,
with TensorFlow's numerics checks on.

A loss-scaling optimizer skips a step whose gradients are not finite and halves its
scale; the run goes on, and the step's cause is gone. Here, when a step was skipped,
its batch is run again through the model, forward and (given the run's loss) backward
at the scale the skipped step used, in the run's own dtypes, inside a tf.function
traced with `tf.debugging.enable_check_numerics` on: TensorFlow stops at the first op
whose output holds an Inf or a NaN and names it. The op's name scope gives the Keras
layer it belongs to (`attention/query`, or the gradient of `attention/...`).

Nothing of the run moves: the replay runs the model in inference mode (Dropout off,
BatchNormalization reads its moving statistics and updates none) and applies no
update; the weights, optimizer, loss scale and random generators are the run's own,
untouched. Inference mode is the one difference from the skipped step, said in the
record's use. At most MAX_REPLAYS replays per run (the rest counted, said). Best
effort: the caller records a failure and the training goes on.
"""

import re
import time
from typing import Any

import keras
import tensorflow as tf

from mpt.models import fused_bn
from mpt.records.numerics import Overflow
from mpt.train.common import stepflops

MAX_REPLAYS = 3


class Replayer:
  """Replays skipped steps of one run: the step traced once, with the numerics checks
  in its graph, and run again for each later skipped step (their time then is a
  step's, not a trace's)."""

  def __init__(self):
    self._traced: dict[tuple[int, int], Any] = {}

  def __call__(self, model: keras.Model, x, y, loss, scale: float | None,
               step: int) -> Overflow:
    """The first non-finite op of `model` on (x, y): forward, then (given `loss`, a
    callable of (x, y, prediction)) the gradient of the loss times `scale`."""
    start = time.perf_counter()
    key = (id(model), loss is None)
    if key not in self._traced:
      self._traced[key] = tf.function(_step(model, loss), autograph=False)
    traced = self._traced[key]
    found = Overflow(step=step, loss_scale=scale)
    scale_t = tf.constant(scale or 1.0, tf.float32)
    tf.debugging.enable_check_numerics()  # In the graph it traces now: kept there.
    try:
      traced(x, y, scale_t)
    except tf.errors.InvalidArgumentError as e:
      _parse(str(e), found, model, traced.get_concrete_function(x, y, scale_t).graph)
    finally:
      tf.debugging.disable_check_numerics()
    found.seconds = round(time.perf_counter() - start, 3)
    return found


def _step(model: keras.Model, loss):
  """The replayed step: inference-mode forward, and the scaled loss' gradients."""
  def run(x, y, scale):
    with tf.GradientTape() as tape:
      prediction = model(x, training=False)
      if loss is None:
        return [tf.reduce_sum(tf.cast(t, tf.float32))
                for t in keras.tree.flatten(prediction) if hasattr(t, "dtype")]
      value = tf.cast(loss(x, y, prediction), tf.float32) * scale
    return tape.gradient(value, model.trainable_variables)
  return run


def _parse(message: str, found: Overflow, model: keras.Model, graph) -> None:
  """The op, its input and the layer from TensorFlow's check_numerics message: it
  names the op's type and its inputs; the op itself is the one of `graph` (the
  replayed step's) with that type and those inputs."""
  op = re.search(r'op "(\w+)"', message)
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
  names = {model.name} | {layer.name for layer in fused_bn.all_layers(model)}
  path = stepflops.layer_paths({stepflops.scope_of(name): 0}, names)
  layer = next(iter(path))
  found.layer = layer.removeprefix(f"{model.name}/") if layer != model.name else layer


def describe(found: Overflow) -> str:
  """One line: what went non-finite where."""
  if found.op is None:
    return (f"step {found.step} replayed at loss scale {found.loss_scale:g}: every op "
            "finite (the skip came from a part the replay does not run)")
  where = f"the gradient of {found.layer}" if found.backward else found.layer
  return (f"step {found.step} skipped: {found.op} in {where} went {found.kind} "
          f"(at loss scale {found.loss_scale:g}; replayed in {found.seconds:.2f} s)")
