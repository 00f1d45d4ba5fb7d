"""mpt/train/common/keras_fit.py is written against Keras 3.15 / TF 2.21 internals. These tests
fail loudly, naming the function to revisit, when an upgrade removes or changes one."""

import os
import subprocess
import sys

import keras
import numpy as np
import tensorflow as tf

import helpers
from mpt.machine import hardware
from mpt.machine import isa
from mpt.train.common import keras_fit



def _model():
  inputs = keras.Input((4,))
  model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
  model.compile(optimizer="adam", loss="mse")
  return model


def test_written_for_the_installed_versions():
  # Not a pin: a reminder that the functions below were checked against these.
  assert keras.__version__.startswith(keras_fit.KERAS_VERSION + "."), (
      f"mpt/train/common/keras_fit.py was written for Keras {keras_fit.KERAS_VERSION}; this is "
      f"{keras.__version__}: check each function there, then update KERAS_VERSION")
  assert tf.__version__.startswith(keras_fit.TF_VERSION + "."), (
      f"mpt/train/common/keras_fit.py was written for TF {keras_fit.TF_VERSION}; this is "
      f"{tf.__version__}: check each function there, then update TF_VERSION")


def test_build_from_plain_batch_still_finds_keras_private_build():
  # Keras builds symbolically only for a model made under a strategy.
  with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
    model = _model()
  assert callable(getattr(model, "_maybe_symbolic_build", None)), (
      "keras.Model._maybe_symbolic_build is gone: revisit "
      "keras_fit.build_from_plain_batch (multi_worker fit builds from a plain batch)")
  sample = (np.zeros((2, 4), np.float32), np.zeros((2, 2), np.float32))
  keras_fit.build_from_plain_batch(model, sample)
  # Called as fit calls it, but with no batch: only the patch supplies `sample`.
  model._maybe_symbolic_build(iterator=None)
  assert model.optimizer.built, ("keras_fit.build_from_plain_batch no longer builds "
                                 "the optimizer from the plain batch")


def test_in_multi_worker_mode_still_answers():
  strategy = tf.distribute.MultiWorkerMirroredStrategy()  # No TF_CONFIG: one worker.
  assert hasattr(strategy.extended, "_in_multi_worker_mode"), (
      "MultiWorkerMirroredStrategy.extended._in_multi_worker_mode is gone: revisit "
      "keras_fit.in_multi_worker_mode")
  assert keras_fit.in_multi_worker_mode(strategy) is False
  assert keras_fit.in_multi_worker_mode(tf.distribute.get_strategy()) is False


def test_metrics_as_vectors_reshapes_the_step_results():
  model = _model()
  model.fit(np.zeros((4, 4)), np.zeros((4, 2)), epochs=1, verbose=0)
  keras_fit.metrics_as_vectors(model)
  x, y = tf.zeros((2, 4)), tf.zeros((2, 2))
  results = model.compute_metrics(x, y, model(x), sample_weight=None)
  assert results and all(v.shape == (1,) for v in results.values()), results


def test_fetch_through_runs_one_step_per_fetched_batch():
  model, fetched = _model(), []
  batches = iter([(np.ones((2, 4), np.float32), np.ones((2, 2), np.float32))] * 3)

  def fetch(iterator):
    fetched.append(1)
    return next(iterator)

  keras_fit.fetch_through(model, fetch)
  model.train_function(batches)
  assert len(fetched) == 1 and int(model.optimizer.iterations.numpy()) == 1, (
      "Keras' train function no longer runs one step per element of a plain "
      "iterator: revisit keras_fit.fetch_through")


def test_one_step_function_is_still_the_step_fit_traced():
  model = _model()
  x, y = np.ones((2, 4), "float32"), np.ones((2, 2), "float32")
  keras_fit.fetch_through(model, next)  # As mpt's fit runs: through its wrapper.
  model.fit(x, y, batch_size=2, verbose=0)
  step = keras_fit.one_step_function(model)
  # Traced at the first step (twice where the step creates the optimizer's
  # variables: TensorFlow traces such a function again).
  traces = step.experimental_get_tracing_count() if step is not None else 0
  assert traces >= 1, ("revisit keras_fit.one_step_function: Keras' train function "
                       "no longer holds the one_step_on_data it traced")
  model.fit(x, y, batch_size=2, verbose=0)  # The same step again: no trace.
  assert keras_fit.one_step_function(model) is step
  assert step.experimental_get_tracing_count() == traces


def test_step_marker_is_a_step_root_event_in_a_trace(tmp_path):
  tf.profiler.experimental.start(str(tmp_path))
  with keras_fit.step_marker(3):
    tf.constant(1.0) + 1.0
  tf.profiler.experimental.stop()
  [trace] = tmp_path.glob("plugins/profile/*/*.xplane.pb")
  assert helpers.trace_steps(trace) == [("train", {"step_num": 3, "_r": 1})], (
      "the step marker is not a step root event (_r=1) any more: revisit "
      "keras_fit.step_marker")


def test_a_called_functions_graph_and_tfs_op_statistics_are_still_found():
  """stepflops.py reads the graphs of the functions a step calls and TF's registry of
  op FLOP statistics through these two: an upgrade that moves either fails here."""
  import tensorflow as tf
  inner = tf.function(lambda a: tf.matmul(a, a))
  graph = tf.function(lambda a: inner(a)).get_concrete_function(
      tf.TensorSpec([3, 3])).graph
  [call] = [op for op in graph.get_operations() if op.type.endswith("PartitionedCall")]
  called = keras_fit.function_graph(graph, call.get_attr("f").name)
  [matmul] = [op for op in called.get_operations() if op.type == "MatMul"]
  assert keras_fit.registered_flops(called, matmul) == 2 * 3 * 3 * 3
  assert keras_fit.function_graph(graph, "no_such_function") is None


def test_eager_ops_still_see_each_op_a_layer_runs():
  seen = []
  layer = keras.layers.Dense(2)
  layer.build((1, 4))
  with keras_fit.eager_ops(lambda op, inputs, outputs: seen.append(
      (op, [o.numpy().shape for o in outputs]))):
    layer(np.ones((1, 4), "float32"))
  assert ("MatMul", [(1, 2)]) in seen, (
      f"revisit keras_fit.eager_ops: the eager MatMul was not seen ({seen})")
  # Inference-mode batch normalisation: its output only, not its undefined others.
  seen.clear()
  with keras_fit.eager_ops(lambda op, inputs, outputs: seen.append(
      (op, [o.numpy().shape for o in outputs]))):
    tf.compat.v1.nn.fused_batch_norm(np.ones((1, 1, 2, 3), "float32"), np.ones(3, "float32"),
                                     np.zeros(3, "float32"), np.zeros(3, "float32"),
                                     np.ones(3, "float32"), is_training=False)
  assert [s for op, s in seen if op.startswith("FusedBatchNorm")] == [[(1, 1, 2, 3)]], (
      f"revisit keras_fit.eager_ops: TF's ignored outputs changed ({seen})")


def test_eager_gradient_ops_still_see_the_forward_op_each_gradient_is_of():
  from tensorflow.python.framework import ops as tf_ops
  registry = tf_ops._gradient_registry
  layer = keras.layers.Dense(2)
  layer.build((1, 4))
  forward = []
  with tf.GradientTape() as tape:
    with keras_fit.eager_ops(lambda op, inputs, outputs: forward.append(
        (op, [id(t) for t in inputs]))):
      y = tf.reshape(layer(np.ones((1, 4), "float32")), [-1])
    loss = tf.reduce_sum(y * y)
  seen = []
  with keras_fit.eager_gradient_ops(lambda op, of, inputs, outputs: seen.append(
      (op, of and of.type, [id(t) for t in (of and of.inputs) or () if t is not None]))):
    tape.gradient(loss, layer.trainable_variables)
  assert tf_ops._gradient_registry is registry, (
      "keras_fit.eager_gradient_ops left TF's gradient registry replaced")
  matmul = [ids for op, ids in forward if op == "MatMul"]
  # The kernel's gradient: a MatMul in the forward MatMul's gradient, which keeps the
  # forward op's own input tensors; a Reshape is one of TF's SAFE_OPS: not seen.
  assert any(op == "MatMul" and of == "MatMul" and set(ids) <= set(matmul[0])
             for op, of, ids in seen), (
      f"revisit keras_fit.eager_gradient_ops: no MatMul seen in MatMul's gradient ({seen})")
  assert "Reshape" not in [op for op, _, _ in seen]


def test_trained_variables_are_still_the_ones_an_optimizer_was_built_for():
  model = _model()
  for optimizer in (keras.optimizers.Adam(),
                    keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())):
    optimizer.build(model.trainable_variables[:1])
    assert [id(v) for v in keras_fit.trained_variables(optimizer)] == \
        [id(model.trainable_variables[0])], (
        "Keras' optimizers no longer keep _trainable_variables: revisit "
        "keras_fit.trained_variables (a script's trained parameters)")


def test_onednn_rewrite_on_still_reads_tfs_switch(children):
  """The switch by its documented variable, in two children started together (TF
  reads it once, at the first op): off with TF_ENABLE_ONEDNN_OPTS=0 and on with 1, on
  any CPU. Unset (this test process, unless the suite runs with it set), TF's default,
  which mpt's copy of TF's rule (hardware.onednn_default, used before TF starts) must
  give for this host's real CPU."""
  code = "from mpt.train.common import keras_fit; print(keras_fit.onednn_rewrite_on())"
  procs = {value: children.start(
      [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": value}) for value in ("0", "1")}
  if "TF_ENABLE_ONEDNN_OPTS" not in os.environ and os.path.exists("/proc/cpuinfo"):
    rule, _ = hardware.onednn_default(isa.detect("/proc/cpuinfo").flags)
    assert keras_fit.onednn_rewrite_on() is rule, (
        "TF's default for its oneDNN rewrite on this CPU is no longer "
        "hardware.ONEDNN_DEFAULT_FLAGS' rule (TF's DefaultOneDnnPolicy): revisit it")
  for value, expected in (("0", "False"), ("1", "True")):
    out, err = procs[value].communicate(timeout=120)
    assert out.strip() == expected, (
        "tensorflow.python.util._pywrap_util_port.IsMklEnabled no longer answers "
        f"TF_ENABLE_ONEDNN_OPTS={value}: revisit keras_fit.onednn_rewrite_on "
        f"({err[-1500:]})")
