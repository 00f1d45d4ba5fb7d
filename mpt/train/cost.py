"""What this model's training step costs here under each policy, measured before step 1.

The kernel table (mpt/machine/kernels.py) times one small representative shape per op
type; a model's own layers are nothing like it (the seed convnet's 5x5 to 11x11
convolutions at 32 to 8 px), so its sums were right about the direction and 2-8x
wrong about the size. Here the model's own compiled train step (mpt/train/steps.py,
the custom loop's, with its optimizer and loss scaling) is built and timed under each
policy on random inputs of the run's shape and batch (a smaller batch was tried: the
fixed per-op cost then hides up to half of a 16-bit slowdown), float32 first. Each
policy's first call (graph optimisation, kernel set-up) and second (still warming up)
are recorded, then TIMED_STEPS are timed. A 16-bit policy's timing stops early where
it is clearly slow: after its first call when that took more than STOP times
float32's first call (oneDNN's reference kernels on a Sapphire Rapids: ~200x; the
estimate is that call less float32's first-call overhead), or after its second call
when that took more than STOP times float32's second (the estimate is that call
scaled by float32's own second-call-to-steady ratio).

On a GPU each policy's step is then profiled for PROFILED_STEPS more calls and the
captures read into the kernel table on a GPU (mpt/machine/gpu_table.py: per op family,
the share on Tensor Cores and the layers whose eligible kernels ran on CUDA cores),
which the verdict before step 1 and `--policy=auto` read from the Cost.

`for_run` is the training run's entry: a stand-in ($MPT_COST: a recorded cost.json,
or `none`), the cache (mpt/records/cost.py), a skip when the run is shorter than the
measurement, or a measurement in this process. `python -m mpt.train.cost FLAGFILE OUT
POLICIES` measures in a child process, for the oneDNN choice (mpt/train/onednn_choice.py),
which must set TF_ENABLE_ONEDNN_OPTS before TensorFlow is imported.
"""

import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Callable

import keras
import tensorflow as tf

from mpt import config
from mpt import errors
from mpt.machine import gpu_profile
from mpt.machine import gpu_specs
from mpt.machine import gpu_table
from mpt.machine import isa
from mpt.records import cost as cost_lib
from mpt.records.cost import Cost, PolicyCost
from mpt.train import keras_fit
from mpt.train import model as model_lib
from mpt.train import precision
from mpt.train import steps as steps_lib

ENV = "MPT_COST"
STOP = 5.0       # a 16-bit call this many times float32's: timing stops there
TIMED_STEPS = 2  # steps timed after the first two calls
PROFILED_STEPS = 2  # on a GPU, per policy: the kernel table's steps
MIN_RUN_STEPS = cost_lib.MIN_RUN_STEPS
Clock = Callable[[], float]


def _traced(policy: str, cfg: config.Config, build: Callable[[], keras.Model],
            batch: int, clock: Clock) -> tuple[Callable[[], float], PolicyCost]:
  """The model's compiled step under `policy`, traced (not yet run), as a function
  that runs it once and returns its ms; and the policy's row, its tracing timed."""
  keras.utils.set_random_seed(cfg.seed)
  precision.set_policy(policy)
  start = clock()
  model = build()
  optimizer = precision.make_optimizer(policy, cfg.learning_rate, cfg.loss_scale)
  step = steps_lib.Steps(model, optimizer, jit_compile=cfg.jit_compile,
                         global_batch=batch)
  size = cfg.image_size
  images = tf.random.stateless_uniform((batch, size, size, 3), (cfg.seed, 1))
  labels = tf.zeros((batch,), tf.int64)
  step.train_step.get_concrete_function(images, labels)

  def timed() -> float:
    begin = clock()
    float(step.train_step(images, labels)["loss"])  # Waits for the step's result.
    return round((clock() - begin) * 1e3, 3)

  return timed, PolicyCost(policy, trace_s=round(clock() - start, 3))


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


def _profiled(step: Callable[[], float], folder: pathlib.Path):
  """PROFILED_STEPS calls of `step` under TF's profiler, read (GpuProfile)."""
  tf.profiler.experimental.start(str(folder))
  try:
    for _ in range(PROFILED_STEPS):
      step()
  finally:
    tf.profiler.experimental.stop()
  found = gpu_profile.find_traces(folder)
  if not found:
    raise errors.UserError("the profiler wrote no capture")
  profile = gpu_profile.read(found[0])
  if profile.device is None or not profile.kernels:
    raise errors.UserError("; ".join(profile.notes) or "no GPU kernels in the capture")
  return profile


def kernel_table(steps: dict[str, Callable[[], float]]):
  """(the kernel table on this GPU from each policy's step profiled, or None, and why
  not). Never raises for a capture it cannot read: the table is evidence, not the run."""
  profiles = {}
  with tempfile.TemporaryDirectory(prefix="mpt-kernels-") as tmp:
    for policy, step in steps.items():
      try:
        profiles[policy] = _profiled(step, pathlib.Path(tmp) / policy)
      except (errors.UserError, tf.errors.OpError) as e:
        return None, f"the kernel table on this GPU was not read ({policy}): {e}"
  if not profiles:
    return None, "the kernel table on this GPU was not read: no policy's step ran"
  device = next(iter(profiles.values())).device
  name = (gpu_specs.identify(device)[0] or device.model or device.name) if device else "GPU"
  notes = sorted({n for p in profiles.values() for n in p.notes})
  return gpu_table.table(profiles, PROFILED_STEPS, name, notes), None


def measure(cfg: config.Config, build: Callable[[], keras.Model],
            policies=cost_lib.POLICIES, clock: Clock = time.perf_counter,
            base: PolicyCost | None = None, gpu: bool | None = None) -> Cost:
  """Times the model's step under `policies` in this process, interleaved: every
  policy's first call (float32's first), then every second call, then TIMED_STEPS
  rounds, so that the machine's ups and downs fall on every policy alike. `base`:
  float32's row from an earlier measurement, not timed again. `gpu`: profile each
  policy's step into the kernel table (default: where TF sees a GPU)."""
  batch = cost_lib.device_batch(cfg)
  onednn = keras_fit.onednn_rewrite_on()
  found = Cost(cost_lib.key_for(cfg, onednn, isa.detect()), onednn, batch)
  start = clock()
  keras.backend.clear_session()
  order = ["float32"] + [p for p in policies if p != "float32"]
  steps, rows, times = {}, {}, {}
  for policy in order:
    if policy == "float32" and base is not None:
      rows[policy] = base
      continue
    try:
      steps[policy], rows[policy] = _traced(policy, cfg, build, batch, clock)
    except (tf.errors.OpError, ValueError, TypeError) as e:  # Not buildable here.
      rows[policy] = PolicyCost(policy, stopped=_failed(e))
  f32 = rows["float32"] if rows["float32"].stopped is None else None
  live = [p for p in order if p in steps and (f32 is not None or p == "float32")]
  for phase in ["first_ms", "second_ms"] + ["timed"] * TIMED_STEPS:
    for policy in list(live):
      if policy not in live:  # float32 failed earlier in this round.
        continue
      try:
        ms = steps[policy]()
      except (tf.errors.OpError, ValueError) as e:
        rows[policy].stopped = _failed(e)
        live = [] if policy == "float32" else [p for p in live if p != policy]
        continue
      if phase == "timed":
        times.setdefault(policy, []).append(ms)
      else:
        setattr(rows[policy], phase, ms)
      if _stop(rows[policy], f32 if policy != "float32" else None):
        live.remove(policy)
  for policy, row in rows.items():
    if times.get(policy):
      row.steps_timed = len(times[policy])
      row.ms_per_step = round(statistics.median(times[policy]), 3)
    elif row.stopped and row.first_ms and f32 and f32.ms_per_step:
      row.ms_per_step = round(_estimate(row, f32), 3)
  for row in rows.values():
    if row.ms_per_step is None and not row.stopped:
      row.stopped = "not timed: float32's step could not be timed"
  found.policies = [rows[p] for p in order]
  if gpu if gpu is not None else bool(tf.config.list_logical_devices("GPU")):
    ran = {p: steps[p] for p in order
           if p in steps and not (rows[p].stopped or "").startswith("failed")}
    found.gpu_kernels, found.gpu_kernels_note = kernel_table(ran)
  precision.set_policy("float32")
  keras.backend.clear_session()
  found.seconds = round(clock() - start, 2)
  return found


def _failed(e: Exception) -> str:
  return f"failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def for_run(cfg: config.Config, build: Callable[[], keras.Model], planned_steps: int,
            fits: Callable[[], str | None] = lambda: None
            ) -> tuple[Cost | None, str | None]:
  """(this model's cost here, a note when there is none or where it came from).
  `fits()` says why the step at the run's batch would not fit in memory (the
  measurement is then skipped: the run's memory preflight says the rest)."""
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
  want = cost_lib.POLICIES
  cached = cost_lib.cached(cost_lib.key_for(
      cfg, keras_fit.onednn_rewrite_on(), isa.detect()))
  if cached and all(cached.of(p) for p in want):
    return cached, None
  if planned_steps < MIN_RUN_STEPS:
    return None, (f"the step's cost per policy was not measured: this run's "
                  f"{planned_steps} steps cost about what measuring them would")
  too_big = fits()
  if too_big:
    return None, f"the step's cost per policy was not measured: {too_big}"
  missing = [p for p in want if not (cached and cached.of(p))]
  fresh = measure(cfg, build, missing, base=cached.of("float32") if cached else None)
  if cached:  # The oneDNN choice measured some policies already: keep them.
    fresh.policies = [cached.of(p) or fresh.of(p) for p in want]
    fresh.seconds = round(cached.seconds + fresh.seconds, 2)
  cost_lib.save(fresh)
  return fresh, None


def one_line(cost: Cost, onednn: str) -> str:
  """`mpt: cost here, oneDNN's rewrite ..., measured in ...: float32 ~200 ms/step,
  mixed_float16 ~740 (3.7x), ...`"""
  ratios, parts = cost.ratios(), []
  for p in cost.policies:
    if not p.ms_per_step:
      parts.append(f"{p.policy} ? ({p.stopped or 'not measured'})")
      continue
    ms = f"~{p.ms_per_step:,.0f}" if p.ms_per_step >= 10 else f"~{p.ms_per_step:.1f}"
    if p.policy == "float32":
      parts.append(f"{p.policy} {ms} ms/step")
    else:
      parts.append(f"{p.policy} {ms} ({ratios.get(p.policy, 0):.2g}x"
                   + (", timing stopped early" if p.stopped else "") + ")")
  how = (f"measured in {cost.seconds:.1f} s at batch {cost.batch}"
         if cost.source == "measured" else cost.source)
  return f"mpt: cost here, oneDNN's rewrite {onednn}, {how}: " + ", ".join(parts)


def main(argv: list[str]) -> int:
  """The oneDNN choice's child: `FLAGFILE OUT POLICIES` -> OUT holds a cost.json."""
  flagfile, out, policies = argv[1], argv[2], argv[3].split(",")
  cfg = config.from_flagfile(pathlib.Path(flagfile).read_text())
  found = measure(cfg, lambda: model_lib.build_model(cfg, 10), policies)
  cost_lib.write(pathlib.Path(out), found)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
