"""The callbacks of one training run, in order, around ONE step counter.

Both loops call the same Keras callbacks in the same order (mpt/train/loops.py).
`StepCounter` comes first: at a step's begin it knows the global step being run
(1-based), at its end the global steps completed, counted from the step the run
started or resumed at. Every callback that acts on a step number reads it from there,
so a resumed run's checkpoints, fault window, profile window and divergence message
agree. (The StepTimer's count is its own measurement: the steps it has timed, which
the resume state carries over, so it equals the counter.)

Order at a step's begin: the counter, the profile window, the fault injector. At its
end: the timer counts the step, the writer logs it, the guard may stop a diverged run
before the checkpoint is written, a signal stops the run after it. At an epoch's
begin the running metrics of a run resumed mid-epoch are put back; `MPT_KILL_AT`'s
kill points (tests of resume) come last of all.
"""

import dataclasses
import statistics
from typing import Any, Callable

import keras
import tensorflow as tf

from mpt import console
from mpt import injection
from mpt.config import Config
from mpt.measure import instrument
from mpt.measure import profiler
from mpt.measure import sampler as sampler_lib
from mpt.train import checkpoint
from mpt.train import guards
from mpt.train import keras_fit


class StepCounter(keras.callbacks.Callback):
  """The run's global step: `current` is being run, `done` have completed."""

  def __init__(self, start_step: int):
    super().__init__()
    self.done = self.current = start_step

  def on_train_batch_begin(self, batch, logs=None):
    self.current = self.done + 1

  def on_train_batch_end(self, batch, logs=None):
    self.done += 1


@dataclasses.dataclass
class RunCallbacks:
  """The run's callbacks by name; `ordered` is the list the loops get."""
  counter: StepCounter
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

  @property
  def ordered(self) -> list[keras.callbacks.Callback]:
    first = [c for c in (self.counter, self.metrics, self.window, self.faults)
             if c is not None]
    lines = [self.lines] if self.lines else []
    kills = [self.kills] if self.kills else []
    return (first + [self.timer, self.writer, self.guard, self.checkpoints] + lines +
            [self.stop] + kills)


def make(cfg: Config, *, out_dir: str, profile_dir: str, start_step: int,
         prior: dict[str, Any], window: tuple[int, int] | None,
         fault_window: tuple[int, int] | None, ckpt: checkpoint.Checkpointer,
         steps_per_epoch: int, sampler: sampler_lib.Sampler | None,
         flops_per_step: int | None, loss_scale: Callable[[], float | None],
         skipped_steps: Callable[[int], int], texts: dict[str, str],
         hparams: dict[str, Any] | None,
         state: Callable[[instrument.StepTimer, checkpoint.RunningMetrics],
                         dict[str, Any]]) -> RunCallbacks:
  """Builds the run's callbacks; `state(timer, metrics)` is what each checkpoint
  stores. A resumed run (`start_step` > 0) writes no texts or hparams again: the
  first attempt's stay in the event files."""
  counter = StepCounter(start_step)
  mid_epoch = start_step % steps_per_epoch
  metrics = checkpoint.RunningMetrics(prior.get("metrics") if mid_epoch else None,
                                      start_step // steps_per_epoch)
  timer = instrument.StepTimer(cfg.warmup_steps, prior.get("timer"))
  writer = instrument.ScalarWriter(
      out_dir, timer, cfg.batch_size, every=cfg.log_every, detailed=cfg.instrument,
      sampler=sampler, flops_per_step=flops_per_step,
      precision_state=lambda: {"loss_scale": loss_scale() or 1.0,
                               "skipped_steps": skipped_steps(counter.done)},
      texts=texts, hparams=hparams, resumed=start_step > 0)
  dynamic = cfg.loss_scale == "dynamic"
  guard = guards.DivergenceGuard(lambda: counter.done,
                                 lambda: loss_scale() if dynamic else None,
                                 cfg.min_loss_scale)
  checkpoints = checkpoint.CheckpointCallback(
      ckpt, cfg.checkpoint_every, steps_per_epoch, lambda: counter.done,
      lambda: state(timer, metrics), enabled=cfg.checkpoint, flush=writer.flush)
  found = RunCallbacks(counter, timer, writer, guard, checkpoints,
                       guards.SignalStop(lambda: counter.done, steps_per_epoch), metrics)
  if injection.kill_at():
    found.kills = guards.KillPoints(lambda: counter.done)
  found.lines = console.epoch_lines(
      cfg.verbose, cfg.epochs,
      lambda n: statistics.median(timer.durations_ms[-n:] or [0.0]))
  if fault_window:
    found.loss_factor = tf.Variable(1.0, trainable=False, dtype=tf.float32)
    found.faults = guards.FaultInjector(found.loss_factor, cfg.fault_factor,
                                        fault_window, lambda: counter.current)
  if window:
    found.window = profiler.ProfileWindow(profile_dir, *window,
                                          step=lambda: counter.current,
                                          marker=keras_fit.step_marker)
  return found
