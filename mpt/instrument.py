"""Measurement callbacks shared by both loops: honest step timing and TensorBoard scalars.

Both are plain Keras callbacks: `fit` calls them itself, and the custom loop calls them
through a `CallbackList` in the same order (mpt/loops.py). Keras materialises a batch's
logs before any `on_train_batch_end` runs, so a step's time covers fetching the batch,
running the step and reading its result back, the same in both loops, and nothing of
the progress bar or of logging.

Tag names are identical for both loops, grouped by slash: `train/loss`,
`train/accuracy`, `eval/loss`, `eval/accuracy`, `perf/step_time_ms`,
`perf/images_per_sec`, written once per epoch at the global step.
"""

import statistics
import time

import keras
import tensorflow as tf


class StepTimer(keras.callbacks.Callback):
  """Wall time of every train step, and the latest epoch's logs."""

  def __init__(self, warmup_steps: int):
    super().__init__()
    self.warmup_steps = warmup_steps
    self.durations_ms: list[float] = []
    self.epoch_logs: dict[str, float] = {}
    self.epochs_done = 0
    self._t0 = 0.0

  @property
  def steps(self) -> int:
    return len(self.durations_ms)

  def on_train_batch_begin(self, batch, logs=None):
    self._t0 = time.perf_counter()

  def on_train_batch_end(self, batch, logs=None):
    self.durations_ms.append((time.perf_counter() - self._t0) * 1e3)

  def on_epoch_end(self, epoch, logs=None):
    self.epoch_logs = dict(logs or {})
    self.epochs_done = epoch + 1

  def steady(self, start: int = 0) -> list[float]:
    """Step times from `start` on, without the warm-up steps at the run's start.

    A run shorter than its warm-up still reports the steps after the first (the
    trace), so that a number exists; summary.json says how many steps it rests on.
    """
    times = self.durations_ms[max(start, self.warmup_steps):]
    if not times and start == 0:
      times = self.durations_ms[1:] or self.durations_ms
    return times

  def median_ms(self, start: int = 0) -> float | None:
    times = self.steady(start)
    return statistics.median(times) if times else None


class ScalarWriter(keras.callbacks.Callback):
  """Writes per-epoch metrics and step times as TensorBoard scalars."""

  def __init__(self, run_dir: str, timer: StepTimer, batch_size: int,
               texts: dict[str, str] | None = None):
    super().__init__()
    self.writer = tf.summary.create_file_writer(run_dir)
    self.timer, self.batch_size = timer, batch_size
    self.texts = texts or {}
    self._epoch_start = 0

  def on_train_begin(self, logs=None):
    with self.writer.as_default(step=0):
      for tag, text in self.texts.items():
        tf.summary.text(tag, text)

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch_start = self.timer.steps

  def on_epoch_end(self, epoch, logs=None):
    with self.writer.as_default(step=self.timer.steps):
      for key, value in (logs or {}).items():
        tag = f"eval/{key[4:]}" if key.startswith("val_") else f"train/{key}"
        tf.summary.scalar(tag, value)
      ms = self.timer.median_ms(self._epoch_start)
      if ms:
        tf.summary.scalar("perf/step_time_ms", ms)
        tf.summary.scalar("perf/images_per_sec", self.batch_size / ms * 1e3)
    self.writer.flush()

  def close(self) -> None:
    self.writer.flush()
    self.writer.close()
