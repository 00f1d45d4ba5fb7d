"""The callbacks of one training run, in order, around ONE step counter.

Both loops call the same Keras callbacks in the same order (mpt/train/cli/loops.py).
`instrument.StepCounter` comes first: at a step's begin it knows the global step being run
(1-based), at its end the global steps completed, counted from the step the run
started or resumed at. Every callback that acts on a step number reads it from there,
so a resumed run's checkpoints, fault window, profile window and divergence message
agree. (The StepTimer's count is its own measurement: the steps it has timed, which
the resume state carries over, so it equals the counter.)

Order at a step's begin: the counter, the profile window, the fault injector. At its
end: the timer counts the step, the writer logs it, the guard may stop a diverged run
before the checkpoint is written, the numerics sample (after warm-up) is taken, a
signal stops the run after it. At an epoch's
begin the running metrics of a run resumed mid-epoch are put back; `MPT_KILL_AT`'s
kill points (tests of resume) come last of all.

`make(run)` builds them from the prepared run (mpt/train/cli/prepare.py), with what the
writer writes at the start (the run's texts and hparams) and what each checkpoint
stores beside the weights.
"""

import dataclasses
import functools
import statistics
from typing import Any

import keras
import tensorflow as tf

from mpt import config
from mpt import console
from mpt import injection
from mpt.measure import dtypes as dtypes_lib
from mpt.measure import instrument
from mpt.measure import profiler
from mpt.train.before_step1 import autopolicy
from mpt.train.cli import checkpoint
from mpt.train.cli import guards
from mpt.train.common import keras_fit
from mpt.train.common import numerics as numerics_lib
from mpt.train.common import precision
from mpt.train.common import steps as steps_lib
from mpt.train.common import countstep
from mpt.train.common import stepflops
from mpt.train.cli.prepare import Run


@dataclasses.dataclass
class RunCallbacks:
  """The run's callbacks by name; `ordered` is the list the loops get."""
  counter: instrument.StepCounter
  timer: instrument.StepTimer
  writer: instrument.ScalarWriter
  guard: guards.DivergenceGuard
  checkpoints: checkpoint.CheckpointCallback
  stop: guards.SignalStop
  metrics: checkpoint.RunningMetrics
  faults: guards.FaultInjector | None = None
  window: profiler.ProfileWindow | None = None
  lines: keras.callbacks.Callback | None = None  # A line per epoch off a terminal.
  loss_factor: tf.Variable | None = None  # What the fault injector sets, or None.
  kills: guards.KillPoints | None = None  # MPT_KILL_AT, or None.
  numerics: numerics_lib.Watch | None = None  # --numerics' samples, or None.
  flops: countstep.CountStep | None = None  # The step's FLOPs (with --instrument).

  @property
  def ordered(self) -> list[keras.callbacks.Callback]:
    return [c for c in (self.counter, self.metrics, self.window, self.faults, self.flops,
                        self.timer, self.writer, self.guard, self.checkpoints,
                        self.numerics, self.lines, self.stop, self.kills)
            if c is not None]


def make(run: Run) -> RunCallbacks:
  """Builds `run`'s callbacks. A resumed run (`start_step` > 0) writes no texts or
  hparams again: the first attempt's stay in the event files."""
  cfg, spe, optimizer = run.cfg, run.data.steps_per_epoch, run.optimizer
  counter = instrument.StepCounter(run.start_step)
  metrics = checkpoint.RunningMetrics(  # A resume mid-epoch puts its metrics back.
      run.prior.get("metrics") if run.start_step % spe else None, run.start_step // spe)
  timer = instrument.StepTimer(cfg.warmup_steps, run.prior.get("timer"))
  writer = instrument.ScalarWriter(
      str(run.out_dir), timer, cfg.batch_size, every=cfg.log_every,
      detailed=cfg.instrument,
      sources=instrument.Sources(
          sampler=run.sampler,
          precision_state=lambda: precision.scalars(optimizer, counter.done)),
      opening=instrument.Opening(
          _texts(run), hparams(cfg) if cfg.instrument and not cfg.resume else None,
          resumed=run.start_step > 0))
  dynamic = cfg.loss_scale == "dynamic"
  guard = guards.DivergenceGuard(
      lambda: counter.done,
      lambda: precision.loss_scale(optimizer) if dynamic else None, cfg.min_loss_scale)
  checkpoints = checkpoint.CheckpointCallback(
      run.ckpt, cfg.checkpoint_every, spe, lambda: counter.done,
      functools.partial(_checkpoint_state, run, timer, metrics), enabled=cfg.checkpoint,
      flush=writer.flush)
  found = RunCallbacks(counter, timer, writer, guard, checkpoints,
                       guards.SignalStop(lambda: counter.done, spe), metrics)
  if cfg.instrument:  # The step's FLOPs, from its graph once it ran (stepflops.py).
    found.flops = countstep.CountStep(writer.sources, default_args=(
        countstep.batch_specs(run.data.val.element_spec, cfg.batch_size),),
        counted=lambda found: stepflops.into_files(run.report, found, cfg.batch_size,
                                                   run.out_dir, writer))
  found.numerics = numerics_lib.for_run(run, steps_lib.make_loss(), lambda: counter.done,
                                        writer)
  if injection.kill_at():
    found.kills = guards.KillPoints(lambda: counter.done)
  found.lines = console.epoch_lines(
      cfg.verbose, cfg.epochs,
      lambda n: statistics.median(timer.durations_ms[-n:] or [0.0]))
  if cfg.faults:  # --fault_steps' window.
    found.loss_factor = tf.Variable(1.0, trainable=False, dtype=tf.float32)
    found.faults = guards.FaultInjector(found.loss_factor, cfg.fault_factor,
                                        cfg.faults, lambda: counter.current)
  if run.window:
    found.window = profiler.ProfileWindow(str(run.run_dir), *run.window,
                                          step=lambda: counter.current,
                                          marker=keras_fit.step_marker)
  return found


def _texts(run: Run) -> dict[str, str]:
  """The run's TensorBoard texts, written at its start."""
  texts = {"run/flags": "```\n" + config.to_flagfile(run.cfg) + "```",
           "precision/policy": precision.describe(run.policy),
           "run/strategy": run.dist.describe()}
  if run.before.choice:
    texts["precision/policy_choice"] = autopolicy.format_table(run.before.choice, True)
  if run.report:
    texts["inspect/dtypes"] = dtypes_lib.format_table(run.report, markdown=True)
  return texts


def hparams(cfg: config.Config) -> dict[str, Any]:
  """The run's hparams, for TensorBoard's HParams dashboard."""
  return {k: getattr(cfg, k) for k in (
      "policy", "loop", "model", "batch_size", "image_size", "jit_compile", "dataset",
      "strategy", "model_opts", "batchnorm")}


def _checkpoint_state(run: Run, timer: instrument.StepTimer,
                      metrics: checkpoint.RunningMetrics) -> dict[str, Any]:
  """What each checkpoint stores beside the weights, for a resumed run to report the
  whole run: step times, the running epoch's metrics, the sampler, wall time."""
  return {"timer": timer.state(), "metrics": metrics.state(),
          "sampler": run.sampler.state() if run.sampler else None,
          "wall_s": run.wall_s()}
