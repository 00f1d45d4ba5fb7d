"""Loss, metrics and the train/eval steps: the one definition both loops share.

`fit` gets `make_loss()` and `make_metrics()` through `model.compile`; the custom loop
builds its tf.function steps from the same two factories, so both report the same
`loss` (batch-size-weighted mean, as Keras' loss tracker) and `accuracy`.

The custom train step follows Keras 3's loss-scaling protocol, one code path for all
three policies: `optimizer.scale_loss(loss)` inside the tape (identity for a plain
optimizer, times the dynamic scale for a LossScaleOptimizer), gradients of the scaled
loss, then `optimizer.apply(grads, vars)`, which under loss scaling unscales, skips
the update when a gradient is not finite, and halves the scale.
"""

from typing import Callable

import keras
import tensorflow as tf

StepFn = Callable[[tf.Tensor, tf.Tensor], dict[str, tf.Tensor]]


class _FactoredLoss(keras.losses.Loss):
  """The loss times a variable factor (fault injection, mpt/train/cli/guards.py)."""

  def __init__(self, base: keras.losses.Loss, factor: tf.Variable):
    super().__init__(name=base.name)
    self.base, self.factor = base, factor

  def call(self, y_true, y_pred):
    losses = self.base.call(y_true, y_pred)
    return losses * tf.cast(self.factor, losses.dtype)


def make_loss(factor: tf.Variable | None = None) -> keras.losses.Loss:
  """The one loss of both loops; `factor` multiplies it (for fault injection)."""
  # The model's output is a float32 softmax, so the loss is computed in float32.
  loss = keras.losses.SparseCategoricalCrossentropy(name="loss")
  return _FactoredLoss(loss, factor) if factor is not None else loss


def make_metrics() -> list[keras.metrics.Metric]:
  return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]


class Steps:
  """The custom loop's compiled train and eval steps, with their metric state.

  Each step runs through `strategy.run` (the default strategy: one device, a plain
  call). On a replica, the gradient comes from the per-example losses summed and
  divided by the *global* batch (`tf.nn.compute_average_loss`); the optimizer sums
  the replicas' gradients, so the update is the one a single device would make. The
  metrics are on-read variables created under the strategy's scope: each replica
  adds its examples, and reading them outside `strategy.run` sums over replicas.
  """

  def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer,
               loss: keras.losses.Loss | None = None, jit_compile: bool = False,
               strategy: tf.distribute.Strategy | None = None,
               global_batch: int | None = None):
    self.model, self.optimizer = model, optimizer
    self.strategy = strategy or tf.distribute.get_strategy()
    self.global_batch = global_batch
    self.loss_fn = loss or make_loss()
    with self.strategy.scope():
      self.loss_tracker = keras.metrics.Mean(name="loss")
      self.metrics = [self.loss_tracker] + make_metrics()
      # Variables must exist before the first trace: tf.function cannot create them.
      if not optimizer.built:
        optimizer.build(model.trainable_variables)
    compile_ = lambda fn: tf.function(fn, jit_compile=jit_compile, reduce_retracing=True)
    self.train_step: StepFn = compile_(self._distributed(self._train_step))
    self.eval_step: StepFn = compile_(self._distributed(self._eval_step))

  def reset(self) -> None:
    for metric in self.metrics:
      metric.reset_state()

  def _distributed(self, replica_fn):
    def step(images, labels) -> dict[str, tf.Tensor]:
      self.strategy.run(replica_fn, args=(images, labels))
      return {metric.name: metric.result() for metric in self.metrics}
    return step

  def _per_example_loss(self, labels, probs) -> tf.Tensor:
    # Loss.call: the per-example losses (times the fault factor), not yet reduced.
    losses = self.loss_fn.call(labels, probs)
    if self.model.losses:  # Regularisers, as Keras' compute_loss adds them.
      losses += tf.add_n([tf.cast(l, losses.dtype) for l in self.model.losses])
    return losses

  def _update(self, losses, labels, probs) -> None:
    # The vector, not its mean: a replica's share of a partial last eval batch may
    # be empty, and an empty batch then adds nothing instead of a NaN mean.
    self.loss_tracker.update_state(losses)
    for metric in self.metrics[1:]:
      metric.update_state(labels, probs)

  def _train_step(self, images, labels) -> None:
    variables = self.model.trainable_variables
    with tf.GradientTape() as tape:
      probs = self.model(images, training=True)
      losses = self._per_example_loss(labels, probs)
      loss = tf.nn.compute_average_loss(losses, global_batch_size=self.global_batch)
      scaled_loss = self.optimizer.scale_loss(loss)
    grads = tape.gradient(scaled_loss, variables)
    self.optimizer.apply(grads, variables)
    self._update(losses, labels, probs)

  def _eval_step(self, images, labels) -> None:
    probs = self.model(images, training=False)
    self._update(self._per_example_loss(labels, probs), labels, probs)
