"""A training run's summary.json, from what the run measured: `build(run, ...)` ->
RunSummary.

The record's type and file belong to mpt/records/summary.py; this module only knows
where each figure of a training run comes from: the config, the data, the timer, the
optimizer's precision state, the FLOP counts of the dtype inspection, the machine's
peak and measured rates, the sampler, the checkpoints and the strategy. The figures a
user's own `model.fit` is summarised by too are common/figures.py's.
"""

import dataclasses

import tensorflow as tf

from mpt.machine import rates
from mpt.measure import instrument
from mpt.measure import memory
from mpt.records.memory import MemoryPlan
from mpt.records.summary import RunSummary
from mpt.train.before_step1 import cost as timing
from mpt.train.common import figures as figures_lib
from mpt.train.common import precision
from mpt.train.cli.prepare import Run


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


def _checked(run: Run, found: dict, status: str):
  """(the cost, the verdict) after a completed run's own steps checked its policy's
  row (mpt/train/before_step1/cost.py `checked_by_run`: the run's figure replaces one
  it disagrees with, said), by the chief only: it writes the cache."""
  cost, verdict = run.before.cost, run.before.verdict
  if status != "completed" or not run.dist.is_chief or cost is None:
    return cost, verdict
  cfg = run.cfg
  checked = timing.checked_by_run(cost, cfg.policy, cfg.layer_policy,
                                  found["ms_per_step"], found["timed_steps"],
                                  str(run.run_dir))
  if checked is cost:
    return cost, verdict
  return checked, precision.check_speed(cfg.policy, precision.layer_classes(run.model),
                                        checked, say=False)


def build(run: Run, timer: instrument.StepTimer, status: str,
          message: str | None = None, flops=None) -> RunSummary:
  """summary.json of `run` ending with `status` now (`timer`: its step timer; `flops`:
  the step's FLOP count, a countstep.CountStep, or None)."""
  wall_s = run.wall_s()
  cfg, data, ckpt = run.cfg, run.data, run.ckpt
  found = figures_lib.figures(timer, cfg.batch_size, flops.per_step if flops else None,
                              run.policy.compute_dtype, run.optimizer)
  cost, verdict = _checked(run, found, status)
  achieved = found["achieved_gflops"]
  # The best matmul rate `--mode=microbench` measured here, per dtype (None: not run).
  by_dtype = {d: rates.cached_gflops(d)[0] for d in ("float32", "bfloat16", "float16")}
  measured = by_dtype.get(run.policy.compute_dtype)
  return RunSummary(
      status=status, run_dir=str(run.run_dir), message=message,
      layer_policy=cfg.layer_policy, loop=cfg.loop, model=cfg.model,
      model_opts=cfg.model_opts, batchnorm=cfg.batchnorm,
      dataset=cfg.dataset, data_source=data.source,
      image_size=cfg.image_size, batch_size=cfg.batch_size, input_work=cfg.input_work,
      jit_compile=cfg.jit_compile, instrument=cfg.instrument, seed=cfg.seed,
      deterministic=cfg.deterministic, resumed=bool(cfg.resume),
      checkpoints=cfg.checkpoint,
      epochs=cfg.epochs, steps_per_epoch=data.steps_per_epoch,
      n_train=data.n_train, n_val=data.n_val,
      skipped_files=len(data.skipped_files),
      skipped_file_names=data.skipped_files[:20],
      data_wait_share=found["step_time_ms"]["data_wait_share"] if cfg.instrument
      else None,
      **dataclasses.replace(run.before, cost=cost, verdict=verdict).fields(),
      memory=_memory(run.before.memory),
      microbench_gflops_by_dtype=by_dtype,
      achieved_vs_microbench=achieved / measured if achieved and measured else None,
      gpu_util_absent=run.sampler.gpu_absent if run.sampler else None,
      checkpoint=ckpt.latest,
      checkpoint_ms=({"median": sorted(ckpt.save_ms)[len(ckpt.save_ms) // 2],
                      "total": sum(ckpt.save_ms), "saves": len(ckpt.save_ms)}
                     if ckpt.save_ms else None),
      not_measured={"flops": flops.not_counted} if flops and flops.not_counted else {},
      **figures_lib.shared(run.policy, wall_s, run.report, run.sampler, run.out_dir,
                           found, flops), **run.dist.summary(cfg.batch_size))
