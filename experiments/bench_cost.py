"""Is the cost predicted before step 1 right? Each model's step cost per policy as mpt
measures it before training (mpt/train/before_step1/cost.py), against separate runs per policy.

  python experiments/bench_cost.py                 # seed convnet + 3 keras.applications
  python experiments/bench_cost.py --models=seed_convnet --onednn=off,on

For each model and oneDNN setting: an empty cost cache, then one run per policy
(`python -m mpt.main --loop=custom`, its own process, cells one after another). The
first run measures the cost (and says what measuring took); the others read it from
the cache. --repeats runs every policy again, interleaved; the median is compared. Each row: the predicted slowdown (the cost record's time over float32's),
the measured one (the run's median ms/step over the float32 run's), their ratio
(target: within 1.5x either way), and whether the run warned (target: exactly when
the measured slowdown is >= 2x).
"""

import pathlib
import shutil
import statistics
import sys
import tempfile

from absl import app
from absl import flags

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import benchlib  # noqa: E402

flags.DEFINE_list("models", ["seed_convnet", "keras:MobileNetV2", "keras:ResNet50",
                             "keras:EfficientNetB0"], "Models (--model values).")
flags.DEFINE_list("policies", ["float32", "mixed_bfloat16", "mixed_float16"], "")
flags.DEFINE_list("onednn", ["auto"], "--onednn settings to measure under.")
flags.DEFINE_integer("image_size", 64, "")
flags.DEFINE_integer("batch_size", 32, "")
flags.DEFINE_integer("steps", 25, "Train steps per run, warm-up included.")
flags.DEFINE_integer("repeats", 1, "Interleaved repeats of the runs (the median is "
                     "compared).")
flags.DEFINE_string("out", "", "Run folders go here (default: a temporary folder).")
FLAGS = flags.FLAGS
SLOW = 2.0


def measure(model: str, onednn: str, out: str) -> list[dict]:
  """One run per policy; returns a row per policy."""
  cache = pathlib.Path(out) / f"cache-{model.replace(':', '_')}-{onednn}"
  shutil.rmtree(cache, ignore_errors=True)
  import os
  os.environ["MPT_CACHE"] = str(cache)
  runs, ms = {}, {}
  for repeat in range(FLAGS.repeats):
    for policy in FLAGS.policies:
      summary = benchlib.run_cell(
          out, f"{model.replace(':', '_')}_{onednn}_{policy}_{repeat}", model=model,
          policy=policy, loop="custom", onednn=onednn, image_size=FLAGS.image_size,
          batch_size=FLAGS.batch_size, epochs=1, steps_per_epoch=FLAGS.steps,
          warmup_steps=5)
      runs.setdefault(policy, summary)  # The first: the one that measured the cost.
      ms.setdefault(policy, []).append(summary["ms_per_step"])
  run_ms = {p: statistics.median(v) for p, v in ms.items()}
  cost = runs[FLAGS.policies[0]].get("cost") or {}
  predicted = {p["policy"]: p["ms_per_step"] for p in cost.get("policies", [])}
  base_pred, base_run = predicted.get("float32"), run_ms["float32"]
  rows = []
  for policy, s in runs.items():
    pred = predicted.get(policy) / base_pred if predicted.get(policy) and base_pred else None
    meas = run_ms[policy] / base_run
    onednn = (s.get("onednn_choice") or {}).get("on")  # summary.json schema 5.
    rows.append({"model": model, "policy": policy,
                 "onednn": None if onednn is None else "on" if onednn else "off",
                 "predicted_ms": predicted.get(policy), "run_ms": run_ms[policy],
                 "predicted_x": pred, "measured_x": meas,
                 "error": max(pred / meas, meas / pred) if pred else None,
                 "warned": bool((s.get("policy_verdict") or {}).get("text")),
                 "cost_s": cost.get("seconds"), "batch": cost.get("batch")})
  return rows


def main(argv):
  del argv
  out = FLAGS.out or tempfile.mkdtemp(prefix="mpt-bench-cost-")
  rows = []
  for model in FLAGS.models:
    for onednn in FLAGS.onednn:
      rows += measure(model, onednn, out)
  print("\n| model | oneDNN | policy | predicted ms/step | run ms/step | predicted x "
        "| measured x | error | warned | right | measuring took |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    right = r["warned"] == (r["measured_x"] >= SLOW)
    pred = f"{r['predicted_x']:.2f}" if r["predicted_x"] else "-"
    err = f"{r['error']:.2f}" if r["error"] else "-"
    print(f"| {r['model']} | {r['onednn']} | {r['policy']} | "
          f"{r['predicted_ms'] or 0:.0f} | {r['run_ms']:.0f} | {pred} | "
          f"{r['measured_x']:.2f} | {err} | {'yes' if r['warned'] else 'no'} | "
          f"{'yes' if right else 'NO'} | {r['cost_s']} s at batch {r['batch']} |")
  print(f"\nrun folders: {out}")


if __name__ == "__main__":
  app.run(main)
