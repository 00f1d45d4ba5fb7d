"""A script's first step inspected: the dtype report of the model it trained (on the
batch it fed where that fits the model), the parameters its optimizers step and the
parts it only reads, and the step's FLOPs counted from its graph, into dtypes.json
and its TensorBoard table. One Keras callback over the run's state (library.py's
RunFolder); best effort like every part of a script's run.
"""

import sys

import keras
import numpy as np

from mpt import files
from mpt.measure import dtypes as dtypes_lib
from mpt.measure import observe
from mpt.train.common import countstep
from mpt.train.common import keras_fit
from mpt.train.common import stepflops
from mpt.train.script import watch


class Inspect(keras.callbacks.Callback):
  """At the first step's start, the step's FLOPs watched (fit's trace); at its end,
  the inspection and the count."""

  def __init__(self, run):
    super().__init__()
    self.run, self.done = run, False
    # The step's FLOPs, counted after step 1, taken into dtypes.json.
    run.flops = countstep.CountStep(run.writer.sources, counted=lambda found: (
        stepflops.into_files(run.before.report, found, run.opts.batch_size, run.run_dir,
                             run.writer)))

  def on_train_batch_begin(self, batch, logs=None):
    if not self.done and self.run.opts.loop == "fit":  # Before fit traces its step.
      self.run.flops.set_model(self.model)
      self.run.flops.on_train_batch_begin(0)

  def on_train_batch_end(self, batch, logs=None):
    if not self.done:  # After the first step: the model is built, a batch seen.
      self.done = True
      self.run.parts.attempt("inspect", self._inspect)
      self.run.parts.attempt("flops", self._count_flops)

  def _inspect(self) -> None:
    run = self.run
    fed = run.batch  # fit's batch is (x, y, weights); a loop's is its own.
    if fed is not None:
      if run.opts.loop == "fit":
        fed = keras.utils.unpack_x_y_sample_weight(fed)[0]
      self._fed(fed)
    report = run.before.report = self._report(fed if len(run.models) == 1 else None)
    run.parts.attempt("trained", self._trained, report)
    files.write_json(run.run_dir / "dtypes.json", report)
    print(dtypes_lib.one_line(report), flush=True)
    run.writer.text("inspect/dtypes", dtypes_lib.format_table(report, True))

  def _trained(self, report: dict) -> None:
    """Which parameters the step trains (those its optimizers step, known once they
    were built by step 1): `trained_params`, and the parts it only reads (an EMA copy,
    a frozen teacher) as `read_only_parts`."""
    models = self.run.models
    trained = {id(v) for o in watch.find(models, self.run.opts.optimizer)
               for v in keras_fit.trained_variables(o)}
    if not trained:
      self.run.not_measured["trained"] = ("no built optimizer found: which weights "
                                          "train is unknown")
      return
    if len(models) == 1 and not observe.has_call(models[0]):
      found = observe.parts(models[0])
      named = zip(observe.part_names(models[0], found), found)
    else:
      named = zip(observe.part_names(None, models), models)
    weights = {id(v): v for m in models for v in m.weights}
    report["trained_params"] = sum(
        int(np.prod(v.shape)) for i, v in weights.items() if i in trained)
    if "parts" in report:
      report["read_only_parts"] = [name for name, part in named
                                   if not any(id(v) in trained for v in part.weights)]

  def _count_flops(self) -> None:
    """The step's FLOPs from its graph: a tracked loop's own step (Tracker.step gave
    it), else the train_step fit runs, traced for the first batch fit fed."""
    run, flops = self.run, self.run.flops
    flops.set_model(self.model)
    if flops.step is None:
      flops.default_args = (run.batch,) if run.batch is not None else None
    flops.on_train_batch_end(0)
    if flops.not_counted:
      run.not_measured["flops"] = flops.not_counted

  def _fed(self, x) -> None:
    """What the program fed (its inputs' shapes), and its batch checked against the
    one given to mpt: the figures per example follow the batch fed."""
    run = self.run
    run.program.inputs = observe.describe_inputs(x)
    leaves = [t for t in keras.tree.flatten(x) if hasattr(t, "shape") and len(t.shape)]
    real = int(leaves[0].shape[0]) if leaves and leaves[0].shape[0] else None
    if real and real != run.opts.batch_size:
      print(f"mpt: {run.opts.api}: batch_size={run.opts.batch_size} given, but the "
            f"first batch fed has {real} examples: the figures per example use {real}",
            file=sys.stderr, flush=True)
      run.program.batch_size_given = run.opts.batch_size
      run.opts.batch_size = run.writer.batch_size = run.program.batch_size = real

  def _report(self, x):
    """The dtype report: on the real batch where it fits the model, else on the
    inputs the model declares; of each model, for several."""
    run, shape = self.run, self.run.opts.input_shape
    if len(run.models) > 1:
      return dtypes_lib.inspect_parts(run.name, run.models)
    if x is not None and not shape:
      try:
        return dtypes_lib.inspect_model(run.models[0], x=x)
      except Exception:  # pylint: disable=broad-except
        pass  # The batch is not the model's input (a GAN's images): its declared one.
    return dtypes_lib.inspect_model(run.models[0], input_shape=shape)
