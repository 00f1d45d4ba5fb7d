"""What instrumentation costs: ms/step with --instrument vs --noinstrument.

  python experiments/bench_instrument.py            # ~7 min on the 2-core dev machine

Same config for every cell (seed convnet, synthetic data, 64 px, batch 32, float32,
2 epochs of 41 steps of which the first 10 are warm-up, so 72 timed steps), for fit
and custom.
The on/off cells are interleaved (on, off, on, off, ...) over `--repeats` rounds, so a
slow spell of the shared machine hits both alike; the figure per cell is the median of
its rounds' medians, and the paired ratio is the median over rounds of on/off within a
round. The bar is a ratio on/off <= 1.03.
"""

import statistics

from absl import app
from absl import flags

import benchlib

flags.DEFINE_integer("repeats", 3, "Interleaved rounds.")
flags.DEFINE_string("out", "logs/bench_instrument", "Logs root for the cells.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  ms = {}
  shares = []
  for round_ in range(FLAGS.repeats):
    for loop in ("fit", "custom"):
      for instrument in (True, False):
        summary = benchlib.run_cell(
            FLAGS.out, f"r{round_}_{loop}_{'on' if instrument else 'off'}",
            loop=loop, instrument=instrument, image_size=64, batch_size=32, epochs=2,
            warmup_steps=10, synthetic_val=100)
        ms.setdefault((loop, instrument), []).append(summary["ms_per_step"])
        if instrument:
          shares.append(summary["data_wait_share"])
  print("\n| loop | instrument on ms/step | off ms/step | on/off | paired on/off |\n"
        "|---|---|---|---|---|")
  for loop in ("fit", "custom"):
    on, off = (statistics.median(ms[loop, i]) for i in (True, False))
    paired = statistics.median(a / b for a, b in zip(ms[loop, True], ms[loop, False]))
    print(f"| {loop} | {on:.1f} | {off:.1f} | {on / off:.3f} | {paired:.3f} |")
  print(f"\ndata-wait share of step time (instrumented cells): median "
        f"{statistics.median(shares):.2%}, max {max(shares):.2%}")


if __name__ == "__main__":
  app.run(main)
