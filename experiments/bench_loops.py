"""ms/step of the 6 loop x policy pairs, side by side in one run, at several image sizes
(and BatchNorm kinds).

  python experiments/bench_loops.py                           # 64 and 256 px, batch 32
  python experiments/bench_loops.py --image_sizes=64 --steps=40
  python experiments/bench_loops.py --image_sizes=64 --batchnorms=keras,fused --repeats=3

With --repeats=N every cell runs N times, the cells interleaved (all cells once, then
all again), and the figure is the median of the N runs' medians; with several
--batchnorms each row gets `fused/keras` (< 1: the fused layer is faster).

Each cell is its own `python -m mpt.main` child process (fresh TF state), training the
seed convnet on the synthetic data for one epoch of `--steps` steps; the figure is
summary.json's `ms_per_step`: the median step time after `--warmup` steps, with each
step's result materialised. Cells run one after another, never concurrently, so they
do not compete for the cores. Prints a table with the custom/fit ratio per policy and
each policy's speed-up over float32 (> 1 means faster than float32).

Runtime on the 2-core dev machine (AMD EPYC Zen 3, AVX2, no AVX-512): about 4 min for
64 px and 25 min for 256 px (bfloat16 and float16 are emulated there).
"""

import statistics

from absl import app
from absl import flags

import benchlib

benchlib.define_grid_flags()
for _name in benchlib.GRID_FLAGS:
  flags.declare_key_flag(_name)
flags.DEFINE_list("loops", ["fit", "custom"], "")
flags.DEFINE_string("out", "logs/bench_loops", "Logs root for the cells' run folders.")
flags.DEFINE_list("batchnorms", ["keras"], "--batchnorm kinds to measure.")
FLAGS = flags.FLAGS


def run_cell(size: int, policy: str, loop: str, bn: str) -> dict:
  return benchlib.run_cell(
      FLAGS.out, f"{size}px_{policy}_{loop}_{bn}", image_size=size, policy=policy,
      loop=loop, batchnorm=bn, batch_size=FLAGS.batch_size, epochs=1,
      steps_per_epoch=FLAGS.steps, warmup_steps=FLAGS.warmup, synthetic_train=1300,
      synthetic_val=100)


def main(argv):
  del argv
  runs = {}
  for _ in range(FLAGS.repeats):  # Interleaved: every cell once per repeat.
    for size in map(int, FLAGS.image_sizes):
      for policy in FLAGS.policies:
        for loop in FLAGS.loops:
          for bn in FLAGS.batchnorms:
            runs.setdefault((size, policy, loop, bn), []).append(
                run_cell(size, policy, loop, bn)["ms_per_step"])
  for bn in FLAGS.batchnorms:
    results = {k[:3]: statistics.median(v) for k, v in runs.items() if k[3] == bn}
    print(f"\n--batchnorm={bn}", end="")
    table(results)
  if len(FLAGS.batchnorms) > 1:
    first, second = FLAGS.batchnorms[:2]
    print(f"\n{second}/{first} (ms/step ratio, < 1: {second} is faster)")
    print("| px | policy | " + " | ".join(FLAGS.loops) + " |\n|" +
          "---|" * (2 + len(FLAGS.loops)))
    for size in map(int, FLAGS.image_sizes):
      for policy in FLAGS.policies:
        ratios = [statistics.median(runs[size, policy, l, second]) /
                  statistics.median(runs[size, policy, l, first]) for l in FLAGS.loops]
        print(f"| {size} | {policy} | " + " | ".join(f"{r:.2f}" for r in ratios) + " |")


def table(results):
  print(f"\nseed_convnet, batch {FLAGS.batch_size}, median ms/step after "
        f"{FLAGS.warmup} warm-up steps of {FLAGS.steps}")
  header = "| px | policy | " + " | ".join(FLAGS.loops) + " | custom/fit | vs float32 (fit) |"
  print(header + "\n|" + "---|" * (header.count("|") - 1))
  for size in map(int, FLAGS.image_sizes):
    for policy in FLAGS.policies:
      ms = [results[size, policy, loop] for loop in FLAGS.loops]
      ratio = (f"{results[size, policy, 'custom'] / results[size, policy, 'fit']:.2f}"
               if {"fit", "custom"} <= set(FLAGS.loops) else "-")
      base = results.get((size, "float32", FLAGS.loops[0]))
      speedup = f"{base / ms[0]:.2f}x" if base else "-"
      print(f"| {size} | {policy} | " + " | ".join(f"{m:.1f}" for m in ms) +
            f" | {ratio} | {speedup} |")


if __name__ == "__main__":
  app.run(main)
