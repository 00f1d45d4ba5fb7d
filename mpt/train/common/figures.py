"""The figures every run is summarised by, from its step timer and optimizer: the
RunSummary fields the command line's run (mpt/train/cli/record.py) and a user's own
`model.fit` or loop (mpt/train/script/library.py) both fill the same way, and the
software the run ran on."""

import pathlib
import platform
from typing import Any, Callable

import keras
import tensorflow as tf

from mpt.machine import hardware
from mpt.measure import instrument
from mpt.records import numerics as numerics_records
from mpt.records import summary as summary_lib
from mpt.train.common import ending
from mpt.train.common import precision


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


def shared(policy: keras.DTypePolicy, wall_s: float, report: dict | None, sampler,
           folder: pathlib.Path, found: dict[str, Any], flops,
           attempt: Callable[..., Any] = ending.direct) -> dict[str, Any]:
  """The RunSummary fields every run fills alike, `found` (`figures`) among them,
  besides its status, message and folder; `attempt` runs the parts (a script's: best
  effort, mpt/train/common/besteffort.py). `flops`: a countstep.CountStep, or None
  where nothing was counted (--noinstrument); why not, where not, is its
  `not_counted` (the caller's not_measured["flops"])."""
  counted = flops is not None and bool(flops.per_step)
  return dict(
      policy=policy.name, compute_dtype=policy.compute_dtype,
      variable_dtype=policy.variable_dtype, wall_s=round(wall_s, 3),
      flops_share_16bit=report["flops_share_16bit"] if report else None,
      skip_causes=attempt("numerics", numerics_records.overflows_of, folder, default=[]),
      util=attempt("sampler", sampler.stats) if sampler else None,
      hardware=hardware.facts(), device=hardware.device_name(),
      tf_version=tf.__version__, keras_version=keras.__version__,
      python_version=platform.python_version(),
      flops_counted_by=flops.found.how if counted else None,
      flops_matmul=flops.found.matmul if counted else None, **found)


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
