"""The memory estimate against the measured peak: model x policy x batch, each run in
a fresh `python -m mpt.main` process (in a shared one, memory an earlier run freed
stays resident and hides the next run's growth).

  python experiments/bench_memory.py                       # seed convnet and a ResNet10
  python experiments/bench_memory.py --image_size=64 --batch_sizes=32,256,1024

Each run trains --steps steps on synthetic data without checkpoints; the figures are
its summary.json `memory`: the preflight's estimate for the run's policy, the measured
peak RSS, the baseline (what the process held before the first step).
"""

import json
import pathlib
import subprocess
import sys

from absl import app
from absl import flags

flags.DEFINE_list("models", ["seed_convnet", "resnet"], "")
flags.DEFINE_string("resnet_opts", "depth=10,width=16", "--model_opts for resnet.")
flags.DEFINE_list("policies", ["float32", "mixed_bfloat16"], "")
flags.DEFINE_list("batch_sizes", ["16", "256", "1024"], "")
flags.DEFINE_integer("image_size", 32, "")
flags.DEFINE_integer("steps", 2, "")
flags.DEFINE_string("out", "/tmp/mpt_bench_memory", "")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  print("| model | policy | batch | estimate MB | measured peak MB | baseline MB | "
        "estimate/measured | step part estimate/measured |\n|---|---|---|---|---|---|---|---|")
  for model in FLAGS.models:
    for policy in FLAGS.policies:
      for batch in map(int, FLAGS.batch_sizes):
        name = f"{model}_{policy}_{batch}"
        cmd = [sys.executable, "-m", "mpt.main", f"--model={model}",
               f"--model_opts={FLAGS.resnet_opts if model == 'resnet' else ''}",
               f"--policy={policy}", f"--batch_size={batch}",
               f"--image_size={FLAGS.image_size}", "--epochs=1",
               f"--steps_per_epoch={FLAGS.steps}", "--warmup_steps=0",
               "--synthetic_train=64", "--synthetic_val=16", "--synthetic_px=40",
               "--verbose=0", "--checkpoint=false", f"--logdir={FLAGS.out}",
               f"--run_name={name}"]
        subprocess.run(["rm", "-rf", f"{FLAGS.out}/{name}"])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
          print(f"| {model} | {policy} | {batch} | failed: "
                f"{proc.stderr.strip().splitlines()[-1][:200]} |||||")
          continue
        m = json.loads((pathlib.Path(FLAGS.out) / name / "summary.json").read_text())[
            "memory"]
        est, peak, base = m["estimate"]["total_mb"], m["peak_rss_mb"], \
            m["estimate"]["baseline_mb"]
        print(f"| {model} | {policy} | {batch} | {est:.0f} | {peak:.0f} | {base:.0f} | "
              f"{est / peak:.2f} | {(est - base) / max(peak - base, 1e-9):.2f} |",
              flush=True)


if __name__ == "__main__":
  app.run(main)
