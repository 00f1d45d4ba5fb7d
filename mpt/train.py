"""One training run, start to finish: `train_and_evaluate(cfg)` -> summary dict.

Checks the config, sets the precision policy, loads the data, builds the model and the
optimizer, inspects the model's dtypes, runs the chosen loop with the shared callbacks
(timer, TensorBoard writer, profiler window) and a utilisation sampler, and writes the
run folder: event files, `flags.txt` (a flagfile that replays the run), `dtypes.json`
and `summary.json`. Events are flushed and summary.json written however the loop ends:
normally (`completed`), on Ctrl-C (`interrupted`) or on an error (`failed`).
"""

import pathlib
import platform
import time
from typing import Any

from absl import logging
import keras
import tensorflow as tf

from mpt import config
from mpt import data as data_lib
from mpt import hardware
from mpt import inspect
from mpt import instrument
from mpt import loops
from mpt import models
from mpt import precision
from mpt import profiler
from mpt import rundir
from mpt import sampler as sampler_lib


def _summary(cfg: config.Config, run_dir: pathlib.Path, policy, data: data_lib.Data,
             optimizer, timer: instrument.StepTimer, status: str, wall_s: float,
             slow_warning: str | None, report: dict[str, Any] | None,
             util: dict[str, Any] | None, gpu_absent: str | None) -> dict[str, Any]:
  logs, stats = timer.epoch_logs, timer.stats()
  ms = stats["median"]
  flops = inspect.train_step_flops(report, cfg.batch_size) if report else None
  achieved = flops / ms * 1e3 / 1e9 if flops and ms else None
  peak, peak_source = hardware.peak_gflops(policy.compute_dtype)
  return {
      "status": status, "run_dir": str(run_dir),
      "policy": cfg.policy, "loop": cfg.loop, "model": cfg.model,
      "dataset": cfg.dataset, "data_source": data.source,
      "image_size": cfg.image_size, "batch_size": cfg.batch_size,
      "epochs": cfg.epochs, "epochs_completed": timer.epochs_done,
      "steps_per_epoch": data.steps_per_epoch, "steps": timer.steps,
      "ms_per_step": ms, "step_time_ms": stats, "timed_steps": len(timer.steady()),
      "warmup_steps": cfg.warmup_steps,
      "data_wait_share": stats["data_wait_share"] if cfg.instrument else None,
      "images_per_sec": cfg.batch_size / ms * 1e3 if ms else None,
      "train_loss": logs.get("loss"), "train_accuracy": logs.get("accuracy"),
      "val_loss": logs.get("val_loss"), "val_accuracy": logs.get("val_accuracy"),
      "loss_scale": precision.loss_scale(optimizer),
      "skipped_steps": precision.skipped_steps(optimizer, timer.steps),
      "compute_dtype": policy.compute_dtype, "variable_dtype": policy.variable_dtype,
      "slow_path_warning": slow_warning,
      "flops_per_step": flops, "achieved_gflops": achieved,
      "peak_gflops": peak, "peak_source": peak_source,
      "mfu": achieved / peak if achieved and peak else None,
      "flops_share_16bit": report["flops_share_16bit"] if report else None,
      "util": util, "gpu_util_absent": gpu_absent,
      "jit_compile": cfg.jit_compile, "instrument": cfg.instrument, "seed": cfg.seed,
      "n_train": data.n_train, "n_val": data.n_val,
      "skipped_files": len(data.skipped_files),
      "skipped_file_names": data.skipped_files[:20],
      "tf_version": tf.__version__, "keras_version": keras.__version__,
      "python_version": platform.python_version(),
      "device": hardware.device_name(), "wall_s": round(wall_s, 3),
  }


def _hparams(cfg: config.Config) -> dict[str, Any]:
  return {k: getattr(cfg, k) for k in ("policy", "loop", "model", "batch_size",
                                       "image_size", "jit_compile", "dataset")}


def train_and_evaluate(cfg: config.Config) -> dict[str, Any]:
  """Runs one training run as `cfg` says; returns what it wrote to summary.json."""
  start = time.perf_counter()
  config.validate(cfg)
  models.get(cfg.model)
  rundir.check_root(cfg)
  profiler.parse_window(cfg.profile_steps, cfg.warmup_steps, 10**12)  # Syntax, early.

  keras.backend.clear_session()  # Fresh graph state when runs share a process (tests).
  keras.utils.set_random_seed(cfg.seed)
  policy = precision.set_policy(cfg.policy)
  print(precision.describe(policy), flush=True)
  slow_warning = precision.warn_if_slow(cfg.policy)

  data = data_lib.load(cfg)
  logging.info("data: %s, %d train / %d val images, %d classes, %d skipped files",
               data.source, data.n_train, data.n_val, len(data.class_names),
               len(data.skipped_files))
  window = profiler.parse_window(cfg.profile_steps, cfg.warmup_steps,
                                 cfg.epochs * data.steps_per_epoch)
  run_dir = rundir.create(cfg)
  (run_dir / "flags.txt").write_text(config.to_flagfile(cfg))
  size = cfg.image_size
  model = models.build(cfg.model, (size, size, 3), len(data.class_names),
                       bn_momentum=cfg.bn_momentum)
  optimizer = precision.make_optimizer(cfg.policy, cfg.learning_rate)

  report = None
  if cfg.instrument:
    report = inspect.inspect_model(model, seed=cfg.seed)
    rundir.write_json(run_dir / "dtypes.json", report)
    logging.info("per-layer dtypes:\n%s", inspect.format_table(report))
  timer = instrument.StepTimer(cfg.warmup_steps)
  sampler = sampler_lib.Sampler(cfg.sample_every) if cfg.instrument else None
  steps_run = lambda: timer.steps
  writer = instrument.ScalarWriter(
      str(run_dir), timer, cfg.batch_size, every=cfg.log_every,
      detailed=cfg.instrument, sampler=sampler,
      flops_per_step=inspect.train_step_flops(report, cfg.batch_size) if report else None,
      precision_state=lambda: {
          "loss_scale": precision.loss_scale(optimizer) or 1.0,
          "skipped_steps": precision.skipped_steps(optimizer, steps_run())},
      texts={"run/flags": "```\n" + config.to_flagfile(cfg) + "```",
             "precision/policy": precision.describe(policy),
             **({"inspect/dtypes": inspect.format_table(report, markdown=True)}
                if report else {})},
      hparams=_hparams(cfg) if cfg.instrument else None)
  callbacks = [timer, writer]
  window_cb = profiler.ProfileWindow(str(run_dir), *window) if window else None
  if window_cb:
    callbacks.insert(0, window_cb)

  status = "failed"  # Until the loop returns or is interrupted.
  try:
    if sampler:
      sampler.start()
    loops.LOOPS[cfg.loop](model, optimizer, data, cfg, callbacks,
                          fetch=timer.fetch if cfg.instrument else None)
    status = "completed"
  except KeyboardInterrupt:
    status = "interrupted"
    print("\nmpt: interrupted; writing summary.json", flush=True)
  finally:
    if window_cb:
      window_cb.close()
    if sampler:
      sampler.stop()
    summary = _summary(cfg, run_dir, policy, data, optimizer, timer, status,
                       time.perf_counter() - start, slow_warning, report,
                       sampler.stats() if sampler else None,
                       sampler.gpu_absent if sampler else None)
    writer.write_final(summary)
    writer.close()
    rundir.write_json(run_dir / "summary.json", summary)

  parts = [f"mpt: {status}: {run_dir}", f"{summary['steps']} steps"]
  if summary["ms_per_step"]:
    parts.append(f"{summary['ms_per_step']:.1f} ms/step")
  if summary["val_accuracy"] is not None:
    parts.append(f"val_accuracy {summary['val_accuracy']:.3f}")
  parts.append(f"wall {summary['wall_s']:.0f} s")
  print(", ".join(parts), flush=True)
  return summary


def inspect_only(cfg: config.Config) -> dict[str, Any]:
  """`--mode=inspect`: the dtype report of `cfg.model` under `cfg.policy`, no training.

  The model gets 10 classes (Imagenette's) and `--image_size` inputs; the report is
  printed and written to a run folder as dtypes.json and a TensorBoard text summary.
  """
  config.validate(cfg)
  models.get(cfg.model)
  rundir.check_root(cfg)
  keras.backend.clear_session()
  keras.utils.set_random_seed(cfg.seed)
  policy = precision.set_policy(cfg.policy)
  print(precision.describe(policy))
  size = cfg.image_size
  model = models.build(cfg.model, (size, size, 3), 10, bn_momentum=cfg.bn_momentum)
  report = inspect.inspect_model(model, seed=cfg.seed)
  print(inspect.format_table(report))
  run_dir = rundir.create(cfg)
  rundir.write_json(run_dir / "dtypes.json", report)
  with tf.summary.create_file_writer(str(run_dir)).as_default(step=0):
    tf.summary.text("inspect/dtypes", inspect.format_table(report, markdown=True))
  print(f"mpt: wrote {run_dir / 'dtypes.json'}")
  return {"status": "completed", "run_dir": str(run_dir), **report}


MODES = {"train": train_and_evaluate, "inspect": inspect_only}
