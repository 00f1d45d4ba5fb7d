"""`--mode=inspect`: the model a run would train, built without training: its dtype
report per layer (mpt/measure/dtypes.py) and the memory estimate under each policy
(mpt/train/before_step1/preflight.py), its per-layer cost (mpt/train/before_step1/layers.py) and, with
--numerics (auto: on here), its per-layer numerics on two real batches of the data
the run would train on (drawn without caching the whole set: mpt/train/cli/data.py
`first_batches`; mpt/train/common/numerics.py), printed and written to a run folder
(dtypes.json, memory.json, layers.json, numerics.json, TensorBoard texts).
"""

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from mpt import files
from mpt import speech
from mpt.errors import UserError
from mpt.measure import dtypes as dtypes_lib
from mpt.measure import memory
from mpt.measure import policies
from mpt.records import layers as layer_records
from mpt.records import numerics as records
from mpt.records import rundir
from mpt.train.cli import data as data_lib
from mpt.train.cli import prepare
from mpt.train.before_step1 import layers as layers_lib
from mpt.train.common import numerics as numerics_lib
from mpt.train.common import precision
from mpt.train.before_step1 import preflight
from mpt.train.common import stepflops
from mpt.train.common import steps as steps_lib
from mpt.train.common.model import build_model
from mpt.train.common.plan import Plan


def inspect_only(cfg: Plan) -> dict[str, Any]:
  """`--mode=inspect` (see the module docstring): the model gets the data's classes
  (10, Imagenette's, where no batch was read) and `--image_size` inputs."""
  cfg = Plan.of(cfg)
  if cfg.policy == "auto":
    raise UserError("--policy=auto times training steps: use it with --mode=train")
  prepare.fresh_start(cfg)
  print(precision.describe(precision.set_policy(cfg.policy)))
  batches, classes = _batches(cfg)
  model = build_model(cfg, len(classes) or 10)
  report = dtypes_lib.inspect_model(model, seed=cfg.seed)
  report["step_flops"] = _step_flops(cfg, model, report)
  print(dtypes_lib.format_table(report))
  trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
  # No data is loaded here: the cache the run would fill is added to the baseline.
  gpu = bool(tf.config.list_logical_devices("GPU"))
  ests = preflight.estimates(report, cfg.batch_size, trainable,
                             memory.rss_mb() + preflight.data_cache_mb(cfg), gpu)
  mem = preflight.table(ests, *memory.available_mb(gpu))
  print(mem["text"])
  per_layer = layers_lib.read_or_measure(cfg, model)
  if per_layer:
    print(layers_lib.format_table(per_layer, cfg.policy))
  found = numerics_lib.before_training(cfg, model, batches, steps_lib.make_loss()) \
      if batches else None
  if found and found.samples:
    print(records.format_table(found))
  run_dir = rundir.create(cfg, "inspect")
  if found:
    records.write(run_dir, found)
  files.write_json(run_dir / "dtypes.json", report)
  files.write_json(run_dir / "memory.json", mem)
  if per_layer:
    files.write_json(run_dir / "layers.json", per_layer.to_dict())
    _write_plan(run_dir, model, per_layer)
  with tf.summary.create_file_writer(str(run_dir)).as_default(step=0):
    tf.summary.text("inspect/dtypes", dtypes_lib.format_table(report, markdown=True))
    if found and found.samples:
      tf.summary.text("numerics/layers", records.format_table(found))
  print(f"mpt: wrote {run_dir / 'dtypes.json'}")
  return {"status": "completed", "run_dir": str(run_dir), **report, "memory": mem,
          "layer_costs": per_layer.to_dict() if per_layer else None,
          "numerics": found.to_dict() if found else None}


def _step_flops(cfg: Plan, model: keras.Model,
                report: dict[str, Any]) -> dict[str, Any] | None:
  """The training step's FLOPs at --batch_size, as a run would count them: the graph
  of the step the custom loop runs (mpt/train/common/stepflops.py), traced, not run;
  per layer where an op belongs to one (each row's `step_flops`). None, said, where
  the step cannot be traced."""
  try:
    optimizer = precision.make_optimizer(cfg.policy, cfg.learning_rate, cfg.loss_scale,
                                         scaled=cfg.scales_loss)
    steps = steps_lib.Steps(model, optimizer, loss=steps_lib.make_loss(),
                            global_batch=cfg.batch_size)
    size = cfg.image_size
    found = stepflops.of_trace(steps.train_step, (
        tf.TensorSpec([cfg.batch_size, size, size, 3], tf.float32),
        tf.TensorSpec([cfg.batch_size], tf.int32)), [model])
  except Exception as e:  # The inspection goes on without it.
    print(f"mpt: the step's FLOPs not counted: {type(e).__name__}: {e}", flush=True)
    return None
  stepflops.into_report(report, found, cfg.batch_size)
  return report["step_flops"]


def _write_plan(run_dir, model: keras.Model, per_layer) -> None:
  """The plan the per-layer cost predicts fastest, as the DTypePolicyMap a script
  applies (policy_map.json), said with the line that applies it."""
  plan = layer_records.best_plan(per_layer)
  if plan is None:
    return
  found = policies.plan_map(model, plan.policy, list(plan.by_class.items()))
  where = policies.write_map(run_dir, found, "the plan the per-layer cost predicts "
                             f"fastest here: {plan.policy}" + (
                                 f" with {plan.layer_policy()}" if plan.by_class else ""))
  print(speech.plan_line(where, found[1]))


def _batches(cfg: Plan) -> tuple[list | None, list[str]]:
  """(a few training batches for the numerics, the class names), or (None, []) where
  --numerics is off or the data cannot be read (said: the inspection goes on)."""
  if not numerics_lib.wanted(cfg, inspect=True):
    return None, []
  try:
    return data_lib.first_batches(cfg, numerics_lib.BATCHES)
  except (UserError, OSError, tf.errors.OpError) as e:
    print(f"mpt: note: numerics not sampled: no batch of --dataset={cfg.dataset} "
          f"could be read ({(str(e).splitlines() or [''])[0][:200]})", flush=True)
    return None, []
