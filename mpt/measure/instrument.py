"""Measurement callbacks shared by both loops: step timing and TensorBoard scalars.

Both are plain Keras callbacks: `fit` calls them itself, and the custom loop calls them
through a `CallbackList` in the same order (mpt/train/cli/loops.py). Keras materialises a batch's
logs before any `on_train_batch_end` runs, so a step's time covers fetching the batch,
running the step and reading its result back, the same in both loops, and nothing of
the progress bar or of logging. The batch fetch is timed on its own too (`fetch`):
the custom loop calls it, and under `fit` mpt's train function does (mpt/train/cli/loops.py).

Tags are identical for both loops, grouped by slash:
  per epoch:      train/loss, train/accuracy, eval/loss, eval/accuracy
  every N steps:  perf/step_time_ms, perf/data_wait_ms, perf/images_per_sec,
                  perf/tflops, precision/loss_scale, precision/skipped_steps, util/...
  at the end:     final/ms_per_step, final/images_per_sec, final/val_accuracy (the
                  HParams dashboard's metrics)
  at the start:   the run's hparams and the dashboards' declarations
                  (mpt/measure/dashboards.py)
"""

import dataclasses
import statistics
import time
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from mpt.measure import dashboards
from mpt.measure.sampler import Sampler
from mpt.records import summary as summary_lib


class StepTimer(keras.callbacks.Callback):
  """Wall time of every train step and of its batch fetch; the latest epoch's logs. A
  resumed run continues from `state()` of the run it resumes: its steps are appended,
  and its own first `warmup_steps` (tracing again) are left out as well."""

  def __init__(self, warmup_steps: int, state: dict[str, Any] | None = None):
    super().__init__()
    state = state or {}
    self.warmup_steps = warmup_steps
    self.durations_ms: list[float] = state.get("durations_ms", [])
    self.waits_ms: list[float] = state.get("waits_ms", [])
    self.timed: list[bool] = state.get("timed", [])  # False: a warm-up step.
    self.epoch_logs: dict[str, float] = state.get("epoch_logs", {})
    self.epochs_done: int = state.get("epochs_done", 0)
    # Indices of the steps that began an epoch (their fetch may refill a shuffle
    # buffer or restart the pipeline: a one-off wait, reported apart).
    self.epoch_starts: list[int] = state.get("epoch_starts", [])
    self._first_here = len(self.durations_ms)
    self._t0 = self._wait = self.pending_wait = 0.0
    self._begin = None

  def state(self) -> dict[str, Any]:
    return {"durations_ms": self.durations_ms, "waits_ms": self.waits_ms,
            "timed": self.timed, "epoch_logs": self.epoch_logs,
            "epochs_done": self.epochs_done, "epoch_starts": self.epoch_starts}

  @property
  def steps(self) -> int:
    return len(self.durations_ms)

  def fetch(self, iterator):
    """next(iterator), timed as this step's data wait."""
    t = time.perf_counter()
    batch = next(iterator)
    self._wait = time.perf_counter() - t
    return batch

  def on_epoch_begin(self, epoch, logs=None):
    self.epoch_starts.append(self.steps)

  def on_train_batch_begin(self, batch, logs=None):
    # A loop that fetched the batch before the step began (mpt.track's batches())
    # left its wait here.
    self._wait, self.pending_wait = self.pending_wait, 0.0
    self._t0 = time.perf_counter()
    self._begin = batch

  def on_train_batch_end(self, batch, logs=None):
    # Keras' fit with steps_per_execution=N calls the hooks once per N steps (begin
    # and end named by their first and last step): each gets an equal share.
    n = steps_in_call(self._begin, batch)
    ms = (time.perf_counter() - self._t0) * 1e3 / n
    for i in range(n):
      self.durations_ms.append(ms)
      self.waits_ms.append(self._wait * 1e3 if i == 0 else 0.0)
      self.timed.append(self.steps - self._first_here > self.warmup_steps)

  @property
  def here(self) -> list[float]:
    """The ms of each step since this process (or a new fit) began timing."""
    return self.durations_ms[self._first_here:]

  def rewarm(self) -> None:
    """The next `warmup_steps` steps are warm-up again (a new `fit` may trace again)."""
    self._first_here = len(self.durations_ms)

  def on_epoch_end(self, epoch, logs=None):
    self.epoch_logs = dict(logs or {})
    # Counted, not read off `epoch`: a second `fit` numbers its epochs from 0 again.
    self.epochs_done += 1

  def _steady(self) -> list[int]:
    """Indices of the timed steps; a run shorter than its warm-up keeps all but the
    first step of this process (the trace), so that a number exists."""
    steady = [i for i, t in enumerate(self.timed) if t]
    return steady or list(range(self._first_here + 1, self.steps)) or \
        list(range(self._first_here, self.steps))

  def steady(self) -> list[float]:
    return [self.durations_ms[i] for i in self._steady()]

  def stats(self) -> dict[str, Any]:
    """Step-time percentiles and the data wait over the steps after warm-up: its sum
    share (total wait over total step time), and its typical share (the median step's
    wait over its time) beside the waits a few fetches took at once (`wait_apart`)."""
    steady = self._steady()
    times = [self.durations_ms[i] for i in steady]
    waits = [self.waits_ms[i] for i in steady]
    if not times:
      return {"median": None, "p10": None, "p90": None, "data_wait_share": None}
    p10, p90 = np.percentile(times, [10, 90])
    return {"median": statistics.median(times), "p10": float(p10), "p90": float(p90),
            "data_wait_ms_median": statistics.median(waits),
            "data_wait_share": sum(waits) / sum(times),
            "data_wait_share_median": statistics.median(
                w / t for w, t in zip(waits, times) if t > 0) if any(times) else None,
            **self._wait_apart(steady)}

  def _wait_apart(self, steady: list[int]) -> dict[str, Any]:
    """The waits of epoch-start fetches and of one-off long fetches (over 5x the
    median wait and 1 ms) among the timed steps: count and total ms of each."""
    typical = statistics.median(self.waits_ms[i] for i in steady)
    starts = set(self.epoch_starts)
    at_start = [self.waits_ms[i] for i in steady if i in starts]
    one_off = [self.waits_ms[i] for i in steady if i not in starts
               and self.waits_ms[i] > max(5 * typical, 1.0)]
    return {"data_wait_epoch_starts": [len(at_start), round(sum(at_start), 3)],
            "data_wait_one_off": [len(one_off), round(sum(one_off), 3)]}


def steps_in_call(begin, end) -> int:
  """The train steps one pair of batch hooks covers: 1, or end - begin + 1 where Keras
  runs several steps per call (`steps_per_execution`)."""
  if isinstance(begin, int) and isinstance(end, int) and end >= begin:
    return end - begin + 1
  return 1


class StepCounter(keras.callbacks.Callback):
  """The run's global step: `current` is being run, `done` have completed."""

  def __init__(self, start_step: int):
    super().__init__()
    self.done = self.current = start_step
    self._begin = None

  def on_train_batch_begin(self, batch, logs=None):
    self.current, self._begin = self.done + 1, batch

  def on_train_batch_end(self, batch, logs=None):
    self.done += steps_in_call(self._begin, batch)


@dataclasses.dataclass
class Sources:
  """Where ScalarWriter's figures beside the step time come from, each optional:
  perf/tflops from the FLOPs of one step, precision/ from `precision_state()`,
  util/ from the sampler."""
  flops_per_step: int | None = None
  precision_state: Callable[[], dict[str, float]] | None = None
  sampler: Sampler | None = None


@dataclasses.dataclass
class Opening:
  """What ScalarWriter writes once at step 0: `texts` by tag, the dashboards' layout
  and, given `hparams`, the HParams experiment. `resumed`: the run's first attempt
  wrote them into the event files already; they are not written twice."""
  texts: dict[str, str] = dataclasses.field(default_factory=dict)
  hparams: dict[str, Any] | None = None
  resumed: bool = False


class ScalarWriter(keras.callbacks.Callback):
  """Writes metrics per epoch and, when `detailed`, perf/precision/util every N steps."""

  def __init__(self, run_dir: str, timer: StepTimer, batch_size: int, *,
               every: int = 10, detailed: bool = True, sources: Sources | None = None,
               opening: Opening | None = None):
    super().__init__()
    self.writer = tf.summary.create_file_writer(run_dir)
    self.timer, self.batch_size, self.every = timer, batch_size, every
    self.detailed = detailed
    self.sources = sources or Sources()
    self.opening = opening or Opening()

  def on_train_begin(self, logs=None):
    if not self.opening.resumed:
      self.write_opening(self.opening)
      self.opening = Opening(resumed=True)  # Once, however many fits follow.

  def write_opening(self, opening: Opening) -> None:
    with self.writer.as_default(step=0):
      for tag, text in opening.texts.items():
        tf.summary.text(tag, text)
      dashboards.write(opening.hparams)

  def on_train_batch_end(self, batch, logs=None):
    step = self.timer.steps
    if not self.detailed or step % self.every:
      return
    ms = statistics.median(self.timer.durations_ms[-self.every:])
    sources = self.sources
    with self.writer.as_default(step=step):
      tf.summary.scalar("perf/step_time_ms", ms)
      tf.summary.scalar("perf/data_wait_ms", statistics.fmean(self.timer.waits_ms[-self.every:]))
      tf.summary.scalar("perf/images_per_sec", self.batch_size / ms * 1e3)
      if sources.flops_per_step:
        tf.summary.scalar("perf/tflops",
                          summary_lib.achieved_gflops(sources.flops_per_step, ms) / 1e3)
      for name, value in (sources.precision_state() if sources.precision_state
                          else {}).items():
        tf.summary.scalar(f"precision/{name}", value)
      for name, value in (sources.sampler.drain() if sources.sampler else {}).items():
        tf.summary.scalar(f"util/{name}", value)

  def on_epoch_end(self, epoch, logs=None):
    with self.writer.as_default(step=self.timer.steps):
      for key, value in (logs or {}).items():
        tag = f"eval/{key[4:]}" if key.startswith("val_") else f"train/{key}"
        tf.summary.scalar(tag, value)
    self.writer.flush()

  def flush(self) -> None:
    self.writer.flush()

  def write_final(self, summary: dict[str, Any]) -> None:
    """The HParams dashboard's metrics: the run's headline figures, at its last step."""
    with self.writer.as_default(step=self.timer.steps):
      for key in dashboards.FINAL:
        if summary.get(key) is not None:
          tf.summary.scalar(f"final/{key}", summary[key])

  def text(self, tag: str, text: str) -> None:
    with self.writer.as_default(step=self.timer.steps):
      tf.summary.text(tag, text)

  def close(self) -> None:
    self.writer.close()  # Flushes first.
