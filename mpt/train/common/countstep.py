"""When a run's step FLOPs are counted (stepflops.py counts them): once, after the
first step ran, by a Keras callback: from the graph fit traced for that step (each
layer's scope read as it traced), from a loop's own tf.function, or from a trace of
its own where neither is there. Best effort: a failure is a line and the reason,
never an exception in the training."""

import contextlib
from typing import Any

import keras
import tensorflow as tf

from mpt.train.common import keras_fit
from mpt.train.common import stepflops


def batch_specs(element_spec, batch: int):
  """TensorSpecs of one batch of `batch` examples, from a dataset's element_spec (the
  batch dimension fixed: a graph traced with it has every shape known)."""
  return tf.nest.map_structure(
      lambda s: tf.TensorSpec([batch, *s.shape[1:]], s.dtype), element_spec)


class CountStep(keras.callbacks.Callback):
  """Counts the training step's FLOPs once, after the first step ran (the step is
  traced and every variable built by then): `found` (stepflops.StepFlops), or
  `not_counted` saying why not.

  `step` and `args` say which step: `use(step, *args)` (a loop's own tf.function and
  its arguments' specs), or by default the step of the model fit trains: the graph
  Keras traced for its first batch, each layer's scope read as it traced
  (`on_train_batch_begin` of the first batch: counting costs no second trace), or,
  where fit traced no step then (a second fit; run_eagerly), Keras' `train_step`
  traced here for `default_args` (one batch's specs). `counted(found)`, where given,
  is told the count (the run's dtypes report takes it in)."""

  def __init__(self, sources=None, default_args: tuple | None = None, counted=None):
    super().__init__()
    self.sources, self.default_args, self.counted = sources, default_args, counted
    self.step, self.args, self.kwargs = None, None, {}
    self.no_graph: str | None = None  # Why the step has no graph to count.
    self.found: stepflops.StepFlops | None = None
    self.not_counted: str | None = None
    self._done = False
    # While fit's first step traces: (Keras' step, its trace count before, scopes).
    self._watched: tuple[Any, int, dict[str, str]] | None = None
    self._unwatch = contextlib.ExitStack()

  def use(self, step, *args, **kwargs) -> None:
    if not hasattr(step, "get_concrete_function"):
      self.no_graph = ("the step is a Python function run eagerly, not a tf.function: "
                       "there is no graph to count its FLOPs from")
    self.step, self.args, self.kwargs = step, args, kwargs

  @property
  def per_step(self) -> int | None:
    """The step's FLOPs; None where not counted or where some are unknown."""
    return self.found.total if self.found and not self.found.uncounted else None

  def _keras_step(self):
    """Keras' train_step of the model fit trains, and the arguments to trace it with;
    under a strategy of several replicas, run on each replica as fit runs it, each
    with its share of the batch (the graph then holds every replica's ops: the
    global batch's FLOPs)."""
    # Traced as Keras traces it: without AutoGraph (its one_step_on_data is marked
    # do_not_convert), which also makes this second trace cheaper.
    trace = lambda fn: tf.function(fn, autograph=False)
    strategy = getattr(self.model, "distribute_strategy", None) or \
        tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    if replicas == 1 or self.default_args is None:
      return trace(self.model.train_step), self.default_args
    share = lambda t: tf.TensorSpec([t.shape[0] // replicas, *t.shape[1:]], t.dtype)
    args = tf.nest.map_structure(share, self.default_args)
    return trace(lambda data: strategy.run(self.model.train_step, args=(data,))), args

  def on_train_batch_begin(self, batch, logs=None):
    """Before fit's first step: each layer's scope read as Keras traces its step."""
    if self._done or self._watched or self.step is not None or self.model is None:
      return
    if self.model.distribute_strategy.num_replicas_in_sync > 1:
      return  # Fit's step takes the replicas' batches: traced for a share instead.
    try:
      keras_step = keras_fit.one_step_function(self.model)
      if keras_step is not None:
        scopes = self._unwatch.enter_context(stepflops.layer_scopes([self.model]))
        self._watched = keras_step, keras_step.experimental_get_tracing_count(), scopes
    except Exception as e:  # Best effort: counted from a trace of its own instead.
      self._unwatch.close()
      print(f"mpt: FLOPs: fit's own trace not watched ({type(e).__name__}: {e})",
            flush=True)

  def on_train_end(self, logs=None):
    self._unwatch.close()  # A run that ended before its first step's end.

  def _traced_by_fit(self, args: tuple) -> stepflops.StepFlops | None:
    """The FLOPs of the graph fit traced at its first step, as its scopes were read;
    None where fit traced none while watched (its step was traced before)."""
    keras_step, before, scopes = self._watched
    return None if keras_step.experimental_get_tracing_count() == before else \
        stepflops.count(keras_step.get_concrete_function(*args).graph, scopes)

  def on_train_batch_end(self, batch, logs=None):
    if self._done:
      return
    self._done = True
    self._unwatch.close()
    if self.no_graph:
      self.not_counted = self.no_graph
      return
    try:
      step, args = self.step, self.args
      if step is None:
        step, args = self._keras_step()
      if args is None:
        self.not_counted = ("no batch of the step was seen to trace it with (fit "
                            "fetches its own batches under steps_per_execution > 1)")
        return
      if self.step is None:
        self.found = self._watched and self._traced_by_fit(args)
        if not self.found:  # Traced here: each layer's scope read as it traces.
          self.found = stepflops.of_trace(step, args, [self.model] if self.model else [])
      else:
        self.found = stepflops.of_step(step, *args, **self.kwargs)
      if self.counted:
        self.counted(self.found)
    except Exception as e:  # Best effort: the training goes on.
      self.not_counted = f"the step's graph could not be counted: {type(e).__name__}: {e}"
      print(f"mpt: FLOPs not counted: {self.not_counted}", flush=True)
      return
    if self.found.uncounted:
      kinds = ", ".join(f"{k} x{n}" for k, n in sorted(self.found.uncounted.items()))
      self.not_counted = (f"the step runs ops whose FLOPs the graph does not fix "
                          f"({kinds}); {self.found.total:,} FLOPs counted, no total claimed")
    if self.sources is not None:
      self.sources.flops_per_step = self.per_step
