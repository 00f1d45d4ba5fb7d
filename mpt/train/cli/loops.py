"""The two training paths. They differ only in who drives the step.

Both take the same model, optimizer, `Data` and Keras callbacks. `fit` hands them to
Keras; `custom` drives mpt's own tf.function steps (mpt/train/common/steps.py) through a Keras
`CallbackList` in the same order fit does (train begin, epoch begin, batch begin/end,
validation with its test-batch calls, epoch end), so the same callbacks time, log and
draw the progress bar for both, and a batch's logs are materialised
(`pythonify_logs`) before any callback sees them: the step's result exists when its
time is taken.

Both run under the strategy whose scope mpt/train/cli/run.py entered
(mpt/train/cli/distribute.py): `fit` distributes the dataset itself; `custom` distributes
it with `strategy.experimental_distribute_dataset` and runs its steps through
`strategy.run`.

`fetch(iterator)` takes the next batch (a timed `next`, see
mpt/measure/instrument.py). The custom loop always calls it; under `fit` mpt installs
a train function that calls it and hands the batch to Keras' own compiled step
(mpt/train/common/keras_fit.py), so the data wait is timed the same way in both loops.
Without `fetch` (`--noinstrument`) fit runs untouched.
"""

from typing import Any, Callable

import keras
import tensorflow as tf

from mpt import console
from mpt.config import Config
from mpt.train.cli import checkpoint
from mpt.train.common import keras_fit
from mpt.train.common import steps as steps_lib
from mpt.train.common import countstep
from mpt.train.cli.data import Data

Logs = dict[str, float]
Fetch = Callable[[Any], Any]


def _segments(start_step: int, steps_per_epoch: int, epochs: int):
  """(epoch, steps to run in it, global step it starts at) from `start_step` on: a
  run resumed mid-epoch first finishes that epoch, then runs whole ones."""
  step = start_step
  for epoch in range(start_step // steps_per_epoch, epochs):
    n = steps_per_epoch - (step - epoch * steps_per_epoch)
    yield epoch, n, step
    step += n


def run_fit(model: keras.Model, optimizer: keras.optimizers.Optimizer, data: Data,
            cfg: Config, callbacks: list[keras.callbacks.Callback],
            fetch: Fetch | None = None, loss: keras.losses.Loss | None = None,
            start_step: int = 0) -> None:
  # jit_compile is explicit: Keras' "auto" turns XLA on for fit on a GPU only, which
  # would make fit and custom differ in more than who drives the step.
  # auto_scale_loss=False: mpt built the optimizer (and its loss scaling) already.
  model.compile(optimizer=optimizer, loss=loss or steps_lib.make_loss(),
                metrics=steps_lib.make_metrics(), jit_compile=cfg.jit_compile,
                auto_scale_loss=False)
  # Keras has no public switch for these three (each explained there).
  if tf.distribute.has_strategy():
    keras_fit.build_from_plain_batch(model, next(iter(data.val)))
  if keras_fit.in_multi_worker_mode(tf.distribute.get_strategy()):
    keras_fit.metrics_as_vectors(model)
  if fetch is not None:
    keras_fit.fetch_through(model, fetch)
  spe = data.steps_per_epoch
  epoch, done = divmod(start_step, spe)
  if done and not tf.distribute.has_strategy():
    # Keras builds fit's metrics at the first step's trace, but a run resumed
    # mid-epoch puts its metric state back before that step (checkpoint.py's
    # RunningMetrics): build them now, on a validation batch, and empty them.
    images, labels = next(iter(data.val))
    model.compute_metrics(images, labels, model(images, training=False))
    model.reset_metrics()

  def fit(step: int, first: int, last: int, n: int) -> None:
    """Epochs `first` to `last` (exclusive) of `n` steps, the stream from `step` on."""
    model.fit(data.train_from(step), initial_epoch=first, epochs=last,
              steps_per_epoch=n, validation_data=data.val, callbacks=callbacks,
              verbose=console.keras_verbose(cfg.verbose),
              shuffle=False)  # The pipeline shuffles; fit cannot.

  if done:  # Resumed mid-epoch: finish that epoch on its own first.
    fit(start_step, epoch, epoch + 1, spe - done)
    epoch += 1
  if epoch < cfg.epochs:
    fit(epoch * spe, epoch, cfg.epochs, spe)


def evaluate(steps: steps_lib.Steps, val, callbacks: keras.callbacks.CallbackList) -> Logs:
  """The validation pass, with the test-batch callbacks fit's validation calls."""
  steps.reset()
  logs = {}
  callbacks.on_test_begin()
  for batch, (images, labels) in enumerate(val):
    callbacks.on_test_batch_begin(batch)
    logs = {k: float(v) for k, v in steps.eval_step(images, labels).items()}
    callbacks.on_test_batch_end(batch, logs)
  callbacks.on_test_end(logs)
  return logs


def run_custom(model: keras.Model, optimizer: keras.optimizers.Optimizer, data: Data,
               cfg: Config, callbacks: list[keras.callbacks.Callback],
               fetch: Fetch | None = None, loss: keras.losses.Loss | None = None,
               start_step: int = 0) -> None:
  fetch = fetch or next
  # The strategy whose scope the model was built in (mpt/train/cli/run.py enters it); each
  # global batch is split across its replicas (one device: the batch as it is).
  strategy = tf.distribute.get_strategy()
  steps = steps_lib.Steps(model, optimizer, loss=loss, jit_compile=cfg.jit_compile,
                          strategy=strategy, global_batch=cfg.batch_size)
  val = strategy.experimental_distribute_dataset(data.val)
  callbacks = keras.callbacks.CallbackList(
      callbacks, add_history=True, add_progbar=cfg.verbose != 0,
      verbose=console.keras_verbose(cfg.verbose),
      epochs=cfg.epochs, steps=data.steps_per_epoch, model=model)
  for callback in callbacks.callbacks:  # A resumed epoch's metric state goes here.
    if isinstance(callback, checkpoint.RunningMetrics):
      callback.use(lambda: steps.metrics)
    if isinstance(callback, countstep.CountStep):  # This loop's own step is counted.
      # Each replica's share of the batch (the step splits nothing it is given).
      callback.use(steps.train_step, *countstep.batch_specs(
          data.val.element_spec, cfg.batch_size // strategy.num_replicas_in_sync))
  iterator = iter(strategy.experimental_distribute_dataset(data.train_from(start_step)))
  epoch_logs: Logs = {}
  callbacks.on_train_begin()
  for epoch, n, _ in _segments(start_step, data.steps_per_epoch, cfg.epochs):
    steps.reset()
    callbacks.on_epoch_begin(epoch)
    logs = {}
    for step in range(n):
      callbacks.on_train_batch_begin(step)
      images, labels = fetch(iterator)
      logs = steps.train_step(images, labels)
      callbacks.on_train_batch_end(step, logs)
    epoch_logs = {k: float(v) for k, v in logs.items()}
    epoch_logs.update({f"val_{k}": v for k, v in evaluate(steps, val, callbacks).items()})
    callbacks.on_epoch_end(epoch, epoch_logs)
  callbacks.on_train_end(epoch_logs)


LOOPS = {"fit": run_fit, "custom": run_custom}
