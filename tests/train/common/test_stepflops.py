"""The step's FLOPs counted from its traced graph (mpt/train/common/stepflops.py),
against counts written here by hand from each model's shapes: a multiply-add is 2
FLOPs; a matmul of [m, k] x [k, n] is 2mkn; its backward is one such product for the
weights' gradient and one for the input's, the latter only where something upstream
needs it (TensorFlow prunes the rest before it runs)."""

import json

import keras
import pytest
import tensorflow as tf

from mpt.train.common import countstep
from mpt.train.common import stepflops

B, T = 4, 6


def dense(m, k, n):  # One [m, k] x [k, n] product.
  return 2 * m * k * n


def train_step(model, loss_of=None, extra=None):
  """A step as keras.io's loops write it: forward, loss, gradients, optimizer."""
  optimizer = keras.optimizers.SGD(0.01)
  optimizer.build(model.trainable_variables)

  @tf.function
  def step(x):
    with tf.GradientTape() as tape:
      y = model(x, training=True)
      loss = tf.reduce_mean(tf.cast(y, tf.float32) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)
    if extra is not None:  # What the step also computes and returns (a metric).
      return loss, extra(x)
    return loss
  return step


def mlp(name="mlp", trainable=True):
  model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                            keras.layers.Dense(10)], name=name)
  model.trainable = trainable
  return model


def test_a_dense_chain_counts_no_input_gradient_at_the_first_layer():
  found = stepflops.of_step(train_step(mlp()), tf.zeros([B, 32]))
  hand = 2 * dense(B, 32, 64) + 3 * dense(B, 64, 10)
  assert found.matmul == pytest.approx(hand, rel=0.1) and not found.uncounted
  assert found.total >= found.matmul


def test_einsum_dense_projections_are_counted_as_matmuls():
  """EinsumDense (the Transformer's projections) runs Einsum, which TensorFlow
  registers no FLOP statistic for: counted by mpt's own rule, not as one FLOP per
  output element."""
  model = keras.Sequential([
      keras.Input((T, 8)),
      keras.layers.EinsumDense("abc,cd->abd", output_shape=(T, 16)),
      keras.layers.EinsumDense("abd,de->abe", output_shape=(T, 4))])
  found = stepflops.of_step(train_step(model), tf.zeros([B, T, 8]))
  hand = 2 * dense(B * T, 8, 16) + 3 * dense(B * T, 16, 4)
  assert found.matmul == pytest.approx(hand, rel=0.1), found


class OwnMatmul(keras.layers.Layer):
  """A custom layer doing its own matmul on its own weight."""

  def build(self, shape):
    self.w = self.add_weight(shape=(shape[-1], 16))

  def call(self, x):
    return keras.ops.matmul(x, self.w)


def test_a_custom_layers_own_matmul_is_counted():
  model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(8), OwnMatmul()])
  found = stepflops.of_step(train_step(model), tf.zeros([B, 32]))
  hand = 2 * dense(B, 32, 8) + 3 * dense(B, 8, 16)
  assert found.matmul == pytest.approx(hand, rel=0.1), found


def test_self_attention_counts_its_projections_and_both_attention_products():
  heads, key_dim, width = 2, 4, 8
  x = keras.Input((T, width))
  y = keras.layers.MultiHeadAttention(heads, key_dim)(x, x)
  found = stepflops.of_step(train_step(keras.Model(x, y)), tf.zeros([B, T, width]))
  projection = dense(B * T, width, heads * key_dim)  # Each of q, k, v and the output.
  product = heads * dense(B * T, key_dim, T)  # q.k^T per head, and the same for a.v.
  # Forward: 4 projections, 2 products. Backward: the 4 weights' gradients, the
  # output projection's input gradient, and both operands' gradients of each product
  # (q, k, v have no input gradient: x is the input).
  hand = (4 + 4 + 1) * projection + (2 + 4) * product
  assert found.matmul == pytest.approx(hand, rel=0.1), found


def test_an_ema_copy_only_read_counts_its_forward_only():
  net, ema = mlp("net"), mlp("ema", trainable=False)
  found = stepflops.of_step(train_step(net, extra=lambda x: tf.reduce_mean(ema(x))),
                            tf.zeros([B, 32]))
  trained = 2 * dense(B, 32, 64) + 3 * dense(B, 64, 10)
  read = dense(B, 32, 64) + dense(B, 64, 10)
  assert found.matmul == pytest.approx(trained + read, rel=0.1), found
  assert found.by_scope and any(s.startswith("ema") for s in found.by_scope)


def test_an_input_gradient_loop_counts_input_gradients_and_no_weight_gradient():
  """Style transfer's shape: the net frozen, the image the only variable trained."""
  net = mlp(trainable=False)
  image = tf.Variable(tf.zeros([B, 32]))
  optimizer = keras.optimizers.Adam(0.01)
  optimizer.build([image])

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(net(image))
    optimizer.apply([tape.gradient(loss, image)], [image])
    return loss

  found = stepflops.of_step(step)
  hand = 2 * (dense(B, 32, 64) + dense(B, 64, 10))  # Forward, and each input gradient.
  assert found.matmul == pytest.approx(hand, rel=0.1), found


def test_a_loop_of_unknown_length_is_said_not_guessed():
  model = keras.Sequential([keras.Input((None, 4)), keras.layers.LSTM(8)])
  found = stepflops.of_step(train_step(model), tf.zeros([B, T, 4]))
  assert found.uncounted, found
  count = countstep.CountStep()
  count.use(train_step(model), tf.zeros([B, T, 4]))
  count.on_train_batch_end(0)
  assert count.per_step is None and "no total claimed" in count.not_counted


def test_an_eager_step_has_no_graph_and_says_so():
  count = countstep.CountStep()
  count.use(lambda x: x, tf.zeros([1]))
  count.on_train_batch_end(0)
  assert count.per_step is None and "not a tf.function" in count.not_counted


def seed_convnet_matmul_flops(model, batch: int) -> int:
  """The seed convnet's step by hand from its layers' shapes: each convolution 2 x
  outputs x window x input channels, forward and the weights' gradient, and the
  input's gradient except at the first layer; the classifier likewise."""
  total, first = 0, True
  for layer in model.layers:
    if isinstance(layer, keras.layers.Conv2D):
      out = 1
      for d in layer.output.shape[1:]:
        out *= d
      kh, kw = layer.kernel_size
      one = 2 * out * kh * kw * layer.input.shape[-1] * batch
    elif isinstance(layer, keras.layers.Dense):
      one = dense(batch, layer.input.shape[-1], layer.units)
    else:
      continue
    total += (2 if first else 3) * one
    first = False
  return total


def test_the_command_lines_run_records_the_graphs_count(tiny):
  from mpt import models
  from mpt.train.cli import run as train
  result = train.train_and_evaluate(tiny(epochs=1, synthetic_train=16, loop="custom"))
  summary = json.loads(open(f"{result['run_dir']}/summary.json").read())
  hand = seed_convnet_matmul_flops(models.build("seed_convnet", (16, 16, 3), 10), 8)
  assert summary["flops_matmul"] == pytest.approx(hand, rel=0.1)
  assert summary["flops_per_step"] >= summary["flops_matmul"]
  assert summary["flops_counted_by"].startswith("graph:")
  assert summary["achieved_gflops"] == pytest.approx(
      summary["flops_per_step"] / summary["ms_per_step"] / 1e6, rel=1e-6)
  # --mode=inspect's figure for the same config: the same step's graph, untrained.
  from mpt.measure import dtypes as dtypes_lib
  from mpt.train.cli import dryrun
  from mpt.train.common.model import build_model
  from mpt.train.common.plan import Plan
  cfg = Plan.of(tiny(epochs=1, synthetic_train=16, loop="custom"))
  model = build_model(cfg, 10)
  report = dtypes_lib.inspect_model(model)
  step = dryrun._step_flops(cfg, model, report)
  assert (step["total"], step["matmul"]) == (summary["flops_per_step"],
                                             summary["flops_matmul"])
  assert f"{step['total'] / 1e6:,.1f} MFLOPs forward and backward" in \
      dtypes_lib.format_table({**report, "step_flops": step})
  # Per layer, where its ops are: conv2's forward and both gradients (4x4x64 outputs
  # of a 7x7 window over 32 channels, batch 8), with its bias' few.
  rows = {r["name"]: r for r in report["layers"]}
  assert rows["conv2"]["step_flops"] == pytest.approx(3 * 2 * 4 * 4 * 64 * 49 * 32 * 8,
                                                      rel=0.01)
  # The run's dtypes.json took the same per-layer count in (its batch, 8, the same).
  written = json.loads(open(f"{result['run_dir']}/dtypes.json").read())
  assert written["shares_of"] == "the step's FLOPs"
  assert {r["name"]: r["step_flops"] for r in written["layers"]} == \
      {n: r["step_flops"] for n, r in rows.items()}


def test_mobilenet_v2_counts_its_depthwise_convolutions_both_ways():
  """Keras' MobileNetV2 (random weights): every Conv2D, DepthwiseConv2D and the
  classifier forward, their weights' gradients, and their inputs' except the first
  convolution's, by hand from each layer's shapes. TensorFlow registers no FLOP
  statistic for the depthwise gradients: counted by mpt's rule."""
  model = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35,
                                         weights=None, classes=10)
  found = stepflops.of_step(train_step(model), tf.zeros([2, 32, 32, 3]))
  hand, first = 0, True
  for layer in model.layers:
    out = 1
    for d in (layer.output.shape[1:] if hasattr(layer, "output") else ()):
      out *= d
    if isinstance(layer, keras.layers.DepthwiseConv2D):
      one = 2 * out * layer.kernel_size[0] * layer.kernel_size[1] * 2
    elif isinstance(layer, keras.layers.Conv2D):
      one = 2 * out * layer.kernel_size[0] * layer.kernel_size[1] * \
          layer.input.shape[-1] * 2
    elif isinstance(layer, keras.layers.Dense):
      one = dense(2, layer.input.shape[-1], layer.units)
    else:
      continue
    hand += (2 if first else 3) * one
    first = False
  assert found.matmul == pytest.approx(hand, rel=0.1), (found.matmul, hand)
  assert not found.uncounted


def test_depthwise_convolutions_alone_count_forward_filter_and_input_gradients():
  """Only depthwise convolutions, so that each of their three ops is a third or more
  of the count and the tolerance hides none: each output element is one input
  channel's kh x kw window (2 FLOPs per multiply-add), forward, the filter's gradient,
  and the input's gradient at the second layer only (the first's is pruned)."""
  model = keras.Sequential([
      keras.Input((8, 8, 3)),
      keras.layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same"),  # 8x8x6.
      keras.layers.DepthwiseConv2D(3, strides=2)])  # 3x3x6.
  found = stepflops.of_step(train_step(model), tf.zeros([2, 8, 8, 3]))
  first, second = 2 * 2 * (8 * 8 * 6) * 9, 2 * 2 * (3 * 3 * 6) * 9
  assert found.matmul == pytest.approx(2 * first + 3 * second, rel=0.01), found
  assert not found.uncounted


class Float32Inside(keras.layers.Layer):
  """A layer under a 16-bit policy whose own matmul runs in float32 (as a float32
  logits projection does)."""

  def build(self, shape):
    self.w = self.add_weight(shape=(shape[-1], shape[-1]))

  def call(self, x):
    return keras.ops.matmul(keras.ops.cast(x, "float32"), self.w)


def test_the_reports_shares_are_the_steps_by_the_dtype_each_op_computes_in():
  """dtypes.json's shares, once the step is counted: over the step's FLOPs, by the
  dtype of each op (by hand: the first Dense in bfloat16, forward and its weights'
  gradient; the rest in float32, three products each), each layer's own."""
  from mpt.measure import dtypes as dtypes_lib
  batch, width = 32, 64
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(width),
                              Float32Inside(name="inside"),
                              keras.layers.Dense(10, dtype="float32", name="head")])
    report = dtypes_lib.inspect_model(model)
    found = stepflops.of_step(train_step(model), tf.zeros([batch, width]))
  finally:
    keras.mixed_precision.set_global_policy("float32")
  stepflops.into_report(report, found, batch)
  sixteen = 2 * dense(batch, width, width)
  inside, head = 3 * dense(batch, width, width), 3 * dense(batch, width, 10)
  total = sixteen + inside + head
  assert report["shares_of"] == "the step's FLOPs"
  assert report["flops_share_16bit"] == pytest.approx(sixteen / total, rel=0.05)
  rows = {r["name"]: r for r in report["layers"]}
  assert rows["inside"]["step_flops"] == pytest.approx(inside, rel=0.05)
  float32 = {l["name"]: l for l in report["float32_layers"]}
  assert float32["inside"]["reason"] == "its ops compute in float32 under a 16-bit policy"
  assert float32["head"]["flops_share"] == pytest.approx(head / total, rel=0.05)
  assert [l["name"] for l in report["float32_layers"]] == ["inside", "head"]
  assert "the step's FLOPs in 16-bit" in dtypes_lib.format_table(report)


def _unique_scopes_model() -> keras.Model:
  x = keras.Input((8,))
  h = keras.layers.Dense(16, name="d")(x)
  h = keras.layers.Dense(32, name="d_1")(h)
  model = keras.Model(x, keras.layers.Dense(4, name="d_2")(h), name="net")
  model.compile(optimizer="sgd", loss="mse")
  return model


def _rows_by_hand(model, found) -> None:
  """Each row's FLOPs by hand: forward, weights' gradient and (past the first) input
  gradient, 2 FLOPs per multiply-add."""
  from mpt.measure import dtypes as dtypes_lib
  report = dtypes_lib.inspect_model(model)
  stepflops.into_report(report, found, B)
  rows = {r["name"]: r["step_flops"] for r in report["layers"]}
  hand = {"d": 2 * dense(B, 8, 16), "d_1": 3 * dense(B, 16, 32), "d_2": 3 * dense(B, 32, 4)}
  for name, flops in hand.items():
    assert rows[name] == pytest.approx(flops, rel=0.1), (name, rows)


def test_layers_named_like_tensorflows_unique_scopes_get_their_own_ops():
  """Layers named `d`, `d_1`, `d_2`: TensorFlow runs them under scopes it makes
  unique (`d_1`, `d_1_1`, ...), so a scope's name alone cannot say whose ops they
  are; the scopes recorded as the step traces do."""
  model = _unique_scopes_model()
  model.fit(tf.zeros([B, 8]), tf.zeros([B, 4]), verbose=0)
  step = tf.function(model.train_step, autograph=False)
  _rows_by_hand(model, stepflops.of_trace(
      step, ((tf.TensorSpec([B, 8]), tf.TensorSpec([B, 4])),), [model]))


def test_fits_step_is_counted_from_the_trace_fit_made_with_its_layers_scopes():
  """Under fit, the graph Keras traced at the first step is counted, each layer's
  scope read as it traced: no second trace, and the same rows by hand. A second fit
  of the same model traces nothing: its step is traced for counting instead."""
  model = _unique_scopes_model()
  traced = []  # Each trace of the model's train_step, Keras' or a count's.
  train_step = model.train_step
  model.train_step = lambda data: (traced.append(1), train_step(data))[1]
  batch = (tf.zeros([B, 8]), tf.zeros([B, 4]))
  for fit in (1, 2):
    count = countstep.CountStep(default_args=(batch,))
    model.fit(*batch, batch_size=B, verbose=0, callbacks=[count])
    assert count.not_counted is None and len(traced) == fit
    _rows_by_hand(model, count.found)
