"""Every touch of Keras/TensorFlow internals in mpt, one named function each.

`fit` is Keras' own loop; mpt needs things from it that Keras has no public switch
for (a batch fetched through mpt's timer, the one-step function it traced), and
facts and hooks of TensorFlow's that only tensorflow.python offers (op callbacks, the
eager tape's gradient look-up, op statistics, whether its oneDNN rewrite is on). Each
function below says what it changes, why, and which versions it was written for:
Keras 3.15 on TensorFlow 2.21 (KERAS_VERSION, TF_VERSION).
tests/train/common/test_keras_fit.py checks that every private name used here still exists,
and fails loudly, naming the function, when a Keras or TF upgrade removes one. No
other module of mpt may use a private attribute of a Keras or TF object (an import
walk in tests/test_architecture.py checks that too).
"""

import contextlib
import threading
from typing import Any, Callable

import keras
import tensorflow as tf

KERAS_VERSION = "3.15"
TF_VERSION = "2.21"


def build_from_plain_batch(model: keras.Model, sample: Any) -> None:
  """Under a strategy, Keras builds the model's metrics and optimizer from one batch
  it reads off the distributed dataset and averages over replicas; under
  MultiWorkerMirroredStrategy that average fails (Keras 3.15 reduces the (images,
  labels) tuple with a collective that takes single tensors). Build from a plain
  validation batch instead: only its shapes matter."""
  build = model._maybe_symbolic_build
  model._maybe_symbolic_build = lambda iterator=None, data_batch=None: build(
      data_batch=sample if data_batch is None else data_batch)


def in_multi_worker_mode(strategy: tf.distribute.Strategy) -> bool:
  """A MultiWorkerMirroredStrategy with more than one worker (TF has no public
  question for it)."""
  return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and \
      strategy.extended._in_multi_worker_mode()


def metrics_as_vectors(model: keras.Model) -> None:
  """Keras 3 averages the step's metric results across workers with
  strategy.reduce("MEAN", value, axis=0), which fails for scalars ("Invalid reduction
  dimension 0", tensorflow/tensorflow#72388). Give them shape [1]: an instance
  attribute replaces the model's `compute_metrics`, for this model only."""
  compute_metrics = model.compute_metrics
  model.compute_metrics = lambda *args, **kwargs: {
      k: tf.reshape(v, [1]) for k, v in compute_metrics(*args, **kwargs).items()}


def fetch_through(model: keras.Model, fetch: Callable[[Any], Any]) -> None:
  """Replaces the model's train function with one that takes its batch through
  `fetch` (mpt's timed `next`), so the data wait is timed the same way in fit as in
  the custom loop. Keras' TF train function runs its compiled one-step function on
  each element of a plain Python iterator; given one batch, that is exactly one step.
  """
  model.make_train_function()
  keras_step = model.train_function
  if getattr(keras_step, "mpt_fetch", None) is fetch:  # A second fit: wrapped already.
    return
  timed = lambda iterator: keras_step(iter([fetch(iterator)]))
  timed.mpt_fetch = fetch
  timed.mpt_keras_step = keras_step  # For one_step_function.
  model.train_function = timed


def one_step_function(model: keras.Model) -> Any:
  """The tf.function Keras' fit runs for each batch of `model` (traced at the first
  step), or None where there is none (run_eagerly: a Python function; no train
  function made yet). Keras 3.15 keeps it only in the closure of the train function
  its `_make_function` returns (`one_step_on_data`, wrapped by
  `_autoconvert_optionals`, whose functools.wraps gives `__wrapped__`)."""
  train = model.train_function
  train = getattr(train, "mpt_keras_step", train)  # fetch_through's wrapper.
  code = getattr(train, "__code__", None)
  if code is None:
    return None
  cells = dict(zip(code.co_freevars, train.__closure__ or ()))
  wrapper = cells["one_step_on_data"].cell_contents if "one_step_on_data" in cells \
      else None
  step = getattr(wrapper, "__wrapped__", None)
  return step if hasattr(step, "experimental_get_tracing_count") else None


def step_marker(step: int) -> Any:
  """A profiler trace event marking one train step, for the profile plugin's step
  view: `_r=1` is TF's private metadata key for a step's root event (the key Keras'
  own TensorBoard callback passes)."""
  return tf.profiler.experimental.Trace("train", step_num=step, _r=1)


def function_graph(graph: Any, name: str) -> Any:
  """The graph of function `name` that an op of `graph` (a FuncGraph) calls, looked
  up in it and its outer graphs; None where TF keeps no Python graph for it. TF has no
  public look-up: FuncGraph._functions holds the functions a graph calls (TF 2.21:
  AtomicFunction objects, whose `graph` is the FuncGraph)."""
  while graph is not None:
    fn = getattr(graph, "_functions", {}).get(name)
    if fn is not None:
      return getattr(fn, "graph", None)
    graph = getattr(graph, "outer_graph", None)
  return None


def registered_flops(graph: Any, op: Any) -> int | None:
  """The FLOPs TensorFlow's own op statistics give `op` of `graph` (the registry its
  profiler reads, `RegisterStatistics(type, "flops")`); None where no statistic is
  registered for the op's type. Raises ValueError where the statistic needs a shape
  the graph does not fix. The registry is only reachable through tensorflow.python
  (TF 2.21), and reads shapes through a deprecated v1 helper, silenced here."""
  from tensorflow.python.framework import ops as tf_ops
  from tensorflow.python.util import deprecation
  with deprecation.silence():
    stats = tf_ops.get_stats_for_node_def(graph, op.node_def, "flops")
  return None if stats.value is None else int(stats.value)


def trained_variables(optimizer: keras.optimizers.Optimizer) -> list:
  """The variables `optimizer` steps, once built (a LossScaleOptimizer's are its inner
  optimizer's). Keras 3.15 keeps them in the private `_trainable_variables`, filled
  by build(var_list); it has no public list."""
  inner = getattr(optimizer, "inner_optimizer", None)
  return list(getattr(inner or optimizer, "_trainable_variables", []) or [])


@contextlib.contextmanager
def eager_gradient_ops(seen: Callable[[str, Any, list, list], None]):
  """Inside the block, `seen(op_type, forward, inputs, outputs)` after each op
  TensorFlow runs eagerly in this thread, where `forward` is the op whose gradient a
  GradientTape is computing (its `type`, and its `inputs` and `outputs`: the forward
  pass' own tensors), or None for an op outside any op's gradient (one the tape runs
  itself, such as the sum of two gradients of one tensor). TF 2.21's eager tape
  looks up each op's gradient function in a registry of tensorflow.python
  (framework/ops.py's `_gradient_registry`, read by eager/backprop.py's
  `_gradient_function`, which calls it with a mock op of the forward op); for the
  block, the module's registry is one whose look-up wraps each function found. `seen`
  must run no TensorFlow op itself. See `eager_ops`."""
  from tensorflow.python.framework import ops as tf_ops
  registry = tf_ops._gradient_registry
  local = threading.local()

  class Wrapping:  # Read through (a Registry's attributes cannot be set).
    def __getattr__(self, name):
      return getattr(registry, name)

    def lookup(self, op_type):
      gradient = registry.lookup(op_type)
      if gradient is None:
        return None

      def run(op, *grads):
        stack = local.__dict__.setdefault("ops", [])
        stack.append(op)
        try:
          return gradient(op, *grads)
        finally:
          stack.pop()
      return run

  def each(op, inputs, outputs):
    stack = getattr(local, "ops", None)
    seen(op, stack[-1] if stack else None, inputs, outputs)

  tf_ops._gradient_registry = Wrapping()
  try:
    with eager_ops(each):
      yield
  finally:
    tf_ops._gradient_registry = registry


@contextlib.contextmanager
def eager_ops(seen: Callable[[str, list, list], None]):
  """Inside the block, `seen(op_type, inputs, outputs)` after each op TensorFlow runs
  eagerly in this thread (not one a tf.function's graph holds): the values a layer
  computes inside its call, which no Keras hook shows. `seen` must run no TensorFlow
  op itself (read tensors with .numpy()). The outputs are those TF's own numerics
  check reads (not its SAFE_OPS, which pass values through, nor FusedBatchNorm's
  auxiliary outputs, undefined in inference mode). TF 2.21 offers op callbacks and
  those lists only in tensorflow.python (op_callbacks, which
  tf.debugging.enable_check_numerics and Debugger V2 are built on)."""
  from tensorflow.python.debug.lib import check_numerics_callback
  from tensorflow.python.framework import op_callbacks
  ignored = {(op.decode(), i) for op, i in check_numerics_callback.IGNORE_OP_OUTPUTS}
  safe = {op.decode() for op in check_numerics_callback.SAFE_OPS}
  inside = []

  def callback(op_type, inputs, attrs, outputs, op_name=None, graph=None):
    op = op_type.decode() if isinstance(op_type, bytes) else op_type  # Eager: bytes.
    if graph is not None or inside or op in safe or outputs is None:
      return None
    inside.append(True)
    try:
      seen(op, list(inputs or []),
           [t for i, t in enumerate(outputs) if (op, i) not in ignored])
    finally:
      inside.pop()
    return None  # The outputs as they are.

  op_callbacks.add_op_callback(callback)
  try:
    yield
  finally:
    op_callbacks.remove_op_callback(callback)


def onednn_rewrite_on() -> bool:
  """Whether TensorFlow's oneDNN graph rewrite is on in this process. TF 2.21 turns it
  on by default only on CPUs with AVX512_VNNI, AVX512_BF16 or AMX (and always when
  TF_ENABLE_ONEDNN_OPTS=1); where it is off, TF's own Eigen kernels run the ops, and
  those compute 16-bit convolutions in float32 copies of their operands. TF has no
  public question for it: IsMklEnabled() answers what the rewrite itself checks."""
  from tensorflow.python.util import _pywrap_util_port
  return bool(_pywrap_util_port.IsMklEnabled())


def function_options(fn: Any) -> dict[str, Any]:
  """The options a tf.function was made with (XLA, AutoGraph and its options), to
  trace its Python function again as the program would. TF 2.21 keeps them only in
  the Function's private attributes."""
  return {"jit_compile": fn._jit_compile, "autograph": fn._autograph,
          "experimental_autograph_options": fn._experimental_autograph_options}


def op_seeds(state: Any = None) -> Any:
  """TF's op-seed generator (what gives each random op traced without a seed its
  seed, once a global seed is set): its state, or, given one, that state restored.
  Tracing a step draws from it; TF 2.21 keeps it as the eager context's private
  `_rng` (a random.Random, None before a global seed is set)."""
  from tensorflow.python.eager import context
  rng = getattr(context.context(), "_rng", None)  # Set with the first global seed.
  if rng is None:
    return None
  if state is None:
    return rng.getstate()
  rng.setstate(state)
  return state
