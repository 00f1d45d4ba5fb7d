"""A script's answer against what the script measures: each model trained from a plain
script under float32 and under mixed_bfloat16 (each run its own child process, the
runs interleaved), through `model.fit(..., callbacks=mpt.callbacks(...))` and through
a tf.function loop under `mpt.track`. Each run times its own step per policy after
step 1 (mpt/train/before_step1/scriptcost.py); this script sets the predicted mixed_bfloat16 /
float32 ratio beside the ratio the two runs measured (mpt's own ms/step: the median
after warm-up), and says what each run's first finding advised.

  python experiments/script_cost.py [--models=mnv2,effb0,encoder] [--apis=fit,track]
                                    [--steps=24] [--repeats=1] [--out=/tmp/script_cost]

Models as a user would write them: keras.applications MobileNetV2 at 96 px and
EfficientNetB0 at 64 px (random weights), and a two-block Transformer encoder on
tokens; batch 16, random data. The cache ($MPT_CACHE) is fresh per invocation, so
each model's first run pays the measurement (said as `measured in`), its second
reads it (`cache`).
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

MODELS = ("mnv2", "effb0", "encoder")
POLICIES = ("float32", "mixed_bfloat16")
BATCH = 16


def build(name: str):
  import keras  # pylint: disable=import-outside-toplevel
  if name == "mnv2":
    return keras.applications.MobileNetV2(input_shape=(96, 96, 3), weights=None,
                                          classes=10), (96, 96, 3)
  if name == "effb0":
    return keras.applications.EfficientNetB0(input_shape=(64, 64, 3), weights=None,
                                             classes=10), (64, 64, 3)
  return encoder(), (128,)


def encoder(vocab: int = 8000, length: int = 128, width: int = 128):
  """Two Transformer encoder blocks on tokens (the keras.io text classifier's shape)."""
  import keras  # pylint: disable=import-outside-toplevel
  tokens = keras.Input((length,), dtype="int32")
  x = keras.layers.Embedding(vocab, width)(tokens)
  for _ in range(2):
    attended = keras.layers.MultiHeadAttention(4, width // 4)(x, x)
    x = keras.layers.LayerNormalization()(x + attended)
    ffn = keras.layers.Dense(width)(keras.layers.Dense(2 * width, activation="relu")(x))
    x = keras.layers.LayerNormalization()(x + ffn)
  x = keras.layers.GlobalAveragePooling1D()(x)
  outputs = keras.layers.Dense(2, activation="softmax", dtype="float32")(x)
  return keras.Model(tokens, outputs, name="encoder")


def child(name: str, policy: str, api: str, steps: int, run_dir: str) -> None:
  import keras  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  import mpt  # pylint: disable=import-outside-toplevel
  keras.mixed_precision.set_global_policy(policy)
  model, shape = build(name)
  rng = np.random.default_rng(0)
  classes = 2 if name == "encoder" else 10
  x = (rng.integers(0, 8000, (BATCH * 4,) + shape).astype("int32") if name == "encoder"
       else rng.random((BATCH * 4,) + shape, dtype=np.float32))
  y = rng.integers(0, classes, (BATCH * 4,))
  data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)
  if api == "fit":
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(data, epochs=1, steps_per_epoch=steps,
              callbacks=mpt.callbacks(run_dir, batch_size=BATCH), verbose=0)
    return
  opt = keras.optimizers.Adam()
  loss_fn = keras.losses.SparseCategoricalCrossentropy()

  @tf.function
  def train_step(images, labels):
    with tf.GradientTape() as tape:
      loss = loss_fn(labels, model(images, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply(grads, model.trainable_variables)
    return loss

  run = mpt.track(run_dir, model, batch_size=BATCH, optimizer=opt)
  step = run.step(train_step)
  with run:
    for images, labels in run.batches(data.take(steps)):
      step(images, labels)


def first_finding(run_dir: pathlib.Path) -> str:
  text = (run_dir / "diagnosis.md").read_text() if (run_dir / "diagnosis.md").exists() \
      else ""
  return next((l.strip("# ") for l in text.splitlines() if l.startswith("## 1.")), "-")


def one(name: str, policy: str, api: str, args, env) -> dict:
  run_dir = pathlib.Path(args.out) / f"{name}_{api}_{policy}_{len(os.listdir(args.out))}"
  done = subprocess.run([sys.executable, __file__, "--child", name, policy, api,
                         str(args.steps), str(run_dir)], env=env, capture_output=True,
                        text=True, check=False)
  if done.returncode:
    print(done.stderr[-3000:], file=sys.stderr)
    raise SystemExit(f"{name} {policy} {api}: exit {done.returncode}")
  s = json.loads((run_dir / "summary.json").read_text())
  cost = s.get("cost") or {}
  ms = {p["policy"]: p["ms_per_step"] for p in cost.get("policies", [])}
  return {"ms": s["ms_per_step"], "predicted": ms, "seconds": cost.get("seconds"),
          "source": cost.get("source"), "first": first_finding(run_dir),
          "wall": s["wall_s"]}


def main() -> None:
  if sys.argv[1:2] == ["--child"]:
    child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
    return
  parser = argparse.ArgumentParser()
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--apis", default="fit,track")
  parser.add_argument("--steps", type=int, default=24)
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--out", default=tempfile.mkdtemp(prefix="script_cost-"))
  args = parser.parse_args()
  pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
  env = {**os.environ, "MPT_CACHE": tempfile.mkdtemp(prefix="mpt-cache-"),
         "TF_CPP_MIN_LOG_LEVEL": "2"}
  print("| model | api | measured bf16/f32 | predicted (f32 run) | predicted (bf16 run) "
        "| off by | measuring s | first finding (f32 run) | first finding (bf16 run) |")
  print("|---|---|---|---|---|---|---|---|---|")
  for name in args.models.split(","):
    for api in args.apis.split(","):
      runs = {p: [] for p in POLICIES}
      for _ in range(args.repeats):
        for policy in POLICIES:  # Interleaved.
          runs[policy].append(one(name, policy, api, args, env))
      measured = (statistics.median(r["ms"] for r in runs["mixed_bfloat16"]) /
                  statistics.median(r["ms"] for r in runs["float32"]))
      preds = [r["predicted"]["mixed_bfloat16"] / r["predicted"]["float32"]
               if r["predicted"].get("float32") and r["predicted"].get("mixed_bfloat16")
               else None  # Not timed: the run's share of its training was spent.
               for r in (runs["float32"][0], runs["mixed_bfloat16"][0])]
      off = max((max(p, measured) / min(p, measured) for p in preds if p), default=None)
      seconds = runs["float32"][0]["seconds"]
      print(f"| {name} | {api} | {measured:.2f} | {preds[0] or 0:.2f} | {preds[1] or 0:.2f}"
            f" | {off or 0:.2f}x | {seconds} | {runs['float32'][0]['first']} | "
            f"{runs['mixed_bfloat16'][0]['first']} |", flush=True)


if __name__ == "__main__":
  main()
