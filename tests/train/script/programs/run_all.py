"""Runs the training programs of this folder one after the other in this process and
writes what each expected of its run folder, and whether it raised, to results.json.

  python tests/train/script/programs/run_all.py OUT_DIR [name ...]

Each program `name` trains into OUT_DIR/name (its mpt run folder) through
`main(run_dir)`, which returns the summary.json figures the program fixed itself
(status, steps, epochs_completed, policy, loop, skipped_steps, loss_scale). Before
each: the float32 policy and a cleared Keras session. A program that raises has its
traceback recorded as "error" and the next one runs. OUT_DIR/results.json:
{name: {"expected": {...} | null, "error": null | "traceback", "seconds": wall}}.
"""

import importlib.util
import json
import os
import pathlib
import sys
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
PROGRAMS = (
    "image_classifier",
    "custom_train_step",
    "loop_from_scratch",
    "loop_scalar_loss",
    "gan_fit",
    "gan_loop",
    "vae",
    "vae_train_step",
    "text_classifier",
    "sequence_model",
    "lstm_classifier",
    "structured_data",
    "multi_io",
    "siamese",
    "mixed_float16_loop",
    "mirrored_fit",
    "steps_per_execution",
    "fine_tune",
    "seq2seq_transformer",
    "diffusion_ema",
    "input_optimisation",
    "unet_segmenter",
    "keras_hub_backbone",
)
# A program that needs a module of an extra (setup.cfg): {program: module}; the test
# runs it where the module is installed, and says so where not.
NEEDS = {"keras_hub_backbone": "keras_hub"}


def load(name: str):
  """The program module `name` of this folder, imported by its path."""
  spec = importlib.util.spec_from_file_location(f"mpt_programs_{name}",
                                                HERE / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def run_one(name: str, out_dir: pathlib.Path) -> dict:
  import keras
  keras.mixed_precision.set_global_policy("float32")
  # Keras' names and graph fresh per program; Python's full collection left to run
  # when it runs (forced, it took longer than a small program).
  keras.backend.clear_session(free_memory=False)
  start = time.perf_counter()
  expected, error = None, None
  try:
    expected = load(name).main(str(out_dir / name))
  except Exception:  # Recorded, and the next program runs.
    error = traceback.format_exc()
  return {"expected": expected, "error": error,
          "seconds": round(time.perf_counter() - start, 3)}


def main(argv: list[str]) -> int:
  if not argv or argv[0].startswith("-"):
    print("usage: python tests/train/script/programs/run_all.py OUT_DIR [name ...]",
          file=sys.stderr)
    return 2
  os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # Before Keras is imported.
  out_dir = pathlib.Path(argv[0]).resolve()
  names = argv[1:] or list(PROGRAMS)
  unknown = [n for n in names if n not in PROGRAMS]
  if unknown:
    print(f"run_all: unknown programs {unknown}; known: {', '.join(PROGRAMS)}",
          file=sys.stderr)
    return 2
  out_dir.mkdir(parents=True, exist_ok=True)
  results = {}
  for name in names:
    results[name] = run_one(name, out_dir)
    outcome = "ok" if results[name]["error"] is None else \
        "error: " + results[name]["error"].strip().splitlines()[-1]
    print(f"run_all: {name}: {results[name]['seconds']:.1f} s, {outcome}", flush=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
