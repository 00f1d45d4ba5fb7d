"""A training run's summary.json, from what the run measured: `build(run, ...)` ->
RunSummary.

The record's type and file belong to mpt/records/summary.py; this module only knows
where each figure of a training run comes from: the config, the data, the timer, the
optimizer's precision state, the FLOP counts of the dtype inspection, the machine's
peak and measured rates, the sampler, the checkpoints and the strategy. `figures` and
`software` are the rules a user's own `model.fit` is summarised by too
(mpt/train/library.py).
"""

import dataclasses
import platform
from typing import Any

import keras
import tensorflow as tf

from mpt.machine import hardware
from mpt.machine import rates
from mpt.measure import instrument
from mpt.measure import memory
from mpt.records.memory import MemoryPlan
from mpt.records import summary as summary_lib
from mpt.records.summary import RunSummary
from mpt.train import precision
from mpt.train.prepare import Run


def _memory(plan: MemoryPlan | None) -> MemoryPlan | None:
  """The preflight's plan beside the measured peak: the process's RSS high-water
  mark on a CPU, TF's peak on the GPU where the step ran on one."""
  if plan is None:
    return None
  rss, gpu = round(memory.peak_rss_mb(), 1), None
  if tf.config.list_logical_devices("GPU"):
    try:
      gpu = round(tf.config.experimental.get_memory_info("GPU:0")["peak"] / memory.MB, 1)
    except (ValueError, tf.errors.OpError):  # Not every device reports it.
      pass
  est = plan.estimate.total_mb
  if gpu:  # The device's share: its own memory only.
    est -= plan.estimate.baseline_mb
  return dataclasses.replace(plan, peak_rss_mb=rss, gpu_peak_mb=gpu,
                             estimate_over_measured=round(est / (gpu or rss), 3))


def figures(timer: instrument.StepTimer, batch_size: int, flops_per_step: int | None,
            compute_dtype: str, optimizer: keras.optimizers.Optimizer | None,
            images: bool = True) -> dict[str, Any]:
  """The RunSummary fields measured by the step timer and the optimizer, with the FLOP
  rate they give against the machine's peak for `compute_dtype` (`images`: whether
  an example is an image, for images/s)."""
  stats, logs = timer.stats(), timer.epoch_logs
  ms = stats["median"]
  achieved = summary_lib.achieved_gflops(flops_per_step, ms)
  peak, peak_source = hardware.peak_gflops(compute_dtype)
  return dict(
      epochs_completed=timer.epochs_done, steps=timer.steps,
      warmup_steps=timer.warmup_steps,
      ms_per_step=ms, step_time_ms=stats, timed_steps=len(timer.steady()),
      images_per_sec=batch_size / ms * 1e3 if ms and images else None,
      examples_per_sec=batch_size / ms * 1e3 if ms else None,
      train_s=sum(timer.durations_ms) / 1e3,
      train_loss=logs.get("loss"), train_accuracy=accuracy(logs),
      val_loss=logs.get("val_loss"),
      val_accuracy=accuracy({k[4:]: v for k, v in logs.items() if k.startswith("val_")}),
      metrics=_numbers(logs),
      loss_scale=precision.loss_scale(optimizer) if optimizer else None,
      skipped_steps=precision.skipped_steps(optimizer, timer.steps) if optimizer else 0,
      flops_per_step=flops_per_step, achieved_gflops=achieved,
      peak_gflops=peak, peak_source=peak_source,
      mfu=achieved / peak if achieved and peak else None)


def accuracy(logs: dict[str, Any]) -> float | None:
  """The run's accuracy among an epoch's logs, whatever Keras named it ("accuracy",
  "acc", "binary_accuracy", "sparse_categorical_accuracy", ...): the one such figure;
  None where there is none, or several (one per output) and none is the model's."""
  if logs.get("accuracy") is not None:
    return float(logs["accuracy"])
  found = [v for k, v in logs.items() if k == "acc" or
           (k.endswith("accuracy") and not k.startswith("val_") and "/" not in k)]
  return float(found[0]) if len(found) == 1 else None


def _numbers(logs: dict[str, Any]) -> dict[str, float]:
  """The figures among an epoch's logs (a loop may log anything)."""
  found = {}
  for key, value in logs.items():
    try:
      found[str(key)] = float(value)
    except (TypeError, ValueError):
      continue
  return found


def software() -> dict[str, Any]:
  """The RunSummary fields naming the device and the software versions."""
  return dict(device=hardware.device_name(), tf_version=tf.__version__,
              keras_version=keras.__version__,
              python_version=platform.python_version())


def build(run: Run, timer: instrument.StepTimer, status: str,
          message: str | None = None) -> RunSummary:
  """summary.json of `run` ending with `status` now (`timer`: its step timer)."""
  wall_s = run.wall_s()
  cfg, data, ckpt = run.cfg, run.data, run.ckpt
  compute_dtype = run.policy.compute_dtype
  found = figures(timer, cfg.batch_size, run.flops_per_step, compute_dtype,
                  run.optimizer)
  achieved = found["achieved_gflops"]
  # The best matmul rate `--mode=microbench` measured here, per dtype (None: not run).
  by_dtype = {d: rates.cached_gflops(d)[0] for d in ("float32", "bfloat16", "float16")}
  measured = by_dtype.get(compute_dtype)
  return RunSummary(
      status=status, run_dir=str(run.run_dir), message=message,
      policy=cfg.policy, layer_policy=cfg.layer_policy, loop=cfg.loop, model=cfg.model,
      model_opts=cfg.model_opts,
      batchnorm=cfg.batchnorm,
      dataset=cfg.dataset, data_source=data.source,
      image_size=cfg.image_size, batch_size=cfg.batch_size, input_work=cfg.input_work,
      jit_compile=cfg.jit_compile, instrument=cfg.instrument, seed=cfg.seed,
      deterministic=cfg.deterministic, resumed=bool(cfg.resume),
      checkpoints=cfg.checkpoint,
      compute_dtype=compute_dtype, variable_dtype=run.policy.variable_dtype,
      epochs=cfg.epochs, steps_per_epoch=data.steps_per_epoch,
      n_train=data.n_train, n_val=data.n_val,
      skipped_files=len(data.skipped_files),
      skipped_file_names=data.skipped_files[:20],
      data_wait_share=found["step_time_ms"]["data_wait_share"] if cfg.instrument
      else None,
      wall_s=round(wall_s, 3),
      policy_verdict=run.verdict, policy_choice=run.policy_choice, cost=run.cost,
      layer_costs=run.layer_costs,
      onednn_choice=run.onednn,
      memory=_memory(run.memory),
      flops_share_16bit=run.report["flops_share_16bit"] if run.report else None,
      microbench_gflops_by_dtype=by_dtype,
      achieved_vs_microbench=achieved / measured if achieved and measured else None,
      util=run.sampler.stats() if run.sampler else None,
      gpu_util_absent=run.sampler.gpu_absent if run.sampler else None,
      checkpoint=ckpt.latest,
      checkpoint_ms=({"median": sorted(ckpt.save_ms)[len(ckpt.save_ms) // 2],
                      "total": sum(ckpt.save_ms), "saves": len(ckpt.save_ms)}
                     if ckpt.save_ms else None),
      hardware=hardware.facts(),
      **found, **software(), **run.dist.summary(cfg.batch_size))
