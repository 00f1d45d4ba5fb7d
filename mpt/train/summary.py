"""A training run's summary.json, from what the run measured: `build(...)` -> RunSummary.

The record's type and file belong to mpt/records/summary.py; this module only knows
where each figure of a training run comes from: the config, the data, the timer, the
optimizer's precision state, the FLOP counts of the dtype inspection, the machine's
peak and measured rates, the sampler, the checkpoints and the strategy.
"""

import dataclasses
import platform
from typing import Any

import keras
import tensorflow as tf

from mpt.config import Config
from mpt.machine import hardware
from mpt.machine import rates
from mpt.measure import dtypes as dtypes_lib
from mpt.measure import instrument
from mpt.measure import memory
from mpt.measure import sampler as sampler_lib
from mpt.records.cost import Cost, OnednnChoice
from mpt.records.summary import RunSummary
from mpt.train import checkpoint
from mpt.train import data as data_lib
from mpt.train import distribute
from mpt.train import precision


@dataclasses.dataclass
class RunState:
  """What a run has when it ends, however it ends."""
  cfg: Config
  run_dir: str
  policy: keras.DTypePolicy
  data: data_lib.Data
  optimizer: keras.optimizers.Optimizer
  timer: instrument.StepTimer
  ckpt: checkpoint.Checkpointer
  dist: distribute.Setup
  speed: dict[str, Any] | None = None  # precision.check_speed's verdict.
  report: dict[str, Any] | None = None  # The dtype inspection (None: --noinstrument).
  sampler: sampler_lib.Sampler | None = None
  policy_choice: dict[str, Any] | None = None  # --policy=auto's record.
  memory: dict[str, Any] | None = None  # The preflight's estimates (run.py).
  cost: Cost | None = None  # This model's step per policy, before step 1.
  onednn: OnednnChoice | None = None  # TF's oneDNN rewrite, and why.


def _memory(estimates: dict[str, Any] | None) -> dict[str, Any] | None:
  """The preflight's estimates beside the measured peak: the process's RSS
  high-water mark on a CPU, TF's peak on the GPU where the step ran on one."""
  if estimates is None:
    return None
  measured = {"peak_rss_mb": round(memory.peak_rss_mb(), 1)}
  if tf.config.list_logical_devices("GPU"):
    try:
      measured["gpu_peak_mb"] = round(
          tf.config.experimental.get_memory_info("GPU:0")["peak"] / memory.MB, 1)
    except (ValueError, tf.errors.OpError):  # Not every device reports it.
      pass
  peak = measured.get("gpu_peak_mb") or measured["peak_rss_mb"]
  est = estimates["estimate"]["total_mb"]
  if measured.get("gpu_peak_mb"):  # The device's share: its own memory only.
    est -= estimates["estimate"]["baseline_mb"]
  return {**estimates, **measured, "estimate_over_measured": round(est / peak, 3)}


def build(run: RunState, status: str, wall_s: float,
          message: str | None = None) -> RunSummary:
  cfg, data, timer, ckpt = run.cfg, run.data, run.timer, run.ckpt
  logs, stats = timer.epoch_logs, timer.stats()
  ms = stats["median"]
  flops = dtypes_lib.train_step_flops(run.report, cfg.batch_size) if run.report else None
  achieved = flops / ms * 1e3 / 1e9 if flops and ms else None
  compute_dtype = run.policy.compute_dtype
  peak, peak_source = hardware.peak_gflops(compute_dtype)
  # The best matmul rate `--mode=microbench` measured here, per dtype (None: not run).
  by_dtype = {d: rates.cached_gflops(d)[0] for d in ("float32", "bfloat16", "float16")}
  measured = by_dtype.get(compute_dtype)
  return RunSummary(
      status=status, run_dir=run.run_dir, message=message,
      policy=cfg.policy, loop=cfg.loop, model=cfg.model, model_opts=cfg.model_opts,
      batchnorm=cfg.batchnorm,
      dataset=cfg.dataset, data_source=data.source,
      image_size=cfg.image_size, batch_size=cfg.batch_size, input_work=cfg.input_work,
      jit_compile=cfg.jit_compile, instrument=cfg.instrument, seed=cfg.seed,
      deterministic=cfg.deterministic, resumed=bool(cfg.resume),
      checkpoints=cfg.checkpoint,
      compute_dtype=compute_dtype, variable_dtype=run.policy.variable_dtype,
      epochs=cfg.epochs, epochs_completed=timer.epochs_done,
      steps_per_epoch=data.steps_per_epoch, steps=timer.steps,
      warmup_steps=cfg.warmup_steps, n_train=data.n_train, n_val=data.n_val,
      skipped_files=len(data.skipped_files),
      skipped_file_names=data.skipped_files[:20],
      ms_per_step=ms, step_time_ms=stats, timed_steps=len(timer.steady()),
      data_wait_share=stats["data_wait_share"] if cfg.instrument else None,
      images_per_sec=cfg.batch_size / ms * 1e3 if ms else None,
      train_s=sum(timer.durations_ms) / 1e3, wall_s=round(wall_s, 3),
      train_loss=logs.get("loss"), train_accuracy=logs.get("accuracy"),
      val_loss=logs.get("val_loss"), val_accuracy=logs.get("val_accuracy"),
      loss_scale=precision.loss_scale(run.optimizer),
      skipped_steps=precision.skipped_steps(run.optimizer, timer.steps),
      slow_path_warning=(run.speed or {}).get("text"), kernels=run.speed,
      policy_choice=run.policy_choice,
      cost=run.cost.to_dict() if run.cost else None,
      onednn=run.onednn.label() if run.onednn else None,
      tf_enable_onednn_opts=run.onednn.env if run.onednn else None,
      onednn_choice=run.onednn.to_dict() if run.onednn else None,
      memory=_memory(run.memory),
      flops_share_16bit=run.report["flops_share_16bit"] if run.report else None,
      flops_per_step=flops, achieved_gflops=achieved,
      peak_gflops=peak, peak_source=peak_source,
      mfu=achieved / peak if achieved and peak else None,
      microbench_gflops=measured, microbench_gflops_by_dtype=by_dtype,
      achieved_vs_microbench=achieved / measured if achieved and measured else None,
      util=run.sampler.stats() if run.sampler else None,
      gpu_util_absent=run.sampler.gpu_absent if run.sampler else None,
      checkpoint=ckpt.latest,
      checkpoint_ms=({"median": sorted(ckpt.save_ms)[len(ckpt.save_ms) // 2],
                      "total": sum(ckpt.save_ms), "saves": len(ckpt.save_ms)}
                     if ckpt.save_ms else None),
      device=hardware.device_name(), hardware=hardware.facts(),
      tf_version=tf.__version__, keras_version=keras.__version__,
      python_version=platform.python_version(),
      **run.dist.summary(cfg.batch_size))
