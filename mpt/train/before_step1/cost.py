"""What this model's training step costs here under each policy, measured before step 1.

The kernel table's representative shapes (mpt/machine/kernels.py) were right about the
direction and 2-8x wrong about the size of a model's step. Here its own compiled step
(mpt/train/common/steps.py, the custom loop's, with its optimizer and loss scaling) is
timed under each policy on random inputs of the run's shape and batch (a smaller batch
was tried: the fixed per-op cost then hides up to half of a 16-bit slowdown), float32
first. The model is built once; each candidate's step is traced with its layers switched
to the candidate's policies (mpt/measure/policies.py: the graph keeps the dtypes it was
traced with), so a script's model, which mpt cannot rebuild, is timed by the same
`time_candidates` (mpt/train/before_step1/scriptcost.py).

`time_candidates` times them by the one timer (mpt/measure/timer.py): float32 first,
then the run's own policy, then the others, interleaved, each until its last calls
agree; a candidate stopped by the budget is a bound ("at most 8.7x float32's time"),
never an estimate. The budget: the calls after the first ones may take two of float32's
steps and BUDGET_S more, and the whole measurement, traces included, at most SHARE of
the training the run plans (its planned steps at the step's time). A policy whose ops
the machine's cached kernel table measured fastpath.PATHOLOGICAL times float32's is not run
unless it is the run's own: its step is float32's by that ratio (a mixed_float16 step of
the seed convnet takes 13-17 s on a Sapphire Rapids; the table knows). Where no table is
cached, the model's weight-gradient kernels are timed in this process instead
(mpt/measure/gradkernels.py, ~0.1-1.5 s): a fresh machine learns that from one kernel
call, not from a step. A per-layer plan (--layer_policy, or the one `--policy=auto`
weighs) is a row of its own, and so is a run with XLA's step without it (XLA measured
12-29x slower on a CPU).

This is the one timing before step 1: the warning, `--policy=auto`, the oneDNN choice
and the diagnosis read it. On a GPU each policy's step is then profiled
(mpt/train/before_step1/gpu_steps.py) into the kernel table on a GPU. `for_run` is the
run's entry: a stand-in ($MPT_COST: a recorded cost.json, or `none`), the cache
(mpt/records/cost.py), a skip for a run shorter than the measurement, or a measurement
here. `python -m mpt.train.before_step1.cost FLAGFILE OUT POLICIES` measures in a child,
for the oneDNN choice (mpt/train/before_step1/onednn_choice.py: TF_ENABLE_ONEDNN_OPTS
must be set before TensorFlow is imported).
"""

import dataclasses
import math
import os
import pathlib
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
from mpt.measure import timer
from mpt.records import cost as cost_lib
from mpt.records import keyed
from mpt.records.cost import Cost, PolicyCost
from mpt.train.before_step1 import gpu_steps
from mpt.train.common import keras_fit
from mpt.train.common import model as model_lib
from mpt.train.common import precision
from mpt.train.common import steps as steps_lib
from mpt.train.common.plan import Plan

ENV = "MPT_COST"
ALWAYS = "always"
# Milliseconds of calls after the first ones allowed besides two of float32's steps (a
# candidate's first call optimises its graph: it counts as its trace).
BUDGET_S = 5.0
SHARE = 0.10  # Of the training a run plans: what measuring its step may take.
MIN_RUN_STEPS = cost_lib.MIN_RUN_STEPS
NOT_MEASURED = "the step's cost per policy was not measured: "
F32 = ("float32", "", None)  # A candidate: (policy, layer_policy, XLA where not the run's).
ERRORS = (tf.errors.OpError, ValueError, TypeError, errors.UserError)
Clock = Callable[[], float]
Key = tuple  # (policy, layer_policy, jit_compile or None)
# Traces a candidate: a function that runs its step once and waits for it; it marks
# the candidate's key in the set it is given where its loss is not finite.
Make = Callable[[Key, set], timer.Call]
Table = Callable[[list[str]], dict | None]  # Op families -> a kernel table, or None.


def stepper(cfg: config.Config, model: keras.Model, batch: int) -> Make:
  """The command line's candidates over one built `model`: for a key (policy,
  layer_policy's plan over it, the XLA setting where it is not the run's), mpt's
  compiled train step (mpt/train/common/steps.py) with its own optimizer and loss scaling,
  traced with the model's layers switched to the key's policies (the graph keeps
  them; the model is given back as it was built)."""
  size = cfg.image_size
  images = tf.random.stateless_uniform((batch, size, size, 3), (cfg.seed, 1))
  labels = tf.zeros((batch,), tf.int64)

  def make(key: Key, infinite: set) -> timer.Call:
    policy, layer_policy, jit = key
    plan = dataclasses.replace(Plan.of(cfg), policy=policy, layer_policy=layer_policy)
    with policies.switched(model, policies.uniform(policy, plan.layers)):
      optimizer = precision.make_optimizer(policy, cfg.learning_rate, cfg.loss_scale,
                                           scaled=plan.scales_loss)
      step = steps_lib.Steps(model, optimizer,
                             jit_compile=cfg.jit_compile if jit is None else jit,
                             global_batch=batch)
      step.train_step.get_concrete_function(images, labels)
    return waited(lambda: step.train_step(images, labels)["loss"], key, infinite)

  return make


def cache_key(cfg: config.Config) -> dict:
  """The cache key of `cfg`'s step here (the oneDNN rewrite's state in this process)."""
  return cost_lib.key_for(cfg, keras_fit.onednn_rewrite_on(), isa.detect())


def waited(run: Callable[[], Any], key: Key, infinite: set) -> timer.Call:
  """One call of `run` with its result read back (waits for the work); a non-finite
  loss puts `key` in `infinite`."""
  def call() -> None:
    if not math.isfinite(float(run())):
      infinite.add(key)
  return call


def kernel_table(families) -> dict | None:
  """The kernel table every measurement before step 1 reads: $MPT_KERNELS or the
  machine's cached table; on a CPU with neither, the weight-gradient kernels of
  `families` timed here (mpt/measure/gradkernels.py). None on a GPU: its table comes
  from each policy's step profiled (gpu_steps.py)."""
  return None if tf.config.list_logical_devices("GPU") else kernels.table(
      probe_if_missing=False, missing=lambda: gradkernels.table(families))[0]


def pathological(model: keras.Model, table: Table = kernel_table) -> dict[str, float]:
  """fastpath.pathological for this model's layer classes, from `table(families)`."""
  families = fastpath.families_of(precision.layer_classes(model))
  return fastpath.pathological(table(families), families)


def measure(cfg: config.Config, build: Callable[[], keras.Model],
            policies=tuple(config.POLICY_DTYPE), clock: Clock = time.perf_counter,
            gpu: bool | None = None, plans: tuple[tuple[str, str], ...] = (),
            table: Table = kernel_table, planned_steps: int | None = None) -> Cost:
  """Times the model's step under `policies` and the per-layer `plans` ((policy,
  layer_policy) pairs) in this process, over one model built once, by
  `time_candidates` (`table`: its kernel table); `gpu`: profile each policy's step into
  the kernel table (default: where TF sees a GPU); `planned_steps`: the run's."""
  batch = cost_lib.device_batch(cfg)
  found = Cost(cache_key(cfg), keras_fit.onednn_rewrite_on(), batch)
  start = clock()
  # Keras' state fresh; memory is freed after the measurement (below), not before.
  keras.backend.clear_session(free_memory=False)
  keras.utils.set_random_seed(cfg.seed)
  # Built under a 16-bit policy, so that a layer the model pins to float32 (its
  # softmax) stands out from those that follow the policy (mpt/measure/policies.py).
  precision.set_policy("mixed_bfloat16")
  order = [F32] + [(p, "", None) for p in policies if p != "float32"] + [
      (*p, None)[:3] for p in plans]
  try:
    model = build()
  except ERRORS as e:
    precision.set_policy("float32")
    found.policies = [PolicyCost(k[0], stopped=timer.failure(e), layer_policy=k[1],
                                 jit_compile=k[2]) for k in order]
    return found
  steps, make = {}, stepper(cfg, model, batch)

  def made(key: Key, infinite: set) -> timer.Call:  # Kept: the GPU profile runs it again.
    steps[key] = make(key, infinite)
    return steps[key]
  found.policies = time_candidates(order, made, pathological(model, table), cfg.policy,
                                   clock, planned_steps)
  if gpu if gpu is not None else tf.config.list_logical_devices("GPU"):
    ran = {k[0]: steps[k] for k, row in zip(order, found.policies)
           if k in steps and not k[1] and k[2] is None and row.ms_per_step}
    found.gpu_kernels, found.gpu_kernels_note = gpu_steps.kernel_table(ran)
  precision.set_policy("float32")
  keras.backend.clear_session()  # The timed model's memory freed before the run's.
  found.seconds = round(clock() - start, 2)
  return found


def budgets(planned_steps: int | None, own: Key) -> tuple[timer.Budget, timer.Budget]:
  """(the calls' budget, the whole measurement's): the module docstring's, the share at
  the run's own step (float32's until its own is timed), none where the run's length
  is not known."""
  def share(timings: dict) -> float:
    ms = timer.latest(timings.get(own)) or timer.latest(timings.get(F32))
    return SHARE * planned_steps * ms if planned_steps and ms else math.inf

  calls = timer.baseline_budget(F32, 2, BUDGET_S, f"the budget (2 of float32's steps "
                                f"and {BUDGET_S:g} s after the first calls)")
  return calls, timer.Budget(share, f"{SHARE:.0%} of the run's planned training")


def time_candidates(order: list[Key], make: Make, skip: dict[str, float], own: str,
                    clock: Clock = time.perf_counter, planned_steps: int | None = None
                    ) -> list[PolicyCost]:
  """Each candidate's row, in `order` (float32 first), timed as the module docstring
  says; `make(key, infinite)` traces a candidate; `skip`: {policy: the kernel table's
  ratio} of the policies predicted, not run, unless `own` (the run's policy)."""
  own_key = next((k for k in order if k[0] == own and not k[1]), F32)
  timed = [k for k in order if k[0] not in skip or k[0] == own]
  timed = [F32] + [own_key] * (own_key != F32) + [
      k for k in timed if k not in (F32, own_key)]
  infinite: set = set()
  calls, total = budgets(planned_steps, own_key)
  timings = timer.run([(k, lambda k=k: make(k, infinite)) for k in timed], calls=calls,
                      total=total, clock=clock, catch=ERRORS)
  rows = {k: _row(k, t, k not in infinite) for k, t in timings.items()}
  for row in rows.values():
    if row.stopped == f"not timed: {total.words} was spent":
      _unpaid(row, planned_steps, timings)
  return [rows[k] if k in rows else _predicted_row(k, skip[k[0]], rows[F32])
          for k in order]


def _unpaid(row: PolicyCost, planned_steps: int, timings: dict) -> None:
  """A policy the share left untimed: said with the run's figures; a later run of
  no more steps reads it as known (`skipped_at`), a longer one times it."""
  ms = timer.latest(timings[F32]) or 0.0
  row.skipped_at = planned_steps
  row.stopped = (f"not timed: {SHARE:.0%} of the run's planned training ({planned_steps} "
                 f"steps of ~{ms:,.0f} ms: {SHARE * planned_steps * ms / 1e3:.2g} s) was "
                 "spent; a run of more steps times it")


def _row(key: Key, t: timer.Timing, finite: bool) -> PolicyCost:
  """A candidate's row from its timing."""
  return PolicyCost(key[0], ms_per_step=t.ms, first_ms=t.first_ms, trace_s=t.trace_s,
                    steps_timed=len(t.calls), spread=t.spread, bound=t.bound,
                    stopped=t.stopped, layer_policy=key[1], finite=finite,
                    jit_compile=key[2])


def _predicted_row(key: tuple, ratio: float, f32: PolicyCost) -> PolicyCost:
  """float32's step by the kernel table's ratio (where float32 has a figure)."""
  ms = round(f32.ms_per_step * ratio, 3) if f32.ms_per_step and not f32.bound else None
  return PolicyCost(key[0], ms_per_step=ms, layer_policy=key[1], jit_compile=key[2],
                    predicted=True, stopped=(
      f"predicted from the kernel table ({cost_lib.times(ratio)} float32's ops), not timed"))


def stand_in() -> tuple[bool, Cost | None, str | None]:
  """$MPT_COST (records/keyed.py `stand_in`): a recorded cost.json, or `none`;
  `always` stands in for nothing (`planned`)."""
  return (False, None, None) if os.environ.get(ENV) == ALWAYS else \
      keyed.stand_in(ENV, cost_lib.read)


def planned(steps: int | None) -> int | None:
  """The planned steps a measurement's share and skip follow: None (no share, no
  skip) where $MPT_COST=always asks for the measurement whatever the run's length
  (experiments that check it against runs too short to pay for it)."""
  return None if os.environ.get(ENV) == ALWAYS else steps


def too_short(planned_steps: int | None) -> str | None:
  """Why a run of `planned_steps` (None: not known) measures nothing, or None."""
  if planned_steps is not None and planned_steps < MIN_RUN_STEPS:
    return f"this run's {planned_steps} steps cost about what measuring them would"
  return None


def for_run(cfg: config.Config, build: Callable[[], keras.Model], planned_steps: int,
            fits: Callable[[], str | None] = lambda: None
            ) -> tuple[Cost | None, str | None]:
  """(this model's cost here, a note when there is none or where it came from).
  `build()` makes the model without --layer_policy's plan (timed as a row of its
  own); `planned_steps`: the run's (the skip, the share); `fits()` says why the step
  at the run's batch would not fit in memory (the measurement is then skipped: the
  run's memory preflight says the rest)."""
  standing, found, note = stand_in()
  if standing:
    return found, note
  want = [(p, "", None) for p in config.POLICY_DTYPE] + (
      [(cfg.policy, cfg.layer_policy, None)] if cfg.layer_policy else []) + (
      # A run with XLA: its step without it too (XLA measured 12-29x slower on a CPU).
      [(cfg.policy, cfg.layer_policy, False)] if cfg.jit_compile
      and cfg.policy != "auto" else [])
  cached, planned_steps = cost_lib.cached(cache_key(cfg)), planned(planned_steps)
  have = lambda k: bool(cached and cached.of(*k) and cached.of(*k).known_for(
      planned_steps) and not (
      k[0] == cfg.policy and cached.of(*k).predicted))  # The run's own is timed.
  if all(have(k) for k in want):
    return cached, None
  why = too_short(planned_steps) or fits()
  if why:
    return None, NOT_MEASURED + why
  missing = [k for k in want if not have(k)]
  fresh = measure(cfg, build, [p for p, plan, jit in missing if not plan and jit is None],
                  plans=tuple(k for k in missing if k[1] or k[2] is not None),
                  # --policy=auto chooses from every policy: no share cuts it short.
                  planned_steps=None if cfg.policy == "auto" else planned_steps)
  if cached:  # The oneDNN choice measured some policies already: keep them.
    fresh.policies = [fresh.of(*k) if not have(k) or k == F32 else
                      _rebased(cached.of(*k), cached, fresh) for k in want]
    fresh.seconds = round(cached.seconds + fresh.seconds, 2)
  cost_lib.save(fresh)
  return fresh, None


def _rebased(row: PolicyCost, cached: Cost, fresh: Cost) -> PolicyCost:
  """A cached row beside a fresh measurement: its ratio to its own float32 kept, over
  the fresh float32 (the one baseline a record's ratios are read against)."""
  old, new = cached.of("float32"), fresh.of("float32")
  if not (row.ms_per_step and old and old.ms_per_step and new and new.ms_per_step):
    return row
  return dataclasses.replace(row, ms_per_step=round(
      row.ms_per_step * new.ms_per_step / old.ms_per_step, 3))


def checked_by_run(cost: Cost | None, policy: str, layer_policy: str,
                   run_ms: float | None, steps: int, where: str) -> Cost | None:
  """`cost` after the run's own `steps` (median `run_ms`) checked its own policy's
  row; `cost` as it was where they agree within the row's spread (at least the
  timer's SPREAD). Else the record takes the run's figure and the cache entry is
  replaced: a settled row that disagrees was timed at another level than the run
  runs (fit's loop around the step, the machine's load), so every row is scaled
  alike (their ratios were timed side by side); a bound is replaced by the run's
  figure alone. The row's `from_run` says both figures (the diagnosis says it; so
  does a line here)."""
  row = cost.of(policy, layer_policy) if cost else None
  if row is None or row.predicted or not run_ms or cost.source.startswith("recorded"):
    return cost
  if row.ms_per_step and not row.bound and abs(run_ms / row.ms_per_step - 1) <= max(
      timer.SPREAD, row.spread or 0.0):
    return cost
  timed = (f"{row.bound + ' ' if row.bound else ''}{row.ms_per_step:,.1f} ms"
           if row.ms_per_step else "no figure")
  scale = run_ms / row.ms_per_step if row.ms_per_step and not row.bound else None
  note = (f"{where}: its own {steps} steps measured {run_ms:,.1f} ms/step; timed "
          f"before step 1: {timed}" + (", every row scaled alike" if scale else ""))
  rows = []
  for p in cost.policies:
    if p is row:
      p = dataclasses.replace(p, ms_per_step=round(run_ms, 3), bound=None, stopped=None,
                              timed_ms=p.timed_ms or p.ms_per_step, from_run=note)
    elif scale and p.ms_per_step:
      p = dataclasses.replace(p, ms_per_step=round(p.ms_per_step * scale, 3),
                              timed_ms=p.timed_ms or p.ms_per_step)
    rows.append(p)
  found = dataclasses.replace(cost, policies=rows)
  cost_lib.save(found)
  print(f"mpt: note: the step's cost per policy: {note}", flush=True)
  return found


def main(argv: list[str]) -> int:
  """The oneDNN choice's child: `FLAGFILE OUT POLICIES [PLANNED_STEPS]` -> OUT holds a
  cost.json."""
  flagfile, out, policies = argv[1], argv[2], argv[3].split(",")
  planned = int(argv[4]) if len(argv) > 4 and argv[4] else None
  cfg = config.from_flagfile(pathlib.Path(flagfile).read_text())
  plain = dataclasses.replace(cfg, layer_policy="")  # A plan is a row of its own.
  found = measure(cfg, lambda: model_lib.build_model(plain, 10), policies,
                  planned_steps=planned)
  cost_lib.write(pathlib.Path(out), found)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
