"""What a run learns before its first step, made once: `before_step1(...)` ->
`BeforeStep1` (mpt/train/common/learnt.py, the record a script's run fills too), and
`with_model(...)` once the run's model is built: its verdict, per-layer cost, dtype
report and memory plan.

In order: TF's oneDNN rewrite (chosen in the supervisor's process, onednn_choice.py);
this model's step timed per policy (cost.py, the one timer; a policy whose
weight-gradient kernel is pathological here is predicted from one kernel call, not
run); with --policy=auto, the policy and per-layer plan chosen from that cost
(autopolicy.py), the per-layer cost it weighs (layers.py) and the numerics that may
rule float16 out (mpt/train/common/numerics.py), over one model built for both; then,
with the run's model, the speed verdict on the run's policy (precision.check_speed)
and the per-layer cost where it explains a slowdown. Each is said in one line as it
is learnt. The verdict, the choice and the diagnosis read the cost; summary.json
holds each per-policy figure once (mpt/records/summary.py).
"""

import dataclasses
import pathlib
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from mpt import config
from mpt.machine import gpu_table
from mpt.measure import dtypes as dtypes_lib
from mpt.measure import memory
from mpt.records import cost as cost_records
from mpt.records import layers as layer_records
from mpt.train.before_step1 import autopolicy
from mpt.train.before_step1 import cost as cost_lib
from mpt.train.before_step1 import layers as layers_lib
from mpt.train.before_step1 import onednn_choice
from mpt.train.before_step1 import preflight
from mpt.train.common import keras_fit
from mpt.train.common import numerics as numerics_lib
from mpt.train.common import precision
from mpt.train.common.learnt import BeforeStep1
from mpt.train.common.model import build_model


def with_model(found: BeforeStep1, model: keras.Model, planned_steps: int,
               dist: Any, remove: pathlib.Path | None) -> None:
  """Into `found`, once the run's `model` is built (under `dist`, its distribute
  setup): the verdict on the run's policy over it; for a run alone (one process, the
  chief), the per-layer cost where it explains a slowdown (auto has read it already);
  its dtype report and the memory plan, WillNotFit (`remove`: a new run's folder,
  removed) where the step will not fit, unless --force."""
  cfg = found.cfg
  found.verdict = precision.check_speed(cfg.policy, precision.layer_classes(model),
                                        found.cost)
  if found.choice is None and dist.is_chief and dist.workers == 1:
    found.layer_costs = layers_lib.said(lambda: layers_lib.for_run(
        cfg, model, found.cost, planned_steps), cfg.policy, found.cost)
  memory.reset_peak()  # This run's peak, not an earlier one's in the same process.
  with dist.strategy.scope():  # The memory estimate's layer sizes, and dtypes.json.
    found.report = dtypes_lib.inspect_model(model, seed=cfg.seed)
  found.memory = preflight.for_run(
      cfg, found.report, sum(int(np.prod(v.shape)) for v in model.trainable_variables),
      dist.replicas, dist.workers, gpu=bool(tf.config.list_logical_devices("GPU")),
      remove=remove)


def before_step1(cfg: config.Config, data: Any, workers: int) -> BeforeStep1:
  """What the run learns before its model is built: `data` is the run's (its
  classes, steps and first batches: mpt/train/cli/data.py); `workers` the cluster's
  (a cluster measures nothing: each worker would measure on its own)."""
  onednn = onednn_choice.current(keras_fit.onednn_rewrite_on())
  cost = _step_cost(cfg, data, workers, onednn)
  # flags.txt records the rewrite's state the run trains with, so that --resume and a
  # replayed flags.txt run under it (runs that differ in it are not the same config).
  cfg = dataclasses.replace(cfg, onednn=onednn.label() if onednn.on is not None
                            else cfg.onednn)
  found = BeforeStep1(cfg, onednn=onednn, cost=cost)
  if cfg.policy == "auto":
    _choose(found, data)
  keras.utils.set_random_seed(cfg.seed)  # The run starts as a fresh one would.
  return found


def _step_cost(cfg: config.Config, data: Any, workers: int,
               onednn: cost_records.OnednnChoice) -> cost_records.Cost | None:
  """This model's step cost per policy, or None; said in one line."""
  if workers > 1:
    print("mpt: note: the step's cost per policy was not measured: each worker of a "
          "cluster would measure on its own", flush=True)
    return None
  plain = dataclasses.replace(cfg, layer_policy="")  # The plan is a row of its own.
  build = lambda: build_model(plain, len(data.class_names))
  steps = cfg.epochs * data.steps_per_epoch  # --policy=auto needs it measured.
  steps = max(steps, cost_lib.MIN_RUN_STEPS) if cfg.policy == "auto" else steps
  found, note = cost_lib.for_run(cfg, build, steps,
                                 fits=lambda: preflight.will_not_fit(cfg, build))
  if note:
    print(f"mpt: note: {note}", flush=True)
  if found:
    print(cost_records.one_line(found, onednn.short()), flush=True)
    if found.gpu_kernels is not None:
      print(gpu_table.one_line(found.gpu_kernels), flush=True)
    elif found.gpu_kernels_note:
      print(f"mpt: note: {found.gpu_kernels_note}", flush=True)
  return found


def _choose(found: BeforeStep1, data: Any) -> None:
  """--policy=auto: the policy and plan measured fastest here among those its
  numerics allow, into `found` (its config, choice and the per-layer cost read).
  One model, built under float32, serves the per-layer cost and the numerics."""
  cfg, cost, start = found.cfg, found.cost, time.perf_counter()
  build = lambda: build_model(cfg, len(data.class_names))
  precision.set_policy("float32")  # Its numerics: every layer that would be 16-bit.
  model = build()
  plan, timer = None, None
  if cost is not None:
    found.layer_costs = layers_lib.said(
        lambda: layers_lib.read_or_measure(cfg, model), "float32", cost)
    plan = (lambda best: layer_records.best_plan(found.layer_costs, best)) \
        if found.layer_costs else None
    timer = lambda p: autopolicy.time_plan(cfg, build, p)
  unsafe = numerics_lib.unsafe(cfg, model, data)
  measured = cost.seconds if cost and cost.source == "measured" else 0.0  # Not cached.
  chosen, layer_policy, found.choice = autopolicy.choose(
      cost, plan, timer, measured + time.perf_counter() - start, unsafe)
  plan_words = f" with --layer_policy={layer_policy}" if layer_policy else ""
  print(f"mpt: --policy=auto: {chosen}{plan_words} was fastest here\n"
        f"{autopolicy.format_table(found.choice)}", flush=True)
  found.cfg = dataclasses.replace(cfg, policy=chosen, layer_policy=layer_policy)

