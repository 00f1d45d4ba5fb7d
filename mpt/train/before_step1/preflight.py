"""Before the first step: will the training step fit in memory? If not, one line and
exit 2 (unless --force), saying the estimate, what is available and the largest batch
that fits under this policy and the others.

The estimate's arithmetic is mpt/measure/memory.py's; this module applies it to the
run: the dtype report of the built model (its layers' outputs per example), the
per-replica batch, the process's RSS so far as the baseline (TensorFlow, the model,
the cached data), and the host's available RAM (a GPU's own memory where the step
runs on one). `estimates()` is what summary.json and `--mode=inspect` record.
"""

import pathlib
import shutil
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from mpt import config
from mpt.errors import UserError
from mpt.measure import dtypes as dtypes_lib
from mpt.measure import memory
from mpt.records.cost import device_batch
from mpt.records.memory import MemoryPlan
from mpt.train.common import keras_fit


class WillNotFit(UserError):
  """The estimate exceeds what the device has: the run stops before it starts."""


def estimates(report: dict[str, Any], batch_size: int, trainable: int,
              baseline_mb: float, gpu: bool = False) -> dict[str, memory.Estimate]:
  """The estimate under each policy for `report`'s model at a per-replica batch. On
  a CPU where TensorFlow's oneDNN rewrite is off (its default on CPUs without
  AVX512_VNNI/BF16/AMX, or TF_ENABLE_ONEDNN_OPTS=0), the 16-bit ops run on TF's Eigen
  kernels, which compute in float32 working copies: a fact of this process, not of
  the CPU flags (which a recorded cpuinfo may stand in for)."""
  emulated = not gpu and not keras_fit.onednn_rewrite_on()
  return {p: memory.estimate(report, p, batch_size, baseline_mb, trainable, emulated)
          for p in sorted(config.POLICY_DTYPE)}  # Name order: memory.json's.


def check(policy: str, ests: dict[str, memory.Estimate], force: bool,
          available_mb: float | None = None, where: str | None = None,
          sharing: int = 1, replicas: int = 1) -> str | None:
  """Raises WillNotFit when the run's estimate exceeds what is available (the
  baseline is already in use, so the step's own memory is compared with what is
  left); returns a warning line when --force trains anyway, else None.

  The estimates are per replica; `sharing` replicas draw on the same memory (logical
  CPU devices share the host's RAM; a GPU has its own), and the batches in the message
  are global (`replicas` per-replica batches).
  """
  if available_mb is None:
    available_mb, where = memory.available_mb()
  est = ests[policy]
  need = (est.total_mb - est.baseline_mb) * sharing
  if need <= available_mb:
    return None
  largest = {p: memory.largest_batch(e, available_mb / sharing + e.baseline_mb) * replicas
             for p, e in ests.items()}
  fits = ", ".join(f"~{n} under {p}"
                   for p, n in sorted(largest.items(), key=lambda i: -i[1]))
  line = (f"memory: batch {est.batch_size * replicas} under {policy} needs ~"
          f"{memory.human(est.baseline_mb + need)} ({memory.human(need)} for the step "
          f"beside {memory.human(est.baseline_mb)} in use), "
          f"{memory.human(available_mb)} {where or 'available'}; largest batch that "
          f"fits: {fits}")
  if force:
    return f"WARNING: {line}; training anyway (--force)"
  raise WillNotFit(line + " (--force trains anyway)")


def data_cache_mb(cfg) -> float:
  """The in-memory image cache a run of `cfg` fills (float32 images), where the set's
  size is known before loading it (synthetic data); 0 otherwise."""
  if cfg.cache != "memory" or cfg.dataset != "synthetic":
    return 0.0
  images = cfg.synthetic_train + cfg.synthetic_val
  return images * cfg.image_size ** 2 * 3 * 4 / memory.MB


def table(ests: dict[str, memory.Estimate], available_mb: float,
          where: str) -> dict[str, Any]:
  """memory.json of `--mode=inspect`: each policy's estimate at the batch, the largest
  batch that fits, and the same as text."""
  rows = {p: {**e.to_dict(),
              "largest_batch": memory.largest_batch(e, available_mb + e.baseline_mb)}
          for p, e in ests.items()}
  batch = next(iter(ests.values())).batch_size
  text = (f"memory at batch {batch} (estimate; {memory.human(available_mb)} {where}): " +
          "; ".join(f"{p} ~{memory.human(r['total_mb'])}, largest batch that fits "
                    f"~{r['largest_batch']}" for p, r in rows.items()))
  return {"batch_size": batch, "available_mb": round(available_mb, 1),
          "available": where, "policies": rows, "text": text}


def for_run(cfg, report: dict[str, Any], trainable: int, replicas: int, workers: int,
            gpu: bool, remove: pathlib.Path | None = None) -> MemoryPlan:
  """A training run's check, before its first step: the estimate under each policy
  at the per-replica batch, with the process's RSS now as the baseline, against what
  the device has. A run that will not fit raises WillNotFit (its new, empty folder
  `remove` removed first) unless --force; otherwise the plan summary.json records."""
  ests = estimates(report, cfg.batch_size // replicas, trainable, memory.rss_mb(), gpu)
  # Replicas on logical CPU devices of this worker share its RAM; GPUs have their own.
  sharing = 1 if gpu else max(1, replicas // max(1, workers))
  try:
    available, where = memory.available_mb(gpu)
    warning = check(cfg.policy, ests, cfg.force, available, where, sharing=sharing,
                    replicas=replicas)
  except UserError:  # Will not fit, or a bad MPT_AVAILABLE_MB: no folder left behind.
    if remove is not None:
      shutil.rmtree(remove, ignore_errors=True)
    raise
  if warning:
    print(warning, flush=True)
  return MemoryPlan(ests[cfg.policy],
                    {p: round(e.total_mb, 1) for p, e in ests.items()},
                    # Each policy's estimate as a line in the per-replica batch (sweeps
                    # read it).
                    {p: e.line() for p, e in ests.items()},
                    round(available, 1), where, replicas)


def will_not_fit(cfg, build: Callable[[], Any]) -> str | None:
  """Why a step of `build()`'s model at the run's device batch would run out of memory
  under some policy, or None: the estimate of `for_run`, before anything runs it (the
  step's cost per policy, mpt/train/before_step1/cost.py, is measured at that batch)."""
  keras.backend.clear_session(free_memory=False)  # Memory is freed after (below).
  keras.mixed_precision.set_global_policy("float32")
  model = build()
  report = dtypes_lib.inspect_model(model, seed=cfg.seed)
  trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
  ests = estimates(report, device_batch(cfg), trainable, memory.rss_mb(),
                   bool(tf.config.list_logical_devices("GPU")))
  keras.backend.clear_session()  # The inspected model's memory freed before the next.
  try:
    for policy in ests:
      check(policy, ests, force=False)
  except UserError as e:
    return str(e).partition(" (--force")[0]
  return None
