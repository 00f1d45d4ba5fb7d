"""A script's own step per policy (`mpt.callbacks`, `mpt.track`), timed once on its first
real batch, by the command line's timer (mpt/train/before_step1/cost.py `time_candidates`: the
same interleaving, STOP and budget cut-offs, kernel-table prediction and record).

The script's model is built and mpt cannot rebuild it, but a built Keras 3 model
computes in whatever policy its layers hold when a step is traced
(mpt/measure/policies.py), so each candidate is the script's model, its layers
switched while its step is traced, on the batch the script fed. The step is the
training step as `fit` runs it: forward, the compiled loss (`model.compute_loss`),
its gradients and the update, by a fresh copy of the script's optimizer (its class
and config; loss scaling under mixed_float16, as Keras' compile adds it). A loop
whose loss mpt does not know (`mpt.track`, a custom `train_step`) gets a stand-in
loss, the mean square of the model's float outputs: its gradients flow through every
layer as the real loss's do; what was timed is said in the record.

The script's training is left as it was: its optimizer is not touched, every
variable of the model (weights, BatchNorm statistics, random seeds' state) and of its
compiled metrics is put back, and every layer gets back the policy object it held.
Cached per model signature, batch, loss and machine like the command line's cost.
"""

import hashlib
import json
import time
from typing import Any, Callable

import keras
import tensorflow as tf

from mpt import config
from mpt import speech
from mpt.machine import isa
from mpt.measure import layercost
from mpt.measure import numerics
from mpt.measure import observe
from mpt.measure import policies
from mpt.models import fused_bn
from mpt.records import cost as cost_lib
from mpt.records import layers as layer_records
from mpt.records.cost import Cost, PolicyCost
from mpt.train.before_step1 import cost as timing
from mpt.train.common import keras_fit
from mpt.train.before_step1 import layers as layers_lib

Loss = Callable[[Any, Any, Any, Any], tf.Tensor]  # (x, y, prediction, sample weight)
STAND_IN = "stand-in (the mean square of the model's outputs: the loop's own loss is not known to mpt)"
COMPILED = "the compiled loss (model.compute_loss)"


def loss_of(model: keras.Model, fit: bool) -> tuple[Loss, str]:
  """(the loss the timed step uses, what it is): `fit`'s compiled loss where fit runs
  Keras' own train_step, else the stand-in."""
  own_step = type(model).train_step is not keras.Model.train_step
  if fit and not own_step and getattr(model, "loss", None) is not None:
    return (lambda x, y, pred, sw: model.compute_loss(x=x, y=y, y_pred=pred,
                                                      sample_weight=sw)), COMPILED
  def stand_in(x, y, pred, sw):
    outs = [tf.cast(t, "float32") for t in keras.tree.flatten(pred)
            if hasattr(t, "dtype") and t.dtype.is_floating]
    return tf.add_n([tf.reduce_mean(tf.square(t)) for t in outs])
  return stand_in, STAND_IN


def _signature(model: keras.Model) -> str:
  """The model's layers (class, weight shapes) as a digest: what makes two scripts'
  models the same to time."""
  layers = [(type(l).__name__, [list(w.shape) for w in l.weights])
            for l in fused_bn.all_layers(model)]
  return hashlib.sha1(json.dumps([model.name, layers]).encode()).hexdigest()[:16]


def key_for(model: keras.Model, x, what: str, jit: bool) -> dict[str, Any]:
  return {"model": f"script:{model.name}", "signature": _signature(model),
          "inputs": observe.describe_inputs(x), "loss": what, "jit_compile": jit,
          **cost_lib.machine_key(keras_fit.onednn_rewrite_on(), isa.detect())}


def _fresh_optimizer(optimizer, policy: str) -> keras.optimizers.Optimizer:
  """A copy of the script's optimizer (class and config, no state), loss-scaled
  under mixed_float16; Adam where there is none or it cannot be copied."""
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  try:
    fresh = type(inner).from_config(inner.get_config())
  except (TypeError, ValueError, AttributeError, NotImplementedError):
    fresh = keras.optimizers.Adam()
  return keras.optimizers.LossScaleOptimizer(fresh) if config.scales(policy) else fresh


def stepper(model: keras.Model, batch: tuple, loss: Loss, optimizer, jit: bool,
            clock: timing.Clock) -> timing.Make:
  """The script's candidates: its model's training step on `batch` ((x, y, sample
  weight)), traced with the layers switched to the candidate's policy."""
  x, y, sw = batch
  variables = model.trainable_variables

  def make(key: timing.Key):
    policy = key[0]
    start = clock()
    opt = _fresh_optimizer(optimizer, policy)
    opt.build(variables)

    @tf.function(jit_compile=jit)
    def step(x, y, sw):
      with tf.GradientTape() as tape:
        value = loss(x, y, model(x, training=True), sw)
        scaled = opt.scale_loss(value)
      opt.apply(tape.gradient(scaled, variables), variables)
      return value

    with policies.switched(model, policies.uniform(policy)):
      step.get_concrete_function(x, y, sw)
    row = PolicyCost(policy, trace_s=round(clock() - start, 3))
    return timing.timer(lambda: step(x, y, sw), row, clock), row

  return make


def _state(model: keras.Model) -> list:
  """Every variable of a model and of its compiled metrics, once each."""
  found = {id(v): v for v in list(model.variables)
           + list(getattr(model, "metrics_variables", []))}
  return list(found.values())


def measure(model: keras.Model, batch: tuple, loss: tuple[Loss, str], optimizer,
            own: str, jit: bool = False, table: timing.Table = timing.kernel_table,
            clock: timing.Clock = time.perf_counter) -> Cost:
  """The script's step timed under each policy on `batch` with `loss` ((the loss,
  what it is): `loss_of`), the model left as it was (`own`: the script's policy,
  which is timed even where the table predicts it)."""
  loss, what = loss
  n = int(keras.tree.flatten(batch[0])[0].shape[0])
  found = Cost(key_for(model, batch[0], what, jit), keras_fit.onednn_rewrite_on(), n,
               timed=f"this script's model on its first batch, forward, {what}, "
                     "gradients and its optimizer's update")
  start = clock()
  with numerics.state_kept(_state(model)):
    found.policies = timing.time_candidates(
        [(p, "", None) for p in cost_lib.POLICIES], stepper(model, batch, loss, optimizer,
                                                             jit, clock),
        timing.pathological(model, table), own, clock=clock)
  found.seconds = round(clock() - start, 2)
  return found


def for_script(model: keras.Model, batch: tuple, fit: bool, optimizer, own: str,
               planned_steps: int | None, jit: bool = False
               ) -> tuple[Cost | None, str | None]:
  """(the script's step cost per policy, or None; a note where it is not measured):
  the cache, a skip for a run known to be shorter than the measurement, or measured."""
  standing, found, note = timing.stand_in()
  if standing:
    return found, note or (None if found else f"{timing.ENV}=none: not measured")
  loss, what = loss_of(model, fit)
  cached = cost_lib.cached(key_for(model, batch[0], what, jit))
  if cached and all(cached.of(p) for p in cost_lib.POLICIES):
    return cached, None
  if planned_steps is not None and planned_steps < cost_lib.MIN_RUN_STEPS:
    return None, (f"the step's cost per policy was not measured: this run's "
                  f"{planned_steps} steps cost about what measuring them would")
  found = measure(model, batch, (loss, what), optimizer, own, jit)
  cost_lib.save(found)
  return found, None


def before_training(folder) -> None:
  """After a script's first step (`folder`: its RunFolder, mpt/train/script/library.py): its
  step's cost per policy (`folder.cost`, said in one line), and where its 16-bit
  policy measured slower, its per-layer cost (`folder.layer_costs`) and the plan it
  predicts fastest as policy_map.json; what is not measured is `not_measured`."""
  opts, why = folder.opts, None
  if opts.cost == "off":
    why = "cost='off' was given"
  elif len(folder.models) != 1 or not observe.has_call(folder.models[0]):
    why = (f"{folder.name} trains several models in its own step: the step is the "
           "program's, so it is not timed per policy")
  elif folder.batch is None:
    why = "no batch was seen (the fetch is not timed here), so no step was timed"
  elif _strategy(folder.models[0]):
    why = (f"the model was built under {_strategy(folder.models[0])}: its variables "
           "are the strategy's, and mpt times a model's step outside any strategy")
  if why:
    folder.not_measured["cost"] = why
    return
  model, fit = folder.models[0], opts.loop == "fit"
  batch = keras.utils.unpack_x_y_sample_weight(folder.batch) if fit else (
      folder.batch, None, None)
  optimizer = model.optimizer if fit else (
      opts.optimizer[0] if isinstance(opts.optimizer, (list, tuple)) else opts.optimizer)
  params = folder.params or {}
  planned = params["steps"] * params.get("epochs", 1) if fit and params.get("steps") \
      else None
  own = folder.policy_name()
  found, note = for_script(model, batch, fit, optimizer, own, planned,
                           bool(getattr(model, "jit_compile", False)) if fit else False)
  if note:
    folder.not_measured["cost"] = note
    print(f"mpt: note: {note}", flush=True)
    return
  folder.cost = found
  print(cost_lib.one_line(found, "on" if found.onednn else "off") + f" ({found.timed})",
        flush=True)
  folder.layer_costs = folder.parts.attempt("layer_costs", _layers, folder, model,
                                            batch[0], optimizer, own, found)


def _strategy(model: keras.Model) -> str | None:
  """The tf.distribute strategy `model` was built under, by class name; None for none
  (the default strategy, which is the one outside every scope)."""
  strategy = getattr(model, "distribute_strategy", None)
  if strategy is None or strategy is tf.distribute.get_strategy():
    return None
  return type(strategy).__name__


def _layers(folder, model: keras.Model, x, optimizer, own: str, cost: Cost):
  """The per-layer cost where the script's 16-bit policy measured slower than float32
  (layers_lib.SLOWER, the command line's rule), said, with its plan's policy map."""
  ratio = cost.ratios().get(own)
  if own == "float32" or not ratio or ratio < layers_lib.SLOWER:
    return None
  two = keras.tree.map_structure(lambda t: t[:2] if hasattr(t, "shape") else t, x)
  standing, recorded = layers_lib.stand_in()  # $MPT_LAYERS, as the command line's.
  found = layers_lib.said(lambda: recorded if standing else (
      layer_records.cached(cost.key) or layercost.measure(
          model, two, cost.batch, cost.key, lambda p: _fresh_optimizer(optimizer, p),
          table=timing.kernel_table(layers_lib.families(model)))), own, cost)
  if found is None:
    return None
  if found.source == "measured":
    layer_records.save(found)
  plan = layer_records.best_plan(found)
  if plan and plan.by_class:
    planned = policies.plan_map(model, plan.policy, list(plan.by_class.items()))
    where = policies.write_map(folder.run_dir, planned, "the per-layer plan predicted "
                               f"fastest here: {plan.policy} with {plan.layer_policy()}")
    print(speech.plan_line(where, planned[1]), flush=True)
  return found
