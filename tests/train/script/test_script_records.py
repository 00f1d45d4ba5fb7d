"""What a script's run folder records of the program's shape, each on a tiny program
run in this process (3 steps of `fit` under `mpt.callbacks`): the fast guards of
what the programs corpus (test_programs.py, `slow`) also checks.

- a DTypePolicyMap as the global policy: summary.json's `layer_policy` is its entries;
- a model holding two parts (a network and its EMA copy) that trains one:
  dtypes.json's `trained_params` are the trained part's, the copy `read_only_parts`;
- the step's cost per policy: skipped, with its reason, for a model built under a
  tf.distribute strategy (MPT_COST=none would stand in for the timing otherwise); a
  GAN's own train_step is the program's step, timed like any (for real: MPT_COST=always).
"""

import json

import keras
import numpy as np
import tensorflow as tf

import mpt
from mpt.records import summary as summary_lib

BATCH = 4


def _fit(model, run_dir, x, *y, steps: int = 3, numerics: str = "off"
         ) -> summary_lib.RunSummary:
  model.fit(x[:BATCH * steps], *(t[:BATCH * steps] for t in y), batch_size=BATCH,
            epochs=1, verbose=0,
            callbacks=mpt.callbacks(str(run_dir), batch_size=BATCH, warmup_steps=1,
                                    log_every=10, sample_every=None, numerics=numerics,
                                    diagnose=False))
  return summary_lib.read(run_dir / "summary.json")


def _data(rng):
  return rng.random((16, 6), dtype=np.float32), rng.random((16, 2), dtype=np.float32)


def _dense_net(name="net") -> keras.Model:
  inputs = keras.Input((6,))
  h = keras.layers.Dense(4, name="hidden")(inputs)
  return keras.Model(inputs, keras.layers.Dense(2, name="head")(h), name=name)


def test_a_policy_map_as_the_global_policy_is_the_runs_layer_policy(tmp_path):
  policy = keras.dtype_policies.DTypePolicyMap(keras.DTypePolicy("mixed_bfloat16"))
  policy["net/head"] = keras.DTypePolicy("float32")
  keras.mixed_precision.set_global_policy(policy)
  model = _dense_net()
  model.compile("sgd", "mse")
  summary = _fit(model, tmp_path / "run", *_data(np.random.default_rng(0)))
  assert summary.status == "completed"
  assert (summary.policy, summary.layer_policy) == ("mixed_bfloat16",
                                                    "net/head=float32")
  assert json.loads((tmp_path / "run" / "summary.json").read_text())[
      "layer_policy"] == "net/head=float32"


class WithEma(keras.Model):
  """No call(): a network and its EMA copy (clone_model, so the same Keras name); the
  step trains the network and moves the copy towards it."""

  def __init__(self):
    super().__init__(name="with_ema")
    self.network = _dense_net("net")
    self.ema_network = keras.models.clone_model(self.network)

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      loss = keras.ops.mean((self.network(x, training=True) - y) ** 2)
    grads = tape.gradient(loss, self.network.trainable_weights)
    self.optimizer.apply_gradients(zip(grads, self.network.trainable_weights))
    for weight, ema in zip(self.network.weights, self.ema_network.weights):
      ema.assign(0.9 * ema + 0.1 * weight)
    return {"loss": loss}


def test_an_ema_copy_is_a_read_only_part_and_its_weights_are_not_trained(tmp_path):
  model = WithEma()
  model.compile(optimizer=keras.optimizers.SGD(0.01))
  summary = _fit(model, tmp_path / "run", *_data(np.random.default_rng(1)))
  assert summary.status == "completed" and "trained" not in summary.not_measured
  dtypes = json.loads((tmp_path / "run" / "dtypes.json").read_text())
  assert dtypes["parts"] == ["network", "ema_network"]
  assert dtypes["read_only_parts"] == ["ema_network"]
  network = 6 * 4 + 4 + 4 * 2 + 2  # Keras' own count, by hand: the copy's left out.
  assert dtypes["trained_params"] == network == sum(
      r["params"] for r in dtypes["layers"] if r["name"].startswith("network/"))


def test_a_model_built_under_a_strategy_is_not_timed_per_policy_and_says_why(tmp_path):
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  with strategy.scope():
    model = _dense_net()
    model.compile("sgd", "mse")
  summary = _fit(model, tmp_path / "run", *_data(np.random.default_rng(2)))
  assert summary.status == "completed" and summary.cost is None
  assert summary.not_measured["cost"].startswith(
      "the model was built under MirroredStrategy: its variables are the strategy's")


class Gan(keras.Model):
  """keras.io's GAN overriding train_step, at toy sizes: no call(), two networks and
  two optimizers, each network stepped in turn."""

  def __init__(self):
    super().__init__(name="gan")
    self.generator = keras.Sequential([keras.Input((3,)), keras.layers.Dense(6)],
                                      name="generator")
    self.discriminator = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)],
                                          name="discriminator")
    self.seeds = keras.random.SeedGenerator(1)

  def compile(self, d_optimizer, g_optimizer):
    super().compile()
    self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer
    self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

  def train_step(self, real):
    batch = tf.shape(real)[0]
    fakes = self.generator(keras.random.normal((batch, 3), seed=self.seeds))
    fakes = tf.cast(fakes, real.dtype)  # Under a 16-bit policy: the images' dtype.
    labels = tf.concat([tf.ones((batch, 1)), tf.zeros((batch, 1))], axis=0)
    with tf.GradientTape() as tape:
      d_loss = self.loss_fn(labels, self.discriminator(tf.concat([fakes, real], 0)))
    grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
    self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
    with tf.GradientTape() as tape:
      g_loss = self.loss_fn(tf.zeros((batch, 1)), self.discriminator(
          self.generator(keras.random.normal((batch, 3), seed=self.seeds))))
    grads = tape.gradient(g_loss, self.generator.trainable_weights)
    self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
    return {"d_loss": d_loss, "g_loss": g_loss}


def test_a_gans_own_train_step_is_the_step_timed_per_policy(tmp_path, monkeypatch):
  """Timed for real (MPT_COST=always: whatever the run's length), each policy: its
  step draws noise and steps two optimizers, and does nothing a timing would repeat.
  Its numerics are not sampled: it has no call() to watch, said."""
  monkeypatch.setenv("MPT_COST", "always")
  gan = Gan()
  gan.compile(keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3))
  summary = _fit(gan, tmp_path / "run", _data(np.random.default_rng(3))[0],
                 numerics="on")
  assert summary.status == "completed" and "cost" not in summary.not_measured
  assert summary.cost.timed == ("this program's step on a batch it fed: fit's "
                                "train_step of Gan, with its own train_step")
  assert {p.policy: p.ms_per_step is not None for p in summary.cost.policies} == {
      "float32": True, "mixed_bfloat16": True, "mixed_float16": True}
  assert len(summary.program.stepped()) == 2  # Its two optimizers, not compile()'s.
  assert "has no one call() to watch" in summary.not_measured["numerics"]
