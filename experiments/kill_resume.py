"""Random kills against resume: one deterministic run uninterrupted, then the same run
killed with SIGKILL at a random moment (a random delay after its first checkpoint is
on disk) and resumed, --trials times; prints, per trial, the step it resumed at and
whether weights, optimizer state and summary.json's figures (timings aside) equal the
uninterrupted run's.

  python experiments/kill_resume.py --trials=6 --loop=custom
"""

import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

flags.DEFINE_integer("trials", 6, "Killed-and-resumed runs.")
flags.DEFINE_enum("loop", "custom", ["custom", "fit"], "")
flags.DEFINE_integer("seed", 0, "Seed of the random kill delays.")
flags.DEFINE_string("out", "/tmp/mpt_kill_resume", "")
FLAGS = flags.FLAGS
RUN = ["--deterministic", "--image_size=32", "--batch_size=16", "--epochs=4",
       "--steps_per_epoch=15", "--checkpoint_every=4", "--synthetic_train=240",
       "--synthetic_val=32", "--verbose=0"]
TIMINGS = {"run_dir", "resumed", "checkpoint", "wall_s", "train_s", "ms_per_step",
           "step_time_ms", "images_per_sec", "timed_steps", "data_wait_share",
           "achieved_gflops", "mfu", "achieved_vs_microbench", "util", "checkpoint_ms",
           "memory", "message"}


def variables(run: pathlib.Path) -> dict[str, np.ndarray]:
  reader = tf.train.load_checkpoint(str(run / "checkpoints"))
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if n.startswith(("model/", "optimizer/"))}


def main(argv):
  del argv
  out = pathlib.Path(FLAGS.out)
  shutil.rmtree(out, ignore_errors=True)
  common = [sys.executable, "-m", "mpt.main", *RUN, f"--loop={FLAGS.loop}",
            f"--data_dir={out}/data", f"--logdir={out}/logs"]
  subprocess.run(common + ["--run_name=full"], check=True, capture_output=True)
  full = out / "logs" / "full"
  want, want_vars = json.loads((full / "summary.json").read_text()), variables(full)
  rng = random.Random(FLAGS.seed)
  print("| trial | killed after | resumed at step | weights and slots | summary figures "
        "differing |\n|---|---|---|---|---|")
  for trial in range(FLAGS.trials):
    run = out / "logs" / f"k{trial}"
    proc = subprocess.Popen(common + [f"--run_name=k{trial}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    while not list((run / "checkpoints").glob("ckpt-*.index")) and proc.poll() is None:
      time.sleep(0.05)
    delay = rng.uniform(0, 1.5)
    time.sleep(delay)
    try:  # The watching parent and its training child: their own process group.
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    proc.wait()
    resumed = subprocess.run([sys.executable, "-m", "mpt.main", f"--resume={run}",
                              "--verbose=0"], capture_output=True, text=True)
    at = next((l.rsplit(" ", 1)[1] for l in resumed.stdout.splitlines()
               if "resuming" in l), "(finished before the kill)")
    got, got_vars = json.loads((run / "summary.json").read_text()), variables(run)
    same_vars = all(np.array_equal(want_vars[k], got_vars[k]) for k in want_vars)
    differ = sorted(k for k in want.keys() - TIMINGS if got.get(k) != want[k])
    print(f"| {trial} | first checkpoint + {delay:.2f} s | {at} | "
          f"{'bitwise equal' if same_vars else 'DIFFERENT'} | {', '.join(differ) or 'none'} |",
          flush=True)


if __name__ == "__main__":
  app.run(main)
