"""What happens when a run goes wrong: divergence, signals, and injected faults.

- `DivergenceGuard` stops a run whose loss is NaN/Inf (any policy) or whose dynamic
  loss scale fell below `--min_loss_scale` (gradients stay non-finite however far the
  scale drops). It raises `Diverged` at the end of the step, before the checkpoint
  callback runs, so the last good checkpoint is never overwritten.
- `SignalStop` turns SIGINT and SIGTERM into a clean stop at the next step boundary
  (checkpoint, events, summary.json `interrupted`); a second signal exits at once.
- `FaultInjector` multiplies the loss by `--fault_factor` during `--fault_steps`, the
  same way in both loops (the shared loss reads the factor variable), to exercise
  loss scaling (1e30 overflows float16 gradients) and divergence (nan).
- `inject_run_fault` ends a run the ways a sweep cell can end badly (out of memory,
  killed, failed), driven by `MPT_INJECT_FAULT`.
"""

import math
import os
import signal
import sys
from typing import Callable

import keras
import tensorflow as tf



class Diverged(Exception):
  """Training produced non-finite values it cannot recover from."""

  def __init__(self, step: int, reason: str):
    super().__init__(f"diverged at step {step}: {reason}")
    self.step, self.reason = step, reason


class Interrupted(Exception):
  """A SIGINT/SIGTERM asked the run to stop; raised at a step boundary."""


class DivergenceGuard(keras.callbacks.Callback):
  def __init__(self, first_step: int, loss_scale: Callable[[], float | None],
               min_loss_scale: float):
    super().__init__()
    self.step, self.loss_scale, self.min_loss_scale = first_step, loss_scale, min_loss_scale

  def on_train_batch_end(self, batch, logs=None):
    self.step += 1
    # Keras' `loss` is the epoch's running mean: one non-finite step makes it so.
    loss = (logs or {}).get("loss")
    if loss is not None and not math.isfinite(loss):
      raise Diverged(self.step, f"loss is {loss}")
    scale = self.loss_scale()
    if scale is not None and scale < self.min_loss_scale:
      raise Diverged(self.step, f"loss scale fell to {scale:g} (< --min_loss_scale="
                     f"{self.min_loss_scale:g}): gradients stay non-finite")


class SignalStop(keras.callbacks.Callback):
  """Defers SIGINT/SIGTERM to the end of the running step."""

  def __init__(self):
    super().__init__()
    self.signal: int | None = None
    self._previous = {}

  def install(self) -> "SignalStop":
    for sig in (signal.SIGINT, signal.SIGTERM):
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def uninstall(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}

  def _handle(self, signum, frame):
    if self.signal is not None:  # Second signal: no more waiting.
      os.write(2, b"\nmpt: second signal, exiting now\n")
      os._exit(130)
    self.signal = signum
    sys.stderr.write(f"\nmpt: {signal.Signals(signum).name}: stopping after this step "
                     "(again to exit at once)\n")

  def on_train_batch_end(self, batch, logs=None):
    if self.signal is not None:
      raise Interrupted(signal.Signals(self.signal).name)

  on_test_batch_end = on_train_batch_end


class FaultInjector(keras.callbacks.Callback):
  """Sets the loss factor variable to `factor` during global steps first..last."""

  def __init__(self, factor_var: tf.Variable, factor: float, window: tuple[int, int],
               first_step: int):
    super().__init__()
    self.var, self.factor, self.window, self.step = factor_var, factor, window, first_step

  def on_train_batch_begin(self, batch, logs=None):
    self.step += 1
    inside = self.window[0] <= self.step <= self.window[1]
    self.var.assign(self.factor if inside else 1.0)


def inject_run_fault(batch_size: int, policy: str) -> None:
  """Fault injection for sweeps: `MPT_INJECT_FAULT=KIND:N[/POLICY][,...]` makes a run of
  batch size N (under POLICY only, if given) end as a sweep must survive, right
  before its first step. KIND is `oom` (TensorFlow's ResourceExhaustedError, as when
  an allocation fails), `kill` (SIGKILL to itself, as the kernel's OOM killer does)
  or `fail` (an exception, as a bug). No memory is exhausted: a real OOM cannot be
  forced portably, and a sweep's handling of each ending must still be testable."""
  for spec in filter(None, os.environ.get("MPT_INJECT_FAULT", "").split(",")):
    kind, _, target = spec.partition(":")
    batch, _, only = target.partition("/")
    if kind not in ("oom", "kill", "fail") or not batch.isdigit():
      raise ValueError(f"MPT_INJECT_FAULT: {spec!r} is not KIND:N[/POLICY] with KIND "
                       "oom, kill or fail")
    if int(batch) != batch_size or only not in ("", policy):
      continue
    if kind == "kill":
      sys.stdout.flush()
      os.kill(os.getpid(), signal.SIGKILL)
    if kind == "oom":
      raise tf.errors.ResourceExhaustedError(
          None, None, f"OOM when allocating tensor with batch {batch_size} "
          f"(injected: MPT_INJECT_FAULT={spec})")
    raise RuntimeError(f"injected failure (MPT_INJECT_FAULT={spec})")
