"""mpt around a user's own training loop: `mpt.track(...)`.

  import mpt
  run = mpt.track("logs/my_loop", model, batch_size=32, optimizer=opt)
  step = run.step(train_step)            # train_step: the user's (tf.function) step
  with run:                              # opens the run folder; at the end: summary,
    for epoch in range(3):               # diagnosis
      for images, labels in run.batches(train_ds):   # times each batch's fetch
        logs = step(images, labels)      # times the step, logs every N steps
      run.end_epoch({"loss": ..., "val_accuracy": ...})

The loop gets what a `python -m mpt.main --loop=custom` run has: mpt's step timer (the
step's result is read back before the clock stops, so the time covers the device's
work), the same TensorBoard tags, the loss scale and skipped steps of a Keras 3
`LossScaleOptimizer` (`optimizer`: one, or several as a tuple: a GAN's two), the run
folder (summary.json, dtypes.json, runs.csv) and the diagnosis at the end. `model` may
be several models trained together (a tuple: a GAN's generator and discriminator),
each inspected. The step may return anything: a dict, a tuple, a nest of tensors and
Python numbers; every leaf is read back (so the time covers the device's work) and the
scalars are logged by their path (`d_loss`, `output_0`, `losses/kl`). The same
callbacks as `mpt.callbacks` drive it (mpt/train/script/library.py), called the way Keras'
`fit` calls them, best effort: mpt never ends the loop it measures. A loop that
raises is recorded up to its last step, as the command line records a run
(mpt/errors.py `ended`: Ctrl-C `interrupted`, a bug in the loop `failed` with its
error), and the error goes on; a
loop that never called the step is said in one line, with nothing written.
"""

import functools
import sys
import time

import keras
import numpy as np

from mpt import errors
from mpt.train.common import besteffort
from mpt.train.script import library


def _materialised(out) -> dict[str, float]:
  """The step's result read back (waits for the device's work), its scalars as floats
  by path: a single value is `loss`, a tuple's items `output_0`, `output_1`, ..., a
  dict's by key, nested ones joined by "/"; non-scalars are read back, not logged."""
  if out is None:
    return {}
  leaves = [((), out)] if not isinstance(out, (dict, list, tuple)) else \
      keras.tree.flatten_with_path(out)
  found = {}
  for path, value in leaves:
    name = "/".join(f"output_{p}" if isinstance(p, int) and i == 0 else str(p)
                    for i, p in enumerate(path)) or "loss"
    try:
      array = np.asarray(value)
      if array.size == 1 and array.dtype.kind in "fiub":
        found[name] = float(array.reshape(()))
    except (TypeError, ValueError):  # Not a number: nothing to log.
      continue
  return found


class Tracker:
  """The run of a user's own loop; see the module docstring."""

  def __init__(self, run_dir: str, model: keras.Model, *, batch_size: int,
               optimizer: keras.optimizers.Optimizer | None = None,
               input_shape: tuple | None = None, after_run=None, **options):
    models = tuple(model) if isinstance(model, (list, tuple)) else (model,)
    self.model = models[0]
    opts = library.Options(batch_size, "custom", input_shape, optimizer, models,
                           cost=options.pop("cost", "auto"))
    cbs, self.folder = library.make(run_dir, opts, after_run=after_run, **options)
    self.counter, self.timer = cbs[0], self.folder.timer
    self.callbacks = keras.callbacks.CallbackList(cbs, model=self.model)
    self.epoch, self.open, self.last_logs = 0, False, {}
    self.folder.not_measured["data_wait"] = (
        "the loop fetched its batches itself (iterate run.batches(dataset) to time them)")

  def __enter__(self) -> "Tracker":
    self.callbacks.on_train_begin()
    self.open = True
    return self

  def step(self, fn):
    """`fn` (the user's train step) wrapped: each call is one timed, logged step."""
    @functools.wraps(fn)
    def tracked(*args, **kwargs):
      if not self.open:
        raise errors.UserError("mpt.track: a tracked step was called outside `with run:`; "
                               "enter the run first (it opens the run folder)")
      batch = self.counter.done
      if args:  # The inspection's real batch, where it fits the model.
        self.folder.keep(args[0])
      if self.folder.flops.step is None:  # The step whose graph is counted.
        self.folder.flops.use(fn, *args, **kwargs)
      self.callbacks.on_train_batch_begin(batch)
      out = fn(*args, **kwargs)
      self.last_logs = self.folder.parts.attempt("timer", _materialised, out,
                                                 default={})
      self.callbacks.on_train_batch_end(batch, self.last_logs)
      return out
    return tracked

  def batches(self, iterable):
    """`iterable`'s elements, each fetch timed as the next step's data wait."""
    self.folder.not_measured.pop("data_wait", None)
    self.callbacks.on_epoch_begin(self.epoch)  # Its first fetch begins an epoch.
    iterator = iter(iterable)
    while True:
      t = time.perf_counter()
      try:
        batch = next(iterator)
      except StopIteration:
        return
      self.folder.parts.attempt("data_wait", self._waited, time.perf_counter() - t)
      yield batch

  def _waited(self, seconds: float) -> None:
    besteffort.inject("data_wait")
    self.timer.pending_wait = seconds

  def end_epoch(self, logs: dict | None = None) -> None:
    """An epoch ends: its metrics (`loss`, `accuracy`, `val_loss`, ...; floats or
    scalars) go to the train/ and eval/ tags and summary.json."""
    logs = {**self.last_logs,
            **self.folder.parts.attempt("timer", _materialised, logs, default={})}
    self.callbacks.on_epoch_end(self.epoch, logs)
    self.epoch += 1

  def __exit__(self, kind, error, tb) -> None:
    self.open = False
    if self.counter.done == 0:
      self.folder.close_unused()
      if kind is None:  # Said, not raised: the program goes on after its loop.
        print("mpt: mpt.track: the loop never called the tracked step (wrap it: "
              "step = run.step(train_step), then call step(...)); nothing was "
              "measured, no summary.json written", file=sys.stderr, flush=True)
      return
    self.folder.status, self.folder.message = errors.ended(error)
    if self.epoch == 0:  # No end_epoch: the run's metrics are the last step's.
      self.folder.timer.epoch_logs = dict(self.last_logs)
      self.folder.not_measured["epochs"] = (
          f"the loop never called run.end_epoch(): {self.counter.done} steps, no "
          "epoch marked; the metrics are those its last step returned")
    self.callbacks.on_train_end()
