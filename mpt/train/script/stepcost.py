"""A script's step cost per policy, fit by fit: at the end of each fit's warm-up (its
first steps: the first traced the program's step, the others say what a step takes),
the step the program runs is timed per policy, or read from the cache
(mpt/train/before_step1/scriptcost.py), and said in one line; at each fit's end the
run's own policy is checked against that fit's own steps (cost.py `checked_by_run`).
Loaded by the run folder (library.py) only once a first step has run.

Where its 16-bit policy measured slower than float32, the per-layer cost explains
which layers make it slow, with the plan it predicts fastest as policy_map.json.
What is not measured is a line and a `not_measured` entry, never an exception.
"""

import statistics

import keras
import tensorflow as tf

from mpt import speech
from mpt.measure import layercost
from mpt.measure import rewrite
from mpt.measure import policies
from mpt.records import cost as cost_lib
from mpt.records import layers as layer_records
from mpt.train.before_step1 import cost as timing
from mpt.train.before_step1 import layers as layers_lib
from mpt.train.before_step1 import scriptcost
from mpt.train.common import keras_fit
from mpt.train.common import precision
from mpt.train.script import watch


def _why_not(folder) -> str | None:
  """Why this fit's step is not timed per policy, or None."""
  if folder.opts.cost == "off":
    return "cost='off' was given"
  if folder.opts.loop == "fit" and folder.latest is None:
    return "no batch was seen (the fetch is not timed here), so no step was timed"
  strategy = next(filter(None, map(_strategy, folder.models)), None)
  if strategy:
    return (f"the model was built under {strategy}: its variables are the strategy's, "
            "and mpt times a model's step outside any strategy")
  return None


def _strategy(model: keras.Model) -> str | None:
  """The tf.distribute strategy `model` was built under, by class name; None for none
  (the default strategy, which is the one outside every scope)."""
  strategy = getattr(model, "distribute_strategy", None)
  return None if strategy in (None, tf.distribute.get_strategy()) else \
      type(strategy).__name__


def _step(folder) -> scriptcost.Step:
  """The step this fit runs (NotTimeable where mpt cannot time it)."""
  if folder.opts.loop == "fit":
    return scriptcost.of_fit(folder.model, folder.latest)
  flops = folder.flops  # The loop's step and the arguments of its first call.
  return scriptcost.of_loop(tuple(folder.models), flops.step, flops.args, flops.kwargs)


def _planned(folder) -> int | None:
  """The fit's planned steps, where Keras knows them (None: a loop, or data without
  a length)."""
  params = folder.params or {}
  return params["steps"] * params.get("epochs", 1) \
      if folder.opts.loop == "fit" and params.get("steps") else None


def for_fit(folder) -> None:
  """This fit's step cost per policy into `folder.before.cost` and the fit's record, said;
  what is not measured into `not_measured`. A fit whose step is the previous fit's
  (the same key) keeps its cost."""
  fit = folder.program.fits[-1]
  why = _why_not(folder)
  try:
    step = None if why else _step(folder)
  except scriptcost.NotTimeable as e:
    why = str(e)
  if why:
    folder.not_measured["cost"] = why
    return
  optimizers = watch.find(folder.models, folder.opts.optimizer)
  steps = folder.timer.here  # The fit's steps so far: its first traced the step.
  seen = (steps[0], statistics.median(steps[1:])) if len(steps) > 1 else None
  found, note = scriptcost.for_script(step, optimizers, folder.policy_name(),
                                      _planned(folder), seen)
  if note:
    folder.not_measured["cost"] = note
    print(f"mpt: note: {note}", flush=True)
    return
  folder.not_measured.pop("cost", None)
  folder.before.cost = fit.cost = found
  length = ("" if _planned(folder)
            else ", the run's length unknown: no share of it bounds it")
  print(cost_lib.one_line(found, "on" if found.onednn else "off")
        + f" ({found.timed}{length})", flush=True)
  folder.before.layer_costs = folder.parts.attempt(
      "layer_costs", _layers, folder, step, optimizers, found)
  if folder.before.onednn is None:
    folder.before.onednn = folder.parts.attempt("onednn", _rewrite, step)


def _rewrite(step: scriptcost.Step):
  """Where TF leaves oneDNN's rewrite off here: what it measured, said with the line
  that sets it (mpt/measure/rewrite.py); None elsewhere."""
  model = step.models[0]
  dtype = model.dtype_policy.compute_dtype if hasattr(model, "dtype_policy") else "float32"
  found = rewrite.note(keras_fit.onednn_rewrite_on(), layers_lib.families(model),
                       dtype if dtype != "float32" else "bfloat16")
  if found is not None:
    print(rewrite.line(found), flush=True)
  return found


def fit_ms(folder) -> tuple[float | None, int]:
  """(the median of this fit's timed steps, how many), from the run's step timer."""
  timer, fit = folder.timer, folder.program.fits[-1]
  first = timer.steps - fit.steps
  times = [timer.durations_ms[i] for i in range(first, timer.steps) if timer.timed[i]]
  return (statistics.median(times) if times else None), len(times)


def check(folder) -> None:
  """At a fit's end: its own policy's row against the fit's own steps."""
  fit = folder.program.fits[-1]
  fit.ms_per_step, steps = fit_ms(folder)
  if fit.cost is None or not fit.ms_per_step:
    return
  fit.ms_per_step = round(fit.ms_per_step, 3)
  checked = timing.checked_by_run(fit.cost, folder.policy_name(), "", fit.ms_per_step,
                                  steps, str(folder.run_dir))
  if checked is not fit.cost:
    folder.before.cost = fit.cost = checked
    # Said at step 1; recorded as the run ends.
    folder.before.verdict = folder.parts.attempt(
        "verdict", precision.check_speed, folder.policy_name(), folder.layer_classes(),
        folder.before.cost, folder.opts.api, say=False)


def _layers(folder, step: scriptcost.Step, optimizers: list, cost: cost_lib.Cost):
  """The per-layer cost where the program's 16-bit policy measured slower than float32
  (layers_lib.SLOWER, the command line's rule), said, with its plan's policy map."""
  own, model = folder.policy_name(), step.models[0]
  ratio = cost.ratios().get(own)
  if not ratio or ratio < layers_lib.SLOWER or len(step.models) > 1:  # float32's is 1.
    return None
  x = keras.utils.unpack_x_y_sample_weight(folder.latest)[0] \
      if folder.opts.loop == "fit" else folder.batch
  two = keras.tree.map_structure(lambda t: t[:2] if hasattr(t, "shape") else t, x)
  optimizer = optimizers[0] if optimizers else None
  standing, recorded = layers_lib.stand_in()  # $MPT_LAYERS, as the command line's.
  found = layers_lib.said(lambda: recorded if standing else (
      layer_records.cached(cost.key) or layercost.measure(
          model, two, cost.batch, cost.key,
          lambda p: scriptcost.fresh_optimizer(optimizer, p),
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
