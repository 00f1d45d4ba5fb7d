"""One training run, start to finish: `train_and_evaluate(cfg)` -> summary dict.

Checks the config, sets the precision policy, loads the data, builds the model and the
optimizer, runs the chosen loop with the shared callbacks, and writes the run folder:
TensorBoard event files, `flags.txt` (a flagfile that replays the run) and
`summary.json`. Ctrl-C ends the run with the events flushed and `summary.json` written
with status `interrupted`.
"""

import os
import pathlib
import platform
import time
from typing import Any

from absl import logging
import keras
import tensorflow as tf

from mpt import config
from mpt import data as data_lib
from mpt import instrument
from mpt import loops
from mpt import models
from mpt import precision
from mpt import rundir


def device_name() -> str:
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    details = tf.config.experimental.get_device_details(gpus[0])
    return f"GPU: {details.get('device_name', gpus[0].name)} (x{len(gpus)})"
  return f"CPU: {precision.cpu_name()} ({os.cpu_count()} logical cores)"


def _summary(cfg: config.Config, run_dir: pathlib.Path, policy, data: data_lib.Data,
             optimizer, timer: instrument.StepTimer, status: str, wall_s: float,
             slow_warning: str | None) -> dict[str, Any]:
  logs = timer.epoch_logs
  ms = timer.median_ms()
  return {
      "status": status,
      "run_dir": str(run_dir),
      "policy": cfg.policy,
      "loop": cfg.loop,
      "model": cfg.model,
      "dataset": cfg.dataset,
      "data_source": data.source,
      "image_size": cfg.image_size,
      "batch_size": cfg.batch_size,
      "epochs": cfg.epochs,
      "epochs_completed": timer.epochs_done,
      "steps_per_epoch": data.steps_per_epoch,
      "steps": timer.steps,
      "ms_per_step": ms,
      "timed_steps": len(timer.steady()),
      "warmup_steps": cfg.warmup_steps,
      "images_per_sec": cfg.batch_size / ms * 1e3 if ms else None,
      "train_loss": logs.get("loss"),
      "train_accuracy": logs.get("accuracy"),
      "val_loss": logs.get("val_loss"),
      "val_accuracy": logs.get("val_accuracy"),
      "loss_scale": precision.loss_scale(optimizer),
      "skipped_steps": precision.skipped_steps(optimizer, timer.steps),
      "compute_dtype": policy.compute_dtype,
      "variable_dtype": policy.variable_dtype,
      "slow_path_warning": slow_warning,
      "jit_compile": cfg.jit_compile,
      "seed": cfg.seed,
      "n_train": data.n_train,
      "n_val": data.n_val,
      "skipped_files": len(data.skipped_files),
      "skipped_file_names": data.skipped_files[:20],
      "tf_version": tf.__version__,
      "keras_version": keras.__version__,
      "python_version": platform.python_version(),
      "device": device_name(),
      "wall_s": round(wall_s, 3),
  }


def train_and_evaluate(cfg: config.Config) -> dict[str, Any]:
  """Runs one training run as `cfg` says; returns what it wrote to summary.json."""
  start = time.perf_counter()
  config.validate(cfg)
  models.get(cfg.model)
  rundir.check_root(cfg)

  keras.backend.clear_session()  # Fresh graph state when runs share a process (tests).
  keras.utils.set_random_seed(cfg.seed)
  policy = precision.set_policy(cfg.policy)
  print(precision.describe(policy), flush=True)
  slow_warning = precision.warn_if_slow(cfg.policy)

  data = data_lib.load(cfg)
  logging.info("data: %s, %d train / %d val images, %d classes, %d skipped files",
               data.source, data.n_train, data.n_val, len(data.class_names),
               len(data.skipped_files))
  run_dir = rundir.create(cfg)
  (run_dir / "flags.txt").write_text(config.to_flagfile(cfg))
  size = cfg.image_size
  model = models.build(cfg.model, (size, size, 3), len(data.class_names),
                       bn_momentum=cfg.bn_momentum)
  optimizer = precision.make_optimizer(cfg.policy, cfg.learning_rate)

  timer = instrument.StepTimer(cfg.warmup_steps)
  writer = instrument.ScalarWriter(str(run_dir), timer, cfg.batch_size, texts={
      "run/flags": "```\n" + config.to_flagfile(cfg) + "```",
      "precision/policy": precision.describe(policy),
  })
  status = "failed"  # Until the loop returns or is interrupted.
  try:
    loops.LOOPS[cfg.loop](model, optimizer, data, cfg, [timer, writer])
    status = "completed"
  except KeyboardInterrupt:
    status = "interrupted"
    print("\nmpt: interrupted; writing summary.json", flush=True)
  finally:
    writer.close()
    summary = _summary(cfg, run_dir, policy, data, optimizer, timer, status,
                       time.perf_counter() - start, slow_warning)
    rundir.write_json(run_dir / "summary.json", summary)

  parts = [f"mpt: {status}: {run_dir}", f"{summary['steps']} steps"]
  if summary["ms_per_step"]:
    parts.append(f"{summary['ms_per_step']:.1f} ms/step")
  if summary["val_accuracy"] is not None:
    parts.append(f"val_accuracy {summary['val_accuracy']:.3f}")
  parts.append(f"wall {summary['wall_s']:.0f} s")
  print(", ".join(parts), flush=True)
  return summary
