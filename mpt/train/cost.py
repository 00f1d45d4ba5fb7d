"""What this model's training step costs here under each policy, measured before step 1.

The kernel table's representative shapes (mpt/machine/kernels.py) were right about
the direction and 2-8x wrong about the size of a model's step. Here its own compiled
step (mpt/train/steps.py, the custom loop's, with its optimizer and loss scaling) is
timed under each policy on random inputs of the run's shape and batch, float32 first:
each policy's first and second call, then TIMED_STEPS. A 16-bit policy's timing stops
early where clearly slow: after a first call over STOP times float32's (its estimate:
that call less float32's first-call overhead), or a second call over STOP times
float32's (its estimate: scaled as float32 warmed up). A policy whose ops the
machine's cached kernel table measured PATHOLOGICAL times float32's is not run unless
it is the run's own: its step is float32's by that ratio (a mixed_float16 step of the
seed convnet takes 13-17 s on a Sapphire Rapids; the table knows). A per-layer plan
(--layer_policy, or the one `--policy=auto` weighs) is a row of its own, and so is a
run with XLA's step without it (XLA measured 12-29x slower on a CPU).

This is the one timing before step 1: the warning, `--policy=auto`, the oneDNN choice
and the diagnosis read it. On a GPU each policy's step is then profiled
(mpt/train/gpu_steps.py) into the kernel table on a GPU. `for_run` is the run's
entry: a stand-in ($MPT_COST: a recorded cost.json, or `none`), the cache
(mpt/records/cost.py), a skip for a run shorter than the measurement, or a
measurement here. `python -m mpt.train.cost FLAGFILE OUT POLICIES` measures in a child,
for the oneDNN choice (mpt/train/onednn_choice.py: TF_ENABLE_ONEDNN_OPTS must be set
before TensorFlow is imported).
"""

import dataclasses
import math
import os
import pathlib
import statistics
import sys
import time
from typing import Callable

import keras
import tensorflow as tf

from mpt import config
from mpt import errors
from mpt.machine import fastpath
from mpt.machine import isa
from mpt.machine import kernels
from mpt.records import cost as cost_lib
from mpt.records.cost import Cost, PolicyCost
from mpt.train import gpu_steps
from mpt.train import keras_fit
from mpt.train import model as model_lib
from mpt.train import precision
from mpt.train import steps as steps_lib

ENV = "MPT_COST"
STOP = 5.0       # a 16-bit call this many times float32's: timing stops there
PATHOLOGICAL = 10.0  # a kernel table ratio at which a policy is predicted, not run
TIMED_STEPS = 2  # steps timed after the first two calls
MIN_RUN_STEPS = cost_lib.MIN_RUN_STEPS
F32 = ("float32", "", None)  # A candidate: (policy, layer_policy, XLA where not the run's).
Clock = Callable[[], float]


def _traced(key: tuple, cfg: config.Config, build: Callable[[], keras.Model],
            batch: int, clock: Clock
            ) -> tuple[Callable[[], float], PolicyCost, keras.Model]:
  """The model's compiled step for a candidate `key` (policy, layer_policy's per-layer
  plan over it, and the XLA setting where it is not the run's), traced (not yet run),
  as a function that runs it once and returns its ms; the row, its tracing timed;
  and the model."""
  policy, layer_policy, jit = key
  keras.utils.set_random_seed(cfg.seed)
  precision.set_policy(policy)
  start = clock()
  model = build()
  plan = config.layer_policies(layer_policy)
  model_lib.apply_layer_policy(model, plan)
  scaled = config.scales_loss(dataclasses.replace(cfg, policy=policy,
                                                  layer_policy=layer_policy))
  optimizer = precision.make_optimizer(policy, cfg.learning_rate, cfg.loss_scale,
                                       scaled=scaled)
  step = steps_lib.Steps(model, optimizer,
                         jit_compile=cfg.jit_compile if jit is None else jit,
                         global_batch=batch)
  size = cfg.image_size
  images = tf.random.stateless_uniform((batch, size, size, 3), (cfg.seed, 1))
  labels = tf.zeros((batch,), tf.int64)
  step.train_step.get_concrete_function(images, labels)

  row = PolicyCost(policy, trace_s=round(clock() - start, 3), layer_policy=layer_policy,
                   jit_compile=jit)

  def timed() -> float:
    begin = clock()
    loss = float(step.train_step(images, labels)["loss"])  # Waits for the result.
    row.finite = row.finite and math.isfinite(loss)
    return round((clock() - begin) * 1e3, 3)

  return timed, row, model


def pathological(table: dict | None, model: keras.Model) -> dict[str, float]:
  """{policy: its ops' time over float32's} for the 16-bit policies whose ops this
  machine's kernel table measured PATHOLOGICAL times float32's, for this model's layer
  classes: predicted from the table, not timed (oneDNN's reference float16
  convolution on a Sapphire Rapids: ~100x, 13-17 s a step for the seed convnet)."""
  if not table:
    return {}
  ratios = fastpath.policy_ratios(
      table, fastpath.families_of(precision.layer_classes(model)))
  return {p: r for p, r in ratios.items() if p != "float32" and r >= PATHOLOGICAL}


def _stop(row: PolicyCost, f32: PolicyCost | None) -> bool:
  """Whether `row`'s policy is clearly > STOP x float32's after its first or second
  call; if so its estimate and why are filled in."""
  if f32 is None or row is f32:
    return False
  if row.second_ms is None and row.first_ms > STOP * f32.first_ms:
    row.stopped = f"first call > {STOP:g}x float32's: timing stopped there"
  elif row.second_ms is not None and f32.second_ms and (
      row.second_ms > STOP * f32.second_ms):
    row.stopped = f"second call > {STOP:g}x float32's: timing stopped there"
  return bool(row.stopped)


def _estimate(row: PolicyCost, f32: PolicyCost) -> float:
  """A stopped policy's ms/step from the call it stopped at, by float32's calls."""
  if row.second_ms is None:  # Less float32's first-call overhead (graph optimisation).
    return max(row.first_ms - (f32.first_ms - f32.ms_per_step), f32.ms_per_step)
  return row.second_ms * f32.ms_per_step / f32.second_ms  # As float32 warmed up.


def measure(cfg: config.Config, build: Callable[[], keras.Model],
            policies=cost_lib.POLICIES, clock: Clock = time.perf_counter,
            base: PolicyCost | None = None, gpu: bool | None = None,
            plans: tuple[tuple[str, str], ...] = (), table: dict | None = None
            ) -> Cost:
  """Times the model's step under `policies` and the per-layer `plans` ((policy,
  layer_policy) pairs) in this process, interleaved: every candidate's first call
  (float32's first), then every second call, then TIMED_STEPS rounds, so that the
  machine's ups and downs fall on every candidate alike. `base`: float32's row from
  an earlier measurement, not timed again. `table`: the machine's kernel table; a
  policy it marks pathological is predicted from it, not run, unless it is the
  run's own. `gpu`: profile each policy's step into the kernel table
  (default: where TF sees a GPU)."""
  batch = cost_lib.device_batch(cfg)
  onednn = keras_fit.onednn_rewrite_on()
  found = Cost(cost_lib.key_for(cfg, onednn, isa.detect()), onednn, batch)
  start = clock()
  keras.backend.clear_session()
  order = [F32] + [(p, "", None) for p in policies if p != "float32"] + [
      (*p, None)[:3] for p in plans]
  steps, rows, skip = {}, {}, {}
  for key in order:
    if key == F32 and base is not None:
      rows[key] = base
      continue
    if key[0] in skip and key[0] != cfg.policy:
      rows[key] = _predicted_row(key, skip[key[0]])
      continue
    try:
      steps[key], rows[key], model = _traced(key, cfg, build, batch, clock)
      if key == F32:
        skip = pathological(table, model)
    except (tf.errors.OpError, ValueError, TypeError, errors.UserError) as e:
      rows[key] = PolicyCost(key[0], stopped=_failed(e), layer_policy=key[1],
                             jit_compile=key[2])
  f32 = rows[F32] if rows[F32].stopped is None else None
  times = _rounds(order, steps, rows, f32)
  _settle(rows, times, f32, skip)
  found.policies = [rows[k] for k in order]
  if gpu if gpu is not None else tf.config.list_logical_devices("GPU"):
    ran = {k[0]: steps[k] for k in order if k in steps and not k[1] and k[2] is None
           and not (rows[k].stopped or "").startswith("failed")}
    found.gpu_kernels, found.gpu_kernels_note = gpu_steps.kernel_table(ran)
  precision.set_policy("float32")
  keras.backend.clear_session()
  found.seconds = round(clock() - start, 2)
  return found


def _rounds(order: list, steps: dict, rows: dict, f32: PolicyCost | None) -> dict:
  """Every candidate's first call (float32's first), then every second call, then
  TIMED_STEPS rounds: {candidate: its timed ms}; a candidate stops where `_stop` or
  a failure says (float32's failure stops them all)."""
  times: dict = {}
  live = [k for k in order if k in steps and (f32 is not None or k == F32)]
  for phase in ["first_ms", "second_ms"] + ["timed"] * TIMED_STEPS:
    for key in list(live):
      if key not in live:  # float32 failed earlier in this round.
        continue
      try:
        ms = steps[key]()
      except (tf.errors.OpError, ValueError) as e:
        rows[key].stopped = _failed(e)
        live = [] if key == F32 else [k for k in live if k != key]
        continue
      if phase == "timed":
        times.setdefault(key, []).append(ms)
      else:
        setattr(rows[key], phase, ms)
      if _stop(rows[key], f32 if key != F32 else None):
        live.remove(key)
  return times


def _predicted_row(key: tuple, ratio: float) -> PolicyCost:
  return PolicyCost(key[0], layer_policy=key[1], jit_compile=key[2], predicted=True,
                    stopped=(
      f"predicted from the kernel table ({ratio:.0f}x float32's ops), not timed"))


def _settle(rows: dict, times: dict, f32: PolicyCost | None,
            skip: dict[str, float]) -> None:
  """Each row's ms/step: the median of its timed steps, an estimate where timing
  stopped, float32's by the kernel table's ratio where it was predicted."""
  for key, row in rows.items():
    if times.get(key):
      row.steps_timed = len(times[key])
      row.ms_per_step = round(statistics.median(times[key]), 3)
    elif row.predicted and f32 and f32.ms_per_step:
      row.ms_per_step = round(f32.ms_per_step * skip[row.policy], 3)
    elif row.stopped and row.first_ms and f32 and f32.ms_per_step:
      row.ms_per_step = round(_estimate(row, f32), 3)
  for row in rows.values():
    if row.ms_per_step is None and not row.stopped:
      row.stopped = "not timed: float32's step could not be timed"


def _failed(e: Exception) -> str:
  return f"failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def for_run(cfg: config.Config, build: Callable[[], keras.Model], planned_steps: int,
            fits: Callable[[], str | None] = lambda: None,
            table: Callable[[], dict | None] = lambda: None
            ) -> tuple[Cost | None, str | None]:
  """(this model's cost here, a note when there is none or where it came from).
  `build()` makes the model without --layer_policy's plan (timed as a row of its
  own); `fits()` says why the step at the run's batch would not fit in memory (the
  measurement is then skipped: the run's memory preflight says the rest); `table()`:
  the machine's kernel table (a pathological policy is predicted from it)."""
  stand_in = os.environ.get(ENV)
  if stand_in == "none":
    return None, None
  if stand_in:
    try:
      found = cost_lib.read(pathlib.Path(stand_in))
    except (OSError, ValueError, TypeError) as e:
      return None, f"{ENV}={stand_in} cannot be read ({e}); nothing measured"
    found.source = f"recorded: {stand_in}"
    return found, None
  want = [(p, "", None) for p in cost_lib.POLICIES] + (
      [(cfg.policy, cfg.layer_policy, None)] if cfg.layer_policy else []) + (
      # A run with XLA: its step without it too (XLA measured 12-29x slower on a CPU).
      [(cfg.policy, cfg.layer_policy, False)] if cfg.jit_compile
      and cfg.policy != "auto" else [])
  cached = cost_lib.cached(cost_lib.key_for(
      cfg, keras_fit.onednn_rewrite_on(), isa.detect()))
  have = lambda k: bool(cached and cached.of(*k) and not (
      k[0] == cfg.policy and cached.of(*k).predicted))  # The run's own is timed.
  if all(have(k) for k in want):
    return cached, None
  if planned_steps < MIN_RUN_STEPS:
    return None, (f"the step's cost per policy was not measured: this run's "
                  f"{planned_steps} steps cost about what measuring them would")
  too_big = fits()
  if too_big:
    return None, f"the step's cost per policy was not measured: {too_big}"
  missing = [k for k in want if not have(k)]
  fresh = measure(cfg, build, [p for p, plan, jit in missing if not plan and jit is None],
                  base=cached.of("float32") if have(F32) else None,
                  plans=tuple(k for k in missing if k[1] or k[2] is not None),
                  table=table())
  if cached:  # The oneDNN choice measured some policies already: keep them.
    fresh.policies = [cached.of(*k) if have(k) else fresh.of(*k) for k in want]
    fresh.seconds = round(cached.seconds + fresh.seconds, 2)
  cost_lib.save(fresh)
  return fresh, None


def main(argv: list[str]) -> int:
  """The oneDNN choice's child: `FLAGFILE OUT POLICIES` -> OUT holds a cost.json."""
  flagfile, out, policies = argv[1], argv[2], argv[3].split(",")
  cfg = config.from_flagfile(pathlib.Path(flagfile).read_text())
  plain = dataclasses.replace(cfg, layer_policy="")  # A plan is a row of its own.
  found = measure(cfg, lambda: model_lib.build_model(plain, 10), policies,
                  table=kernels.table(probe_if_missing=False)[0])
  cost_lib.write(pathlib.Path(out), found)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
