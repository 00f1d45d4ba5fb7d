"""What checkpointing costs: time per save of the seed model, and its share of training.

  python experiments/bench_checkpoint.py         # ~4 min on the 2-core dev machine

Cells (seed convnet, synthetic data, 64 px, batch 32, float32, custom loop, 2 epochs of
41 steps) with --checkpoint_every=0 (epoch ends only), 10 and 1. A save happens
between steps, so it is not in ms_per_step; the overhead is the saves' total time over
the time spent in train steps (`train_s`). The checkpoint size does not depend on the
image size (weights and optimizer state only).
"""

from absl import app
from absl import flags

import benchlib

flags.DEFINE_list("every", ["0", "10", "1"], "--checkpoint_every values.")
flags.DEFINE_string("out", "logs/bench_checkpoint", "Logs root for the cells.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  rows = []
  for every in map(int, FLAGS.every):
    s = benchlib.run_cell(FLAGS.out, f"every{every}", checkpoint="true",
                          checkpoint_every=every, loop="custom", image_size=64,
                          batch_size=32, epochs=2, synthetic_val=100)
    c = s["checkpoint_ms"]
    rows.append((every, c["saves"], c["median"], c["total"] / 1e3, s["train_s"],
                 s["ms_per_step"]))
  print("\n| --checkpoint_every | saves | ms per save (median) | saves total s | "
        "train-step s | overhead | ms/step |\n|---|---|---|---|---|---|---|")
  for every, saves, med, total, train_s, ms in rows:
    print(f"| {every} | {saves} | {med:.1f} | {total:.2f} | {train_s:.1f} | "
          f"{total / train_s:.1%} | {ms:.1f} |")


if __name__ == "__main__":
  app.run(main)
