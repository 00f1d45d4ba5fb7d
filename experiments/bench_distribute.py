"""Steps/sec on one device vs mirrored on logical CPUs vs two local workers.

  python experiments/bench_distribute.py                  # 64 px, batch 32, ~6 min
  python experiments/bench_distribute.py --policies=float32,mixed_bfloat16

Each cell trains the seed convnet on the synthetic data for one epoch of `--steps`
steps with the same global batch and seed, as its own child process (a two-worker
cell is two child processes on 127.0.0.1 ports, under MultiWorkerMirroredStrategy);
cells run one after another. ms/step is summary.json's median after `--warmup`
steps. `loss vs 1 dev` is the relative difference of the epoch's mean training loss
from the one-device cell of the same loop and policy: the same global batches and
updates should give the same curve.

On the 2-core dev machine this measures the cost of the machinery, not a speed-up:
the replicas share the same two cores (and the two workers also talk over gRPC).
"""

from absl import app
from absl import flags

import benchlib

flags.DEFINE_list("policies", ["float32"], "")
flags.DEFINE_list("loops", ["fit", "custom"], "")
flags.DEFINE_integer("image_size", 64, "")
flags.DEFINE_integer("batch_size", 32, "Global batch size.")
flags.DEFINE_integer("steps", 30, "Train steps per cell, warm-up included.")
flags.DEFINE_integer("warmup", 5, "Leading steps left out of the median.")
flags.DEFINE_string("out", "logs/bench_distribute", "Logs root for the cells' runs.")
FLAGS = flags.FLAGS

SETUPS = {  # name -> (extra flags, workers)
    "1 device": ({"strategy": "default"}, 1),
    "mirrored 2 CPUs": ({"strategy": "mirrored", "cpu_devices": 2}, 1),
    "2 workers": ({}, 2),
}


def main(argv):
  del argv
  rows = []
  for policy in FLAGS.policies:
    for loop in FLAGS.loops:
      base = None
      for setup, (extra, workers) in SETUPS.items():
        s = benchlib.run_cell(
            FLAGS.out, f"{policy}_{loop}_{setup.replace(' ', '')}", workers=workers,
            policy=policy, loop=loop, image_size=FLAGS.image_size,
            batch_size=FLAGS.batch_size, epochs=1, steps_per_epoch=FLAGS.steps,
            warmup_steps=FLAGS.warmup, synthetic_train=1300, synthetic_val=100,
            **extra)
        base = base or s
        rows.append((policy, loop, setup, s["replicas"], s["per_replica_batch"],
                     s["ms_per_step"], 1e3 / s["ms_per_step"],
                     s["images_per_sec"], base["ms_per_step"] / s["ms_per_step"],
                     abs(s["train_loss"] - base["train_loss"]) / base["train_loss"]))
  print(f"\nseed convnet, {FLAGS.image_size} px, global batch {FLAGS.batch_size}, "
        f"median of {FLAGS.steps - FLAGS.warmup} steps after {FLAGS.warmup}\n")
  print("| policy | loop | setup | replicas | per-replica batch | ms/step | steps/s "
        "| images/s | speed vs 1 device | loss vs 1 dev |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]:.1f} | {r[6]:.2f} | "
          f"{r[7]:.0f} | {r[8]:.2f}x | {r[9]:.1e} |")


if __name__ == "__main__":
  app.run(main)
