"""Profiler window: a TensorFlow profiler trace of training steps A..B, for both loops.

`--profile_steps=A,B` (global train steps, 1-based, inclusive, after the warm-up)
starts the profiler at step A and stops it after step B. On a GPU the default (no
--profile_steps) is the two steps after the warm-up, so that every GPU run's diagnosis
reads its kernels; `--profile_steps=off` turns that off. Each step in the window is
wrapped in a `tf.profiler.experimental.Trace("train", step_num=..., _r=1)` marker, the
marker the profile plugin's step-time and input-pipeline views group by. The trace is
written to `<run>/plugins/profile/<timestamp>/*.xplane.pb`, where
`tensorboard --logdir logs` (profile plugin from the xprof package) finds it.
"""

from typing import Any, Callable

from absl import logging
import keras
import tensorflow as tf

from mpt.errors import UserError

GPU_DEFAULT_STEPS = 2  # A GPU run's default window (cheap: a few steps' kernels).


def window(profile: Any, warmup_steps: int, total_steps: int,
           gpu: bool = False) -> tuple[int, int] | None:
  """A run Plan's `profile` (--profile_steps parsed: (A, B); None: off or not asked;
  "": asked for nothing, which on a GPU (`gpu`) is the GPU_DEFAULT_STEPS after the
  warm-up where the run has them) checked against the run's warm-up and length: the
  window to trace, or None."""
  if profile == "":
    first = warmup_steps + 1
    last = first + GPU_DEFAULT_STEPS - 1
    return (first, last) if gpu and last <= total_steps else None
  if profile is None:
    return None
  first, last = profile
  if first <= warmup_steps:
    raise UserError(f"--profile_steps={first},{last}: the window must start after the "
                    f"{warmup_steps} warm-up steps (--warmup_steps)")
  if last > total_steps:
    raise UserError(f"--profile_steps={first},{last}: the run has only {total_steps} "
                    "steps")
  return first, last


class ProfileWindow(keras.callbacks.Callback):
  """Traces global steps first..last with the TensorFlow profiler. `step()` is the
  global step being run (1-based, the run's one step counter); `marker(step)` is a
  context manager marking the step in the trace."""

  def __init__(self, logdir: str, first: int, last: int, step: Callable[[], int],
               marker: Callable[[int], Any]):
    super().__init__()
    self.logdir, self.first, self.last = logdir, first, last
    self.current, self.marker = step, marker
    self._active, self._marker = False, None

  @property
  def step(self) -> int:
    return self.current()

  def on_train_batch_begin(self, batch, logs=None):
    if self.step == self.first:
      try:
        tf.profiler.experimental.start(self.logdir)
        self._active = True
      except Exception as e:  # A profiler fault must not stop training.
        logging.error("could not start the profiler: %s", e)
    if self._active:
      self._marker = self.marker(self.step)
      self._marker.__enter__()

  def on_train_batch_end(self, batch, logs=None):
    self.close(stop=self.step == self.last)

  def on_train_end(self, logs=None):
    self.close()

  def close(self, stop: bool = True) -> None:
    """Ends the step's marker; `stop`: stops the profiler and writes the trace, if it
    is running."""
    if self._marker is not None:
      self._marker.__exit__(None, None, None)
      self._marker = None
    if stop and self._active:
      self._active = False
      try:
        tf.profiler.experimental.stop()
      except Exception as e:
        logging.error("could not stop the profiler: %s", e)
