"""What --numerics costs: a 200-step default-sized run with its numerics sampled beside
the same run without them.

  python experiments/bench_numerics.py                     # ~10 min on a 2-core Zen 3

The seed convnet at its defaults (64 px, batch 32), --steps_per_epoch=50 x 4 epochs =
200 steps, for each policy given: `--numerics=on` (what `auto` does in a 16-bit run,
and what a float32 run does when asked) against `--numerics=off`, interleaved (on,
off, on, off, ...) over `--repeats` rounds. The figures: the run's wall time
(summary.json `wall_s`, start to end, everything before step 1 included), the time
its samples took (numerics.json `seconds`), their share of the wall time, and the
paired wall-time ratio on/off. The bar (the issue's): the samples under 10% of a
200-step run.
"""

import json
import pathlib
import statistics

from absl import app
from absl import flags

import benchlib

flags.DEFINE_list("policies", ["float32", "mixed_float16"], "Policies measured.")
flags.DEFINE_integer("repeats", 2, "Interleaved rounds.")
flags.DEFINE_string("out", "logs/bench_numerics", "Logs root for the cells.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  wall, sampled = {}, {}
  for round_ in range(FLAGS.repeats):
    for policy in FLAGS.policies:
      for numerics in ("on", "off"):
        name = f"r{round_}_{policy}_{numerics}"
        summary = benchlib.run_cell(FLAGS.out, name, policy=policy, numerics=numerics,
                                    epochs=4, steps_per_epoch=50)
        wall.setdefault((policy, numerics), []).append(summary["wall_s"])
        if numerics == "on":
          found = json.loads((pathlib.Path(summary["run_dir"]) /
                              "numerics.json").read_text())
          sampled.setdefault(policy, []).append(found["seconds"])
  print("\n| policy | wall s, numerics on | off | samples s | samples / wall | "
        "paired wall on/off |\n|---|---|---|---|---|---|")
  for policy in FLAGS.policies:
    on, off = wall[policy, "on"], wall[policy, "off"]
    seconds = statistics.median(sampled[policy])
    paired = statistics.median(a / b for a, b in zip(on, off))
    print(f"| {policy} | {statistics.median(on):.1f} | {statistics.median(off):.1f} | "
          f"{seconds:.2f} | {seconds / statistics.median(on):.1%} | {paired:.3f} |")


if __name__ == "__main__":
  app.run(main)
