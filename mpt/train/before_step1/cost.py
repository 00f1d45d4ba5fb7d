"""What this model's training step costs here under each policy, measured before step 1.

The kernel table's representative shapes (mpt/machine/kernels.py) were right about
the direction and 2-8x wrong about the size of a model's step. Here its own compiled
step (mpt/train/common/steps.py, the custom loop's, with its optimizer and loss scaling) is
timed under each policy on random inputs of the run's shape and batch (a smaller
batch was tried: the fixed per-op cost then hides up to half of a 16-bit slowdown),
float32 first. The model is built once; each candidate's step is traced with its
layers switched to the candidate's policies (mpt/measure/policies.py: the graph
keeps the dtypes it was traced with), so a script's model, which mpt cannot
rebuild, is timed by the same `time_candidates` (mpt/train/before_step1/scriptcost.py).

`time_candidates` times each policy's first and second call, then TIMED_STEPS,
interleaved. A 16-bit policy's timing stops early where clearly slow: after a first
call over STOP times float32's (its estimate: that call less float32's first-call
overhead), or a second call over STOP times float32's (its estimate: scaled as
float32 warmed up), or where its next timed step would pass the budget (second calls
and timed steps: two of float32's steps and BUDGET_S more). A policy whose ops the machine's cached kernel table
measured PATHOLOGICAL times float32's is not run unless it is the run's own: its step
is float32's by that ratio (a mixed_float16 step of the seed convnet takes 13-17 s on
a Sapphire Rapids; the table knows). Where no table is cached, the model's
weight-gradient kernels are timed in this process instead (mpt/measure/gradkernels.py,
~0.1-1.5 s): a fresh machine learns that from one kernel call, not from a step. A per-layer plan (--layer_policy, or the one
`--policy=auto` weighs) is a row of its own, and so is a run with XLA's step without
it (XLA measured 12-29x slower on a CPU).

This is the one timing before step 1: the warning, `--policy=auto`, the oneDNN choice
and the diagnosis read it. On a GPU each policy's step is then profiled
(mpt/train/before_step1/gpu_steps.py) into the kernel table on a GPU. `for_run` is the run's
entry: a stand-in ($MPT_COST: a recorded cost.json, or `none`), the cache
(mpt/records/cost.py), a skip for a run shorter than the measurement, or a
measurement here. `python -m mpt.train.before_step1.cost FLAGFILE OUT POLICIES` measures in a child,
for the oneDNN choice (mpt/train/before_step1/onednn_choice.py: TF_ENABLE_ONEDNN_OPTS must be set
before TensorFlow is imported).
"""

import dataclasses
import math
import pathlib
import statistics
import sys
import time
from typing import Any, Callable

import keras
import tensorflow as tf

from mpt import config
from mpt import errors
from mpt.machine import fastpath
from mpt.machine import isa
from mpt.machine import kernels
from mpt.measure import gradkernels
from mpt.measure import policies
from mpt.records import cost as cost_lib
from mpt.records import keyed
from mpt.records.cost import Cost, PolicyCost
from mpt.train.before_step1 import gpu_steps
from mpt.train.common import keras_fit
from mpt.train.common import model as model_lib
from mpt.train.common import precision
from mpt.train.common import steps as steps_lib

ENV = "MPT_COST"
STOP = fastpath.STOP  # a 16-bit call this many times float32's: timing stops there
PATHOLOGICAL = fastpath.PATHOLOGICAL  # a kernel table ratio: predicted, not run
TIMED_STEPS = 2  # steps timed after the first two calls
# Seconds of second calls and timed steps allowed besides two of float32's steps (a
# candidate's first call optimises its graph: it counts as its trace); a candidate
# not done by then is estimated from the calls it made.
BUDGET_S = 5.0
MIN_RUN_STEPS = cost_lib.MIN_RUN_STEPS
F32 = ("float32", "", None)  # A candidate: (policy, layer_policy, XLA where not the run's).
Clock = Callable[[], float]
Key = tuple  # (policy, layer_policy, jit_compile or None)
# A candidate traced: (its step run once, returning ms; its row).
Make = Callable[[Key], tuple[Callable[[], float], PolicyCost]]
Table = Callable[[list[str]], dict | None]  # Op families -> a kernel table, or None.


def _images(cfg: config.Config, batch: int) -> tuple[tf.Tensor, tf.Tensor]:
  size = cfg.image_size
  return (tf.random.stateless_uniform((batch, size, size, 3), (cfg.seed, 1)),
          tf.zeros((batch,), tf.int64))


def stepper(cfg: config.Config, model: keras.Model, batch: int, clock: Clock) -> Make:
  """The command line's candidates over one built `model`: for a key (policy,
  layer_policy's plan over it, the XLA setting where it is not the run's), mpt's
  compiled train step (mpt/train/common/steps.py) with its own optimizer and loss scaling,
  traced with the model's layers switched to the key's policies (the graph keeps
  them; the model is given back as it was built)."""
  images, labels = _images(cfg, batch)

  def make(key: Key) -> tuple[Callable[[], float], PolicyCost]:
    policy, layer_policy, jit = key
    start = clock()
    pairs = config.layer_policies(layer_policy)
    with policies.switched(model, policies.uniform(policy, pairs)):
      scaled = config.scales_loss(dataclasses.replace(cfg, policy=policy,
                                                      layer_policy=layer_policy))
      optimizer = precision.make_optimizer(policy, cfg.learning_rate, cfg.loss_scale,
                                           scaled=scaled)
      step = steps_lib.Steps(model, optimizer,
                             jit_compile=cfg.jit_compile if jit is None else jit,
                             global_batch=batch)
      step.train_step.get_concrete_function(images, labels)
    row = PolicyCost(policy, trace_s=round(clock() - start, 3),
                     layer_policy=layer_policy, jit_compile=jit)
    return timer(lambda: step.train_step(images, labels)["loss"], row, clock), row

  return make


def timer(run: Callable[[], Any], row: PolicyCost, clock: Clock) -> Callable[[], float]:
  """One call of `run` timed in ms, its result read back (waits for the work); a
  non-finite result marks `row`."""
  def timed() -> float:
    begin = clock()
    loss = float(run())
    row.finite = row.finite and math.isfinite(loss)
    return round((clock() - begin) * 1e3, 3)
  return timed


def kernel_table(families) -> dict | None:
  """The kernel table every measurement before step 1 reads: $MPT_KERNELS or the
  machine's cached table; on a CPU with neither, the weight-gradient kernels of
  `families` timed here (mpt/measure/gradkernels.py). None on a GPU: its table comes
  from each policy's step profiled (gpu_steps.py)."""
  if tf.config.list_logical_devices("GPU"):
    return None
  return kernels.table(probe_if_missing=False,
                       missing=lambda: gradkernels.table(families))[0]


def pathological(model: keras.Model, table: Table = kernel_table) -> dict[str, float]:
  """fastpath.pathological for this model's layer classes, from `table(families)`."""
  families = fastpath.families_of(precision.layer_classes(model))
  return fastpath.pathological(table(families), families)


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
            plans: tuple[tuple[str, str], ...] = (), table: Table = kernel_table
            ) -> Cost:
  """Times the model's step under `policies` and the per-layer `plans` ((policy,
  layer_policy) pairs) in this process, over one model built once under float32
  (`time_candidates`). `base`: float32's row from an earlier measurement, not timed
  again. `table(families)`: the machine's kernel table (`kernel_table`); a policy it
  marks pathological is predicted from it, not run, unless it is the run's own. `gpu`: profile each
  policy's step into the kernel table (default: where TF sees a GPU)."""
  batch = cost_lib.device_batch(cfg)
  onednn = keras_fit.onednn_rewrite_on()
  found = Cost(cost_lib.key_for(cfg, onednn, isa.detect()), onednn, batch)
  start = clock()
  # Keras' state fresh; memory is freed after the measurement (below), not before.
  keras.backend.clear_session(free_memory=False)
  keras.utils.set_random_seed(cfg.seed)
  # Built under a 16-bit policy, so that a layer the model pins to float32 (its
  # softmax) stands out from those that follow the policy (mpt/measure/policies.py).
  precision.set_policy("mixed_bfloat16")
  order = [(p, "", None) for p in policies if p != "float32"] + [
      (*p, None)[:3] for p in plans]
  try:
    model = build()
  except (tf.errors.OpError, ValueError, TypeError, errors.UserError) as e:
    precision.set_policy("float32")
    found.policies = [PolicyCost(k[0], stopped=_failed(e), layer_policy=k[1],
                                 jit_compile=k[2]) for k in [F32] + order]
    return found
  make = stepper(cfg, model, batch, clock)
  steps: dict = {}
  found.policies = time_candidates([F32] + order, _remembering(make, steps),
                                   pathological(model, table), cfg.policy, base, clock)
  if gpu if gpu is not None else tf.config.list_logical_devices("GPU"):
    ran = {k[0]: steps[k] for k, row in zip([F32] + order, found.policies)
           if k in steps and not k[1] and k[2] is None
           and not (row.stopped or "").startswith("failed")}
    found.gpu_kernels, found.gpu_kernels_note = gpu_steps.kernel_table(ran)
  precision.set_policy("float32")
  keras.backend.clear_session()  # The timed model's memory freed before the run's.
  found.seconds = round(clock() - start, 2)
  return found


def _remembering(make: Make, steps: dict) -> Make:
  """`make`, keeping each candidate's step function in `steps` (the GPU profile
  runs them again)."""
  def made(key: Key):
    timed, row = make(key)
    steps[key] = timed
    return timed, row
  return made


def time_candidates(order: list[Key], make: Make, skip: dict[str, float], own: str,
                    base: PolicyCost | None = None, clock: Clock = time.perf_counter
                    ) -> list[PolicyCost]:
  """Each candidate's row, in `order` (float32 first), timed interleaved: every
  candidate's first call, then every second call, then TIMED_STEPS rounds, so that
  the machine's ups and downs fall on every candidate alike; the one timing before
  step 1, of the command line's model and of a script's. `make(key)` traces a
  candidate: (a function that runs its step once and returns its ms, its row).
  `skip`: {policy: the kernel table's ratio} of the policies predicted, not run,
  unless `own` (the run's policy). `base`: float32's row, measured earlier."""
  rows, steps = {}, {}
  for key in order:
    if key == F32 and base is not None:
      rows[key] = base
    elif key[0] in skip and key[0] != own:
      rows[key] = _predicted_row(key, skip[key[0]])
    else:
      try:
        steps[key], rows[key] = make(key)
      except (tf.errors.OpError, ValueError, TypeError, errors.UserError) as e:
        rows[key] = PolicyCost(key[0], stopped=_failed(e), layer_policy=key[1],
                               jit_compile=key[2])
  f32 = rows[F32] if rows[F32].stopped is None else None
  times = _rounds(order, steps, rows, f32, clock)
  _settle(rows, times, f32, skip)
  return [rows[k] for k in order]


def _rounds(order: list, steps: dict, rows: dict, f32: PolicyCost | None,
            clock: Clock) -> dict:
  """Every candidate's first call (float32's first), then every second call, then
  TIMED_STEPS rounds: {candidate: its timed ms}; a candidate stops where `_stop` or
  a failure says (float32's failure stops them all), or where its next timed step
  would pass the budget: the second calls and timed steps may take two of float32's
  steps and BUDGET_S more. First and second calls are the trace's (graph
  optimisation, kernel set-up: one each per candidate, bounded by `_stop`'s STOP x
  float32's): a first call says little of the step (EfficientNetB0's float16 first
  call took 12.1 s, its steps 0.46 s, on a Zen 4)."""
  times: dict = {}
  live = [k for k in order if k in steps and (f32 is not None or k == F32)]
  spent, allowed = 0.0, math.inf
  if F32 not in steps and rows[F32].second_ms:  # float32's row measured earlier.
    allowed = 2 * rows[F32].second_ms + BUDGET_S * 1e3
  for phase in ["first_ms", "second_ms"] + ["timed"] * TIMED_STEPS:
    for key in list(live):
      if key not in live:  # float32 failed earlier in this round.
        continue
      if key != F32 and phase == "timed" and spent + (
          times.get(key) or [rows[key].second_ms])[-1] > allowed:
        rows[key].stopped = rows[key].stopped or (
            f"the budget before step 1 (2 of float32's steps + {BUDGET_S:g} s of "
            "second calls and timed steps) was spent: timing stopped there")
        live.remove(key)
        continue
      try:
        ms = steps[key]()
      except (tf.errors.OpError, ValueError) as e:
        rows[key].stopped = _failed(e)
        live = [] if key == F32 else [k for k in live if k != key]
        continue
      spent += ms if phase != "first_ms" else 0.0  # Second calls and timed steps.
      if phase == "timed":
        times.setdefault(key, []).append(ms)
      else:
        setattr(rows[key], phase, ms)
      if key == F32 and phase == "second_ms":
        allowed = 2 * ms + BUDGET_S * 1e3
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


def stand_in() -> tuple[bool, Cost | None, str | None]:
  """$MPT_COST (records/keyed.py `stand_in`): a recorded cost.json, or `none`."""
  return keyed.stand_in(ENV, cost_lib.read)


def for_run(cfg: config.Config, build: Callable[[], keras.Model], planned_steps: int,
            fits: Callable[[], str | None] = lambda: None
            ) -> tuple[Cost | None, str | None]:
  """(this model's cost here, a note when there is none or where it came from).
  `build()` makes the model without --layer_policy's plan (timed as a row of its
  own); `fits()` says why the step at the run's batch would not fit in memory (the
  measurement is then skipped: the run's memory preflight says the rest)."""
  standing, found, note = stand_in()
  if standing:
    return found, note
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
                  plans=tuple(k for k in missing if k[1] or k[2] is not None))
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
  found = measure(cfg, lambda: model_lib.build_model(plain, 10), policies)
  cost_lib.write(pathlib.Path(out), found)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
