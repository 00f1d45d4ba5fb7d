"""One training run, start to finish: `train_and_evaluate(cfg)` -> summary dict.

Checks the config, creates the tf.distribute strategy (mpt/distribute.py), sets the
precision policy, loads the data, builds the model and the optimizer under the
strategy's scope (restored from the latest checkpoint with `--resume`), inspects the
model's dtypes, runs the chosen loop with the shared callbacks and a utilisation
sampler, and writes the run folder: event files, `flags.txt` (a flagfile that replays the run),
`dtypes.json`, `checkpoints/` and `summary.json` (the chief alone, under multi_worker).

However the loop ends, events are flushed and summary.json is written, with status
`completed`; `interrupted` (Ctrl-C or SIGTERM: a checkpoint is saved first, exit 130);
`diverged` (NaN/Inf loss or a collapsed loss scale: the last good checkpoint is left
as it was, exit 3); or `failed` (a bug: the traceback follows).
"""

import dataclasses
import pathlib
import platform
import shutil
import tempfile
import time
from typing import Any

from absl import logging
import keras
import tensorflow as tf

from mpt import checkpoint
from mpt import config
from mpt import data as data_lib
from mpt import diagnose
from mpt import distribute
from mpt import faults
from mpt import hardware
from mpt import injection
from mpt import inspect
from mpt import instrument
from mpt import loops
from mpt import microbench
from mpt.microbench import report as microbench_report
from mpt import models
from mpt import precision
from mpt import profiler
from mpt import rundir
from mpt import sampler as sampler_lib
from mpt import steps as steps_lib
from mpt import sweep
from mpt.errors import UserError


def _summary(cfg: config.Config, run_dir: pathlib.Path, policy, data: data_lib.Data,
             optimizer, timer: instrument.StepTimer, status: str, wall_s: float,
             slow_warning: str | None, report: dict[str, Any] | None,
             sampler: sampler_lib.Sampler | None,
             ckpt: checkpoint.Checkpointer, dist: distribute.Setup) -> dict[str, Any]:
  logs, stats = timer.epoch_logs, timer.stats()
  ms = stats["median"]
  flops = inspect.train_step_flops(report, cfg.batch_size) if report else None
  achieved = flops / ms * 1e3 / 1e9 if flops and ms else None
  peak, peak_source = hardware.peak_gflops(policy.compute_dtype)
  # The best matmul rate `--mode=microbench` measured here, per dtype (None: not run).
  by_dtype = {d: microbench_report.cached_gflops(d)[0]
              for d in ("float32", "bfloat16", "float16")}
  measured = by_dtype.get(policy.compute_dtype)
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
      "microbench_gflops": measured, "microbench_gflops_by_dtype": by_dtype,
      "achieved_vs_microbench": achieved / measured if achieved and measured else None,
      "flops_share_16bit": report["flops_share_16bit"] if report else None,
      "util": sampler.stats() if sampler else None,
      "gpu_util_absent": sampler.gpu_absent if sampler else None,
      "checkpoint": ckpt.latest,
      "checkpoint_ms": ({"median": sorted(ckpt.save_ms)[len(ckpt.save_ms) // 2],
                         "total": sum(ckpt.save_ms), "saves": len(ckpt.save_ms)}
                        if ckpt.save_ms else None),
      "train_s": sum(timer.durations_ms) / 1e3,
      "jit_compile": cfg.jit_compile, "instrument": cfg.instrument, "seed": cfg.seed,
      "deterministic": cfg.deterministic, "resumed": bool(cfg.resume),
      "n_train": data.n_train, "n_val": data.n_val,
      "skipped_files": len(data.skipped_files),
      "skipped_file_names": data.skipped_files[:20],
      "tf_version": tf.__version__, "keras_version": keras.__version__,
      "python_version": platform.python_version(),
      "device": hardware.device_name(), "hardware": hardware.facts(),
      "model_opts": cfg.model_opts, "input_work": cfg.input_work,
      "wall_s": round(wall_s, 3),
      **dist.summary(cfg.batch_size),
  }


def resume_config(cfg: config.Config) -> config.Config:
  """The config a run folder was started with, to continue it (`--resume`)."""
  flags_txt = pathlib.Path(cfg.resume).expanduser() / "flags.txt"
  if not flags_txt.is_file():
    raise UserError(f"--resume={cfg.resume!r} is not a run folder (no flags.txt)")
  saved = config.from_flagfile(flags_txt.read_text())
  return dataclasses.replace(saved, resume=cfg.resume, verbose=cfg.verbose)


def _prepare(cfg: config.Config):
  """Everything before the first step; UserError before any work where possible."""
  config.validate(cfg)
  injection.injected_faults()  # A malformed MPT_INJECT_FAULT is bad input, said now.
  # First: devices and collectives can only be set up before TF's runtime starts.
  dist = distribute.setup(cfg)
  distribute.check_batch(cfg, dist)
  models.parse_opts(cfg.model, cfg.model_opts)  # Checks the name and the options.
  if dist.is_chief:
    rundir.check_root(cfg)
  profiler.parse_window(cfg.profile_steps, cfg.warmup_steps, 10**12)  # Syntax, early.
  fault_window = config.parse_steps(cfg.fault_steps, "fault_steps")
  keras.backend.clear_session()  # Fresh graph state when runs share a process (tests).
  keras.utils.set_random_seed(cfg.seed)
  if cfg.deterministic:
    tf.config.experimental.enable_op_determinism()
  tf.config.experimental.enable_tensor_float_32_execution(cfg.tf32)
  policy = precision.set_policy(cfg.policy)
  print(precision.describe(policy), flush=True)
  print(f"mpt: {dist.describe()}", flush=True)
  slow_warning = precision.warn_if_slow(cfg.policy)
  data = data_lib.load(cfg)
  logging.info("data: %s, %d train / %d val images, %d classes, %d skipped files",
               data.source, data.n_train, data.n_val, len(data.class_names),
               len(data.skipped_files))
  window = profiler.parse_window(cfg.profile_steps, cfg.warmup_steps,
                                 cfg.epochs * data.steps_per_epoch)
  return policy, slow_warning, data, window, fault_window, dist


def train_and_evaluate(cfg: config.Config) -> dict[str, Any]:
  """Runs one training run as `cfg` says; returns what it wrote to summary.json."""
  start = time.perf_counter()
  if cfg.resume:
    cfg = resume_config(cfg)
  policy, slow_warning, data, window, fault_window, dist = _prepare(cfg)
  if cfg.resume:
    run_dir = pathlib.Path(cfg.resume).expanduser()
  elif dist.is_chief:
    run_dir = rundir.create(cfg)
    (run_dir / "flags.txt").write_text(config.to_flagfile(cfg))
  # Only the chief writes the run folder; another worker writes into a scratch folder
  # deleted at its end (it must still take part in every checkpoint save).
  out_dir = run_dir if dist.is_chief else pathlib.Path(
      tempfile.mkdtemp(prefix=f"mpt-{dist.task.replace(':', '')}-"))
  if not dist.is_chief:
    run_dir = run_dir if cfg.resume else out_dir
    cfg = dataclasses.replace(cfg, verbose=0, profile_steps="")
    window = None
    print(f"mpt: {dist.task} is not the chief: the chief writes the run folder",
          flush=True)
  size = cfg.image_size
  with dist.strategy.scope():  # Variables become mirrored (or stay local: default).
    model = models.build(cfg.model, (size, size, 3), len(data.class_names),
                         run_options={"bn_momentum": cfg.bn_momentum,
                                      "bn_synchronized": cfg.sync_batchnorm and
                                      dist.replicas > 1},
                         **models.parse_opts(cfg.model, cfg.model_opts))
    optimizer = precision.make_optimizer(cfg.policy, cfg.learning_rate, cfg.loss_scale)
    optimizer.build(model.trainable_variables)  # Its slots must exist to be restored.
  ckpt = checkpoint.Checkpointer(run_dir, model, optimizer, cfg.keep_checkpoints,
                                 write_dir=out_dir)
  start_step, prior = 0, {}
  if cfg.resume:
    start_step, _, prior = ckpt.restore()
    if dist.is_chief:
      checkpoint.prune_events(run_dir, start_step)
    print(f"mpt: resuming {run_dir} at step {start_step}", flush=True)
  prior_wall = prior.get("wall_s", 0.0)

  report = None
  if cfg.instrument:
    with dist.strategy.scope():
      report = inspect.inspect_model(model, seed=cfg.seed)
    rundir.write_json(out_dir / "dtypes.json", report)
    logging.info("per-layer dtypes:\n%s", inspect.format_table(report))
  timer = instrument.StepTimer(cfg.warmup_steps, prior.get("timer"))
  sampler = sampler_lib.Sampler(cfg.sample_every) \
      if cfg.instrument and dist.is_chief else None
  writer = instrument.ScalarWriter(
      str(out_dir), timer, cfg.batch_size, every=cfg.log_every,
      detailed=cfg.instrument, sampler=sampler,
      flops_per_step=inspect.train_step_flops(report, cfg.batch_size) if report else None,
      precision_state=lambda: {
          "loss_scale": precision.loss_scale(optimizer) or 1.0,
          "skipped_steps": precision.skipped_steps(optimizer, timer.steps)},
      texts={"run/flags": "```\n" + config.to_flagfile(cfg) + "```",
             "precision/policy": precision.describe(policy),
             "run/strategy": dist.describe(),
             **({"inspect/dtypes": inspect.format_table(report, markdown=True)}
                if report else {})},
      hparams=_hparams(cfg) if cfg.instrument and not cfg.resume else None)
  state = lambda: {"timer": timer.state(),
                   "wall_s": prior_wall + time.perf_counter() - start}
  ckpt_cb = checkpoint.CheckpointCallback(ckpt, cfg.checkpoint_every,
                                          data.steps_per_epoch, start_step, state)
  stop = faults.SignalStop()
  # Order matters at a step's end: the timer counts the step, the guard may stop a
  # diverged run before the checkpoint is written, a signal stops after it.
  callbacks = [timer, writer,
               faults.DivergenceGuard(start_step, lambda: precision.loss_scale(optimizer)
                                      if cfg.loss_scale == "dynamic" else None,
                                      cfg.min_loss_scale),
               ckpt_cb, stop]
  factor = None
  if fault_window:
    factor = tf.Variable(1.0, trainable=False, dtype=tf.float32)
    callbacks.insert(0, faults.FaultInjector(factor, cfg.fault_factor, fault_window,
                                             start_step))
  window_cb = profiler.ProfileWindow(str(run_dir), *window, first_step=start_step) \
      if window else None
  if window_cb:
    callbacks.insert(0, window_cb)

  status, message = "failed", None  # Until the loop returns or is stopped.
  try:
    stop.install()
    injection.inject_run_fault(cfg.batch_size, cfg.policy)
    if sampler:
      sampler.start()
    with dist.strategy.scope():
      loops.LOOPS[cfg.loop](model, optimizer, data, cfg, callbacks,
                            fetch=timer.fetch if cfg.instrument else None,
                            loss=steps_lib.make_loss(factor),  # with the fault factor
                            start_step=start_step)
    ckpt_cb.save()
    status = "completed"
  except (KeyboardInterrupt, faults.Interrupted):
    status = "interrupted"
    saved = ckpt_cb.save() or ckpt.latest
    message = f"mpt: interrupted at step {timer.steps}; checkpoint {saved}"
  except faults.Diverged as e:
    status = "diverged"
    message = (f"mpt: {e}; last good checkpoint: {ckpt.latest or 'none'} "
               f"(resume with --resume={run_dir})")
  finally:
    stop.uninstall()
    if window_cb:
      window_cb.close()
    if sampler:
      sampler.stop()
    summary = _summary(cfg, run_dir, policy, data, optimizer, timer, status,
                       prior_wall + time.perf_counter() - start, slow_warning, report,
                       sampler, ckpt, dist)
    if message:
      summary["message"] = message
    writer.write_final(summary)
    rundir.write_json(out_dir / "summary.json", summary)
    if message:
      print(message, flush=True)
    if dist.is_chief and status != "failed":  # A failure's traceback says enough.
      diagnosis = diagnose.after_run(run_dir)
      if diagnosis:
        writer.text("diagnosis/report", diagnose.format_report(diagnosis, markdown=True))
    writer.close()
    if not dist.is_chief:
      shutil.rmtree(out_dir, ignore_errors=True)
      summary["run_dir"] = None

  where = run_dir if dist.is_chief else f"{dist.task} (the chief wrote the outputs)"
  parts = [f"mpt: {status}: {where}", f"{summary['steps']} steps"]
  if summary["ms_per_step"]:
    parts.append(f"{summary['ms_per_step']:.1f} ms/step")
  if summary["val_accuracy"] is not None:
    parts.append(f"val_accuracy {summary['val_accuracy']:.3f}")
  parts.append(f"wall {summary['wall_s']:.0f} s")
  print(", ".join(parts), flush=True)
  return summary


def _hparams(cfg: config.Config) -> dict[str, Any]:
  return {k: getattr(cfg, k) for k in ("policy", "loop", "model", "batch_size",
                                       "image_size", "jit_compile", "dataset", "strategy",
                                       "model_opts")}


MODES = {"train": train_and_evaluate, "inspect": inspect.run,
         "microbench": microbench.run, "sweep": sweep.run, "diagnose": diagnose.run}
