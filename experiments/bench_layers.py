"""Per-layer cost against the whole step: do the layers' forward and backward times
(mpt/measure/layercost.py) add up to the step mpt times before step 1
(mpt/train/before_step1/cost.py), and is the per-layer plan they predict fastest measured faster?

  python experiments/bench_layers.py                      # the four models below
  python experiments/bench_layers.py --models=keras:MobileNetV2:96:16 --steps=10

Each model (`NAME:IMAGE_SIZE:BATCH`) in a child process of its own, with an empty
cache: the kernel table (read from this machine's cache, or probed), the per-layer
costs under the three policies, the plan `best_plan` predicts fastest, then one
measurement of the whole step that times the uniform policies and the plan side by
side, interleaved (a policy the kernel table marks pathological is predicted from it,
as a run does), with --steps timed steps each. Prints per model: the step and the
per-layer sum per policy and their gap, the slower layer classes under each 16-bit
policy, the plan, and its measured step against the best uniform policy.
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

flags.DEFINE_list("models", ["seed_convnet:64:32", "keras:MobileNetV2:96:16",
                             "keras:EfficientNetB0:64:16", "keras:ResNet50:64:16"],
                  "NAME:IMAGE_SIZE:BATCH per model.")
flags.DEFINE_integer("steps", 8, "Timed steps per candidate of the whole step.")
flags.DEFINE_list("plans", [], "More plans to time beside the rest, each "
                  "POLICY/LAYER_POLICY (e.g. mixed_bfloat16/DepthwiseConv2D=float32; "
                  "`;` between a plan's patterns).")
flags.DEFINE_string("one", "", "Internal: measure this one model and print JSON.")
FLAGS = flags.FLAGS


def _one(spec: str) -> dict:
  import keras
  from mpt import config
  from mpt.machine import hardware, kernels
  from mpt.records import layers as records
  from mpt.train.before_step1 import cost, layers
  from mpt.train.common import model as model_lib

  name, size, batch = spec.rsplit(":", 2)
  cfg = config.Config(model=name, image_size=int(size), batch_size=int(batch))
  table, _ = kernels.table()
  keras.mixed_precision.set_global_policy("float32")
  found = layers.measure(cfg, model_lib.build_model(cfg, 10))
  plan = records.best_plan(found)
  cost.TIMED_STEPS = FLAGS.steps
  plans = ((plan.policy, plan.layer_policy()),) if plan and plan.by_class else ()
  asked = tuple(tuple(p.replace(";", ",").split("/", 1)) for p in FLAGS.plans)
  plans += asked
  step = cost.measure(cfg, lambda: model_lib.build_model(cfg, 10),
                      list(config.POLICY_DTYPE), plans=plans, table=lambda families: table)
  rows = {}
  for p in config.POLICY_DTYPE:
    summed, timed = found.predict(p), step.of(p)
    rows[p] = {"step_ms": timed.ms_per_step, "predicted": timed.predicted,
               "layers_ms": summed["total"] if summed else None,
               "slower": records.describe_slow(found, p) if p != "float32" else None}
  plan_row = step.of(*plans[0]) if plans and plans[0] not in asked else None
  extra = {f"{p}/{lp}": {"step_ms": step.of(p, lp).ms_per_step,
                         "layers_ms": (found.predict(p, _by_class(lp)) or {}).get("total")}
           for p, lp in asked}
  return {"model": spec, "cpu": hardware.cpu_name(), "rows": rows,
          "layer_seconds": found.seconds, "plan": plan.layer_policy() if plan else None,
          "plan_policy": plan.policy if plan else None,
          "plan_predicted_ms": plan.predicted_ms if plan else None,
          "plan_step_ms": plan_row.ms_per_step if plan_row else None, "asked": extra}


def _by_class(layer_policy: str) -> dict[str, str]:
  """A plan of class patterns as the record prices it ({class: policy})."""
  return dict(item.split("=", 1) for item in layer_policy.split(",") if item)


def _report(r: dict) -> None:
  print(f"\n{r['model']} on {r['cpu']} (per layer measured in {r['layer_seconds']} s)")
  print("| policy | step ms | per-layer sum ms | gap | slower layer classes |")
  print("|---|---|---|---|---|")
  timed = {p: v["step_ms"] for p, v in r["rows"].items()
           if v["step_ms"] and not v["predicted"]}
  for p, v in r["rows"].items():
    gap = (f"{v['layers_ms'] / v['step_ms'] - 1:+.0%}" if v["step_ms"] and v["layers_ms"]
           else "-")
    step = f"{v['step_ms']:,.1f}" + (" (predicted)" if v["predicted"] else "")
    layers = f"{v['layers_ms']:,.1f}" if v["layers_ms"] else "-"
    print(f"| {p} | {step} | {layers} | {gap} | {v['slower'] or ''} |")
  best = min(timed, key=timed.get)
  print(f"best uniform: {best} {timed[best]:,.1f} ms")
  if r["plan_step_ms"]:
    print(f"plan: --policy={r['plan_policy']} --layer_policy={r['plan']}: predicted "
          f"{r['plan_predicted_ms']:,.1f}, measured {r['plan_step_ms']:,.1f} ms "
          f"({r['plan_step_ms'] / timed[best] - 1:+.1%} against {best})")
  else:
    print(f"plan: none predicted faster than --policy={r['plan_policy']}")
  for name, v in r.get("asked", {}).items():
    summed = f"{v['layers_ms']:,.1f}" if v["layers_ms"] else "-"
    print(f"asked: {name}: measured {v['step_ms']:,.1f} ms ({v['step_ms'] / timed[best] - 1:+.1%} "
          f"against {best}), per-layer sum {summed}")


def main(argv) -> None:
  del argv
  if FLAGS.one:
    print("RESULT " + json.dumps(_one(FLAGS.one)), flush=True)
    return
  # This machine's kernel table (cached, or probed once), for every model.
  table = pathlib.Path(tempfile.mkdtemp(prefix="mpt-bench-layers-")) / "kernels.json"
  subprocess.run([sys.executable, "-c", "import json, sys; from mpt.machine import "
                  "kernels; json.dump(kernels.table()[0], open(sys.argv[1], 'w'))",
                  str(table)], check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
  for spec in FLAGS.models:
    with tempfile.TemporaryDirectory(prefix="mpt-bench-layers-") as cache:
      env = {**os.environ, "MPT_CACHE": cache, "TF_CPP_MIN_LOG_LEVEL": "2",
             "MPT_KERNELS": os.environ.get("MPT_KERNELS", str(table))}
      proc = subprocess.run([sys.executable, __file__, f"--one={spec}",
                             f"--steps={FLAGS.steps}", f"--plans={','.join(FLAGS.plans)}"],
                            env=env, text=True, capture_output=True)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if not lines:
      print(f"\n{spec}: failed\n{proc.stderr[-2000:]}")
      continue
    _report(json.loads(lines[0][len("RESULT "):]))


if __name__ == "__main__":
  app.run(main)
