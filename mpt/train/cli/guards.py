"""What happens when a run goes wrong: divergence, signals, and injected faults.

- `DivergenceGuard` stops a run whose loss is NaN/Inf (any policy) or whose dynamic
  loss scale fell below `--min_loss_scale` (gradients stay non-finite however far the
  scale drops). It raises `Diverged` at the end of the step, before the checkpoint
  callback runs, so the last good checkpoint is never overwritten.
- `SignalStop` turns SIGINT and SIGTERM into a clean stop at the next step boundary,
  or after the epoch's evaluation when that step ends an epoch (checkpoint, events,
  summary.json `interrupted`); a second signal exits at once.
- `FaultInjector` multiplies the loss by `--fault_factor` during `--fault_steps`, the
  same way in both loops (the shared loss reads the factor variable), to exercise
  loss scaling (1e30 overflows float16 gradients) and divergence (nan).
- `KillPoints` kills the process at the moment `MPT_KILL_AT` names, to test resume.
(The faults a sweep must survive are injected by mpt/injection.py.)
"""

import math
import os
import signal
from typing import Callable

import keras
import tensorflow as tf

from mpt import injection
from mpt.errors import STOP_SIGNALS, stopped_by


class Diverged(Exception):
  """Training produced non-finite values it cannot recover from."""

  def __init__(self, step: int, reason: str):
    super().__init__(f"diverged at step {step}: {reason}")
    self.step, self.reason = step, reason


class Interrupted(Exception):
  """A SIGINT/SIGTERM asked the run to stop; raised at a step boundary."""


class DivergenceGuard(keras.callbacks.Callback):
  """`steps()`: global steps completed (the run's one step counter)."""

  def __init__(self, steps: Callable[[], int], loss_scale: Callable[[], float | None],
               min_loss_scale: float):
    super().__init__()
    self.steps, self.loss_scale, self.min_loss_scale = steps, loss_scale, min_loss_scale

  def on_train_batch_end(self, batch, logs=None):
    # Keras' `loss` is the epoch's running mean: one non-finite step makes it so.
    loss = (logs or {}).get("loss")
    if loss is not None and not math.isfinite(loss):
      raise Diverged(self.steps(), f"loss is {loss}")
    scale = self.loss_scale()
    if scale is not None and scale < self.min_loss_scale:
      raise Diverged(self.steps(), f"loss scale fell to {scale:g} (< --min_loss_scale="
                     f"{self.min_loss_scale:g}): gradients stay non-finite")


class SignalStop(keras.callbacks.Callback):
  """Defers SIGINT, SIGTERM, SIGHUP and SIGUSR1 (errors.STOP_SIGNALS) to the end of the
  running step, or, when that step ends an epoch, to the epoch's end: after its
  evaluation and its checkpoint (callbacks.py puts this callback after the
  checkpoint's), which a stop before the evaluation could not keep
  (mpt/train/cli/checkpoint.py). `steps()` is the global steps completed."""

  def __init__(self, steps: Callable[[], int], steps_per_epoch: int):
    super().__init__()
    self.signal: int | None = None
    self._announced = False
    self.steps, self.steps_per_epoch = steps, steps_per_epoch
    self._previous = {}

  def install(self) -> "SignalStop":
    for sig in STOP_SIGNALS:
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def uninstall(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}

  def _handle(self, signum, frame):
    if self.signal is not None:  # Second signal: no more waiting.
      if not self._announced:  # It arrived before the first handler had written.
        os.write(2, self._announcement(self.signal))
      os.write(2, b"\nmpt: second signal, exiting now\n")
      os._exit(stopped_by(signal.Signals(signum).name))
    self.signal = signum
    os.write(2, self._announcement(signum))
    self._announced = True

  @staticmethod
  def _announcement(signum: int) -> bytes:
    return (f"\nmpt: {signal.Signals(signum).name}: stopping after this step (or this "
            "epoch's evaluation; again to exit at once)\n").encode()

  def _stop(self) -> None:
    if self.signal is not None:
      raise Interrupted(signal.Signals(self.signal).name)

  def on_train_batch_end(self, batch, logs=None):
    if self.steps() % self.steps_per_epoch:
      self._stop()

  def on_epoch_end(self, epoch, logs=None):
    self._stop()


class FaultInjector(keras.callbacks.Callback):
  """Sets the loss factor variable to `factor` during global steps first..last;
  `step()` is the global step being run (1-based)."""

  def __init__(self, factor_var: tf.Variable, factor: float, window: tuple[int, int],
               step: Callable[[], int]):
    super().__init__()
    self.var, self.factor, self.window, self.current = factor_var, factor, window, step

  def on_train_batch_begin(self, batch, logs=None):
    inside = self.window[0] <= self.current() <= self.window[1]
    self.var.assign(self.factor if inside else 1.0)


class KillPoints(keras.callbacks.Callback):
  """SIGKILL at the moment `MPT_KILL_AT` names (mpt/injection.py): as a global step
  begins, once it and every callback after it have run (this callback is the last),
  or at the first batch of the evaluation that follows it. `steps()` is the global
  steps completed."""

  def __init__(self, steps: Callable[[], int]):
    super().__init__()
    self.steps = steps
    self._evaluating = False

  def on_train_batch_begin(self, batch, logs=None):
    injection.kill_point("begin", self.steps() + 1)

  def on_train_batch_end(self, batch, logs=None):
    injection.kill_point("end", self.steps())

  def on_test_begin(self, logs=None):
    self._evaluating = True

  def on_test_batch_begin(self, batch, logs=None):
    if self._evaluating:
      self._evaluating = False
      injection.kill_point("eval", self.steps())
