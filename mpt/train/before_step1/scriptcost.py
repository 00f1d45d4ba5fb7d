"""A script's own step per policy (`mpt.callbacks`, `mpt.track`), timed at the end of
each `fit`'s warm-up (mpt/train/script/stepcost.py) by the command line's candidates'
rules (mpt/train/before_step1/cost.py `time_candidates`: the one timer, its budgets,
the kernel table's predictions, the record), where the training it plans pays for it.

The step is the one the program runs (`Step`): under `fit`, the model's `train_step`
(Keras' own, or the program's override, with its `compute_loss` and metrics: a frozen
teacher run inside the loss is part of the step) on the last batch fit fed; under
`mpt.track`, the loop's own tf.function on the arguments of its first call. Each
candidate traces it afresh (a new tf.function of the same Python function, with its
options) with the model's layers switched to the candidate's policy: a built Keras 3
model computes in whatever policy its layers hold when a step is traced
(mpt/measure/policies.py). Under `fit` the model's optimizer is, while its candidate
traces, a fresh copy of the program's (its class and config, no state), loss-scaled
under mixed_float16 as Keras' compile makes it. Each call fetches its batch from a
tf.data iterator of that batch, as a program's step does.

A traced step that does anything besides computing and updating variables (writes a
summary, prints, runs a Python function, writes a file, reads an iterator, talks to
other replicas: `EFFECTS`) would do it again on every call timed, inside the
program's run: it is not timed, said in one line. mpt times no stand-in for it.

The program is left as it was: every variable a traced step reads or writes (the
model's weights and statistics, every optimizer's slots and loss scale, the metrics,
seed generators, TF's global generator) and every variable of the model, its
optimizers and metrics is put back; each layer gets back the policy object it held,
the model its optimizer; the global policy, Python's, NumPy's and TF's op-seed random
state are what they were. Cached per what changes the step's cost (`key_for`): two
fits of one program whose steps differ (a frozen base, then unfrozen) get two entries.
"""

import contextlib
import dataclasses
import hashlib
import json
import marshal
import random
import time
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from mpt import config
from mpt import errors
from mpt.machine import isa
from mpt.measure import policies
from mpt.models import fused_bn
from mpt.records import cost as cost_lib
from mpt.records.cost import Cost
from mpt.train.before_step1 import cost as timing
from mpt.train.common import keras_fit

_SUMMARIES = ("WriteSummary", "WriteScalarSummary", "WriteHistogramSummary",
              "WriteImageSummary", "WriteAudioSummary", "WriteRawProtoSummary",
              "WriteGraphSummary", "ImportEvent", "FlushSummaryWriter",
              "CreateSummaryFileWriter", "CreateSummaryDbWriter", "CloseSummaryWriter")
_COLLECTIVES = ("CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3",
                "CollectiveGather", "CollectiveGatherV2", "CollectiveBcastSend",
                "CollectiveBcastRecv", "CollectiveBcastSendV2", "CollectiveBcastRecvV2",
                "CollectiveAllToAllV2", "CollectiveAllToAllV3", "NcclAllReduce")
# Op types a traced step may not run to be timed, by what each does outside the step.
EFFECTS = {
    "writes a summary": _SUMMARIES,
    "prints": ("PrintV2", "Print"),
    "runs a Python function": ("EagerPyFunc", "PyFunc", "PyFuncStateless"),
    "writes a file": ("WriteFile", "SaveV2", "Save", "SaveSlices", "MergeV2Checkpoints"),
    "reads an iterator": ("IteratorGetNext", "IteratorGetNextSync",
                          "IteratorGetNextAsOptional", "MultiDeviceIteratorGetNextFromShard"),
    "talks to other replicas": _COLLECTIVES,
}


@dataclasses.dataclass
class Step:
  """The step a program runs, as mpt times it."""
  fn: Callable  # Its Python function (Keras' train_step, the program's, the loop's).
  args: tuple
  kwargs: dict
  models: tuple  # What it trains: fit's model, or the loop's (a GAN's two).
  jit: bool  # Its XLA setting (fit: the model's; a loop: its tf.function's).
  what: str  # What it is, for the record and the line.
  options: dict = dataclasses.field(default_factory=dict)  # Its tf.function's.
  swap_optimizer: bool = False  # fit: model.optimizer is fresh per candidate.

  @property
  def batch(self) -> int:
    leaves = [t for t in keras.tree.flatten((self.args, self.kwargs))
              if hasattr(t, "shape") and len(t.shape)]
    return int(leaves[0].shape[0]) if leaves and leaves[0].shape[0] else 0


class NotTimeable(errors.UserError):
  """The program's step cannot be timed safely (its graph does more than compute)."""


def own_methods(model: keras.Model) -> dict[str, Callable]:
  """The methods the program's own model classes define (an override of train_step
  or of a loss method, a helper they call), down to the first class of Keras' own
  (whose code is Keras' version's): what makes its step its own."""
  found = {}
  for cls in type(model).__mro__:
    if cls.__module__.split(".")[0] == "keras" or not issubclass(cls, keras.Model):
      break
    for name, fn in vars(cls).items():
      if callable(fn) and hasattr(fn, "__code__") and name not in found:
        found[name] = fn
  return found


def of_fit(model: keras.Model, data) -> Step:
  """The step fit runs: the model's train_step on the batch it fed, traced as Keras
  traces it (without AutoGraph, its XLA setting)."""
  own = sorted(m for m in own_methods(model) if "step" in m or "loss" in m)
  what = f"fit's train_step of {type(model).__name__}" + (
      f", with its own {', '.join(own)}" if own else " (Keras' own)")
  return Step(model.train_step, (data,), {}, (model,),
              bool(getattr(model, "jit_compile", False)), what, {"autograph": False},
              swap_optimizer=getattr(model, "optimizer", None) is not None)


def of_loop(models: tuple, fn, args: tuple, kwargs: dict) -> Step:
  """The loop's own step, a tf.function (NotTimeable for a Python function: no graph
  to read)."""
  if not hasattr(fn, "python_function"):
    raise NotTimeable("the loop's step is a Python function run eagerly, not a "
                      "tf.function: mpt times only a step whose graph it can read")
  options = keras_fit.function_options(fn)
  return Step(fn.python_function, args, kwargs, tuple(models),
              bool(options.pop("jit_compile")),
              "the loop's own step function", options)


def _code(fn) -> str:
  """A digest of a function's code (its bytecode, constants and names)."""
  fn = getattr(fn, "__func__", fn)
  code = getattr(fn, "__code__", None)
  return hashlib.sha1(marshal.dumps(code)).hexdigest()[:12] if code else repr(fn)


def _signature(models: tuple) -> str:
  """The models' layers (class, weight shapes, which weights train) as a digest."""
  layers = [[m.name] + [(type(l).__name__, [(list(w.shape), bool(w.trainable))
                                           for w in l.weights])
                        for l in fused_bn.all_layers(m)] for m in models]
  return hashlib.sha1(json.dumps(layers).encode()).hexdigest()[:16]


def _optimizer_key(optimizer) -> str | None:
  """An optimizer's class and config (its rate's value aside: it moves no cost)."""
  if optimizer is None:
    return None
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  try:
    config = {k: v for k, v in inner.get_config().items()
              if k not in ("name", "learning_rate")}
  except (NotImplementedError, TypeError, AttributeError):
    config = {}
  return f"{type(optimizer).__name__}/{type(inner).__name__}:" + json.dumps(
      config, sort_keys=True, default=str)


def _inputs(step: Step) -> list:
  """The step's arguments: each tensor's path, shape and dtype."""
  leaves = keras.tree.flatten_with_path((step.args, step.kwargs))
  return [["/".join(map(str, path)), list(t.shape), t.dtype.name if hasattr(
      t.dtype, "name") else str(t.dtype)] for path, t in leaves if hasattr(t, "shape")]


def _compiled(model: keras.Model) -> str | None:
  """What compile() gave the step besides its optimizer (the loss, its weights, the
  metrics), as JSON without the objects' names (numbered afresh in each program)."""
  try:
    config = {k: v for k, v in (model.get_compile_config() or {}).items()
              if k in ("loss", "loss_weights", "metrics", "weighted_metrics")}
  except (AttributeError, TypeError, ValueError):
    return None
  unnamed = lambda v: ({k: unnamed(x) for k, x in v.items() if k != "name"}
                       if isinstance(v, dict) else [unnamed(x) for x in v]
                       if isinstance(v, list) else v)
  return json.dumps(unnamed(config), sort_keys=True, default=str)


def key_for(step: Step, optimizers: list) -> dict[str, Any]:
  """What changes the step's cost: the model (its layers, which weights train), the
  step's code and the methods its classes define (`own_methods`), the compiled loss
  and metrics, the optimizers, the inputs' structure, shapes and dtypes (the batch in
  them), XLA, and the machine (the CPU, its cores, TF, the oneDNN setting)."""
  methods = {f"{m.name}.{name}": _code(fn) for m in step.models
             for name, fn in sorted(own_methods(m).items())}
  compiled = [_compiled(m) for m in step.models]
  return {"model": "script:" + "+".join(m.name for m in step.models),
          "signature": _signature(step.models),
          "step": _code(step.fn), "methods": methods,
          "compiled": hashlib.sha1(str(compiled).encode()).hexdigest()[:12],
          "optimizers": [_optimizer_key(o) for o in optimizers],
          "inputs": _inputs(step), "jit_compile": step.jit,
          **cost_lib.machine_key(keras_fit.onednn_rewrite_on(), isa.detect())}


def fresh_optimizer(optimizer, policy: str) -> keras.optimizers.Optimizer:
  """The module docstring's fresh copy of `optimizer` (Adam where it cannot be copied)."""
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  try:
    fresh = type(inner).from_config(inner.get_config())
  except (TypeError, ValueError, AttributeError, NotImplementedError):
    fresh = keras.optimizers.Adam()
  return keras.optimizers.LossScaleOptimizer(fresh) if config.scales(policy) else fresh


def side_effects(graph) -> list[str]:
  """The EFFECTS of a traced step, read from its graph and every function it calls."""
  graph_def = graph.as_graph_def()
  types = {n.op for n in graph_def.node} | {
      n.op for f in graph_def.library.function for n in f.node_def}
  return [what for what, ops in EFFECTS.items() if types & set(ops)]


class _Kept:
  """The program's state (the module docstring's last paragraph), put back at the
  block's end: the variables given and every one a traced candidate captures (`keep`)."""

  def __init__(self, variables):
    self.kept: dict[int, tuple] = {}
    self.keep(variables)

  def keep(self, variables) -> None:
    for v in variables:
      if id(v) not in self.kept:
        self.kept[id(v)] = (v, tf.identity(v))

  def __enter__(self):
    self.policy = keras.mixed_precision.global_policy()
    self.random = (random.getstate(), np.random.get_state(), keras_fit.op_seeds())
    return self

  def __exit__(self, *exc):
    for v, value in self.kept.values():
      v.assign(value)
    keras.mixed_precision.set_global_policy(self.policy)
    random.setstate(self.random[0])
    np.random.set_state(self.random[1])
    keras_fit.op_seeds(self.random[2])


def _state(step: Step, optimizers: list) -> list:
  """Every variable of the models, their compiled metrics and the program's
  optimizers."""
  return [v for m in step.models for v in list(m.variables) + list(
      getattr(m, "metrics_variables", []))] + [v for o in optimizers for v in o.variables]


def stepper(step: Step, kept: _Kept, optimizer) -> timing.Make:
  """The program's candidates, traced as the module docstring says."""
  def make(key: timing.Key, infinite: set):
    policy = key[0]
    fn = tf.function(step.fn, jit_compile=step.jit, reduce_retracing=True,
                     **step.options)
    with contextlib.ExitStack() as switched:
      for model in step.models:
        switched.enter_context(policies.switched(model, policies.uniform(policy)))
      fresh = switched.enter_context(_swapped(step, optimizer, policy))
      concrete = fn.get_concrete_function(*step.args, **step.kwargs)
    effects = side_effects(concrete.graph)
    if effects:
      raise NotTimeable(f"the step {' and '.join(effects)}: timing it would do that "
                        "again in the program's run")
    kept.keep(concrete.variables)
    fetch = _fetcher(step)

    def call(alive=fresh):  # The fresh optimizer lives as long as its step
      args, kwargs = fetch()  # (the graph holds its variables weakly).
      return _loss(fn(*args, **kwargs))
    return timing.waited(call, key, infinite)
  return make


@contextlib.contextmanager
def _swapped(step: Step, optimizer, policy: str):
  """Under fit, the model's optimizer a fresh copy for the block (traced with it)."""
  if not step.swap_optimizer:
    yield None
    return
  fresh = fresh_optimizer(optimizer, policy)
  fresh.build(step.models[0].trainable_variables)
  step.models[0].optimizer = fresh
  try:
    yield fresh
  finally:
    step.models[0].optimizer = optimizer


def _fetcher(step: Step) -> Callable[[], tuple[tuple, dict]]:
  """The step's arguments fetched as a program's loop fetches a batch: the tensors
  from a tf.data iterator (the first batch, repeated; an in-memory pipeline's fetch
  is part of every step fit or a loop runs), the other arguments as they are."""
  leaves = keras.tree.flatten((step.args, step.kwargs))
  tensors = [i for i, v in enumerate(leaves) if isinstance(v, (tf.Tensor, np.ndarray))]
  if not tensors:
    return lambda: (step.args, step.kwargs)
  batches = iter(tf.data.Dataset.from_tensors(tuple(leaves[i] for i in tensors)).repeat())

  def fetch():
    fetched = list(leaves)
    for i, value in zip(tensors, next(batches)):
      fetched[i] = value
    return keras.tree.pack_sequence_as((step.args, step.kwargs), fetched)
  return fetch


def _loss(out) -> float:
  """Every leaf of a step's result read back (the work waited for); its loss (`loss`,
  else its first float scalar) as a float, 0.0 where it has none."""
  values = [np.asarray(t) for t in keras.tree.flatten(out) if hasattr(t, "shape")]
  if isinstance(out, dict) and "loss" in out:
    return float(np.mean(np.asarray(out["loss"])))
  scalars = [float(v) for v in values if v.size == 1 and v.dtype.kind == "f"]
  return scalars[0] if scalars else 0.0


def measure(step: Step, optimizers: list, own: str, planned_steps: int | None = None,
            table: timing.Table = timing.kernel_table,
            clock: timing.Clock = time.perf_counter) -> Cost:
  """The program's step timed under each policy (`own`: the program's policy, timed
  even where the kernel table predicts it), the program left as it was."""
  found = Cost(key_for(step, optimizers), keras_fit.onednn_rewrite_on(), step.batch,
               timed=f"this program's step on a batch it fed: {step.what}")
  start = clock()
  optimizer = step.models[0].optimizer if step.swap_optimizer else None
  # The policies any of its models' kernels rule out.
  skip = {p: r for m in step.models for p, r in timing.pathological(m, table).items()}
  with _Kept(_state(step, optimizers)) as kept:
    found.policies = timing.time_candidates(
        [(p, "", None) for p in config.POLICY_DTYPE], stepper(step, kept, optimizer),
        skip, own, clock, planned_steps)
  found.seconds = round(clock() - start, 2)
  return found


def for_script(step: Step, optimizers: list, own: str, planned_steps: int | None,
               seen: tuple[float, float] | None = None
               ) -> tuple[Cost | None, str | None]:
  """(the program's step cost per policy, or None; a note where it is not measured):
  the cache, a skip for a run known to be shorter than the measurement, or measured.
  `seen`: (its first step's ms, its next steps' median ms) as the run timed them: a
  run whose step's trace alone (its first step, less a step) would pass its share of
  the training it plans is not measured."""
  standing, found, note = timing.stand_in()
  if standing:
    return found, note or (None if found else f"{timing.ENV}=none: not measured")
  cached = cost_lib.cached(key_for(step, optimizers))
  planned_steps = timing.planned(planned_steps)
  if cached and all(cached.of(p) and cached.of(p).known_for(planned_steps)
                    for p in config.POLICY_DTYPE):
    return cached, None
  trace_ms = seen[0] - seen[1] if seen else 0.0
  why = timing.too_short(planned_steps) or (
      f"one trace of it (its first step took {seen[0] / 1e3:,.1f} s) would pass "
      f"{timing.SHARE:.0%} of this run's planned training ({planned_steps} steps of "
      f"~{seen[1]:,.0f} ms)" if planned_steps and seen
      and trace_ms > timing.SHARE * planned_steps * seen[1] else None)
  if not why:
    found = measure(step, optimizers, own, planned_steps)
    base = found.of("float32")
    why = None if base and base.ms_per_step else str(base.stopped)
  if why:
    return None, timing.NOT_MEASURED + why
  cost_lib.save(found)
  return found, None
