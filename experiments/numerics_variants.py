"""The registered variants' numerics after some training, and the findings they give.

  python experiments/numerics_variants.py                  # ~10 min on a 2-core Zen 3

Each registered model at its defaults (64 px, batch 32) trains `--steps` steps with
Keras' fit under each policy given, on the synthetic data; then one numerics sample
(mpt/measure/numerics.py) on the next 2 batches, as a run takes at its end, and the
diagnosis' numerics detectors on it: one line per model and policy, the worst figures
and the findings (none expected: these models train fine in 16 bits).
"""

import dataclasses

from absl import app
from absl import flags
import keras

from mpt import config
from mpt import models
from mpt.diagnose import detectors
from mpt.diagnose.evidence import Evidence
from mpt.measure import numerics
from mpt.records import numerics as records
from mpt.records.summary import RunSummary
from mpt.train.cli import data as data_lib
from mpt.train.common import precision
from mpt.train.common import steps as steps_lib
from mpt.train.common.model import build_model

flags.DEFINE_list("models", models.names(), "Registered variants.")
flags.DEFINE_list("policies", ["float32", "mixed_float16"], "Policies trained under.")
flags.DEFINE_integer("steps", 30, "Training steps before the sample.")
FLAGS = flags.FLAGS
CHECKS = ("f16_overflow", "gradient_underflow", "loss_scale_room", "bf16_error")


def one(name: str, policy: str, data) -> str:
  cfg = config.Config(model=name, policy=policy)
  keras.utils.set_random_seed(0)
  precision.set_policy(policy)
  model = build_model(cfg, len(data.class_names))
  optimizer = precision.make_optimizer(policy, cfg.learning_rate, cfg.loss_scale)
  loss = steps_lib.make_loss()
  model.compile(optimizer=optimizer, loss=loss)
  model.fit(data.train_from(0).take(FLAGS.steps), epochs=1, verbose=0)
  sample = numerics.sample(model, list(data.train_from(FLAGS.steps).take(2)),
                           lambda x, y, p: loss(y, p), FLAGS.steps,
                           precision.loss_scale(optimizer))
  found = records.Numerics(policy, cfg.loss_scale if policy == "mixed_float16"
                           else "none", samples=[sample])
  ev = Evidence(RunSummary(policy=policy, status="completed",
                           loss_scale=precision.loss_scale(optimizer)), None,
                numerics=found)
  fired = [f"{f.id}: {f.title}" for n in CHECKS if (f := detectors.DETECTORS[n](ev))]
  return (f"| {name} | {policy} | {records.describe(found)} | {sample.seconds:.1f} | "
          f"{'; '.join(fired) or 'none'} |")


def main(argv):
  del argv
  data = data_lib.load(dataclasses.replace(config.Config()))
  print("| model | policy | numerics after training (worst layer) | sample s | "
        "findings |\n|---|---|---|---|---|", flush=True)
  for name in FLAGS.models:
    for policy in FLAGS.policies:
      print(one(name, policy, data), flush=True)


if __name__ == "__main__":
  app.run(main)
