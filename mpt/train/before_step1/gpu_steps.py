"""The kernel table on a GPU, from this model's step profiled per policy: the
measurement before step 1 (mpt/train/before_step1/cost.py) runs each policy's traced step
PROFILED_STEPS more times under TF's profiler, and the captures are read into the
table (mpt/machine/gpu_table.py: per op family, the share on Tensor Cores and the
layers whose eligible kernels ran on CUDA cores).
"""

import pathlib
import tempfile
from typing import Callable

import tensorflow as tf

from mpt import errors
from mpt.machine import gpu_profile
from mpt.machine import gpu_specs
from mpt.machine import gpu_table

PROFILED_STEPS = 2  # Per policy: the kernel table's steps.


def _profiled(step: Callable[[], float], folder: pathlib.Path):
  """PROFILED_STEPS calls of `step` under TF's profiler, read (GpuProfile)."""
  tf.profiler.experimental.start(str(folder))
  try:
    for _ in range(PROFILED_STEPS):
      step()
  finally:
    tf.profiler.experimental.stop()
  found = gpu_profile.find_traces(folder)
  if not found:
    raise errors.UserError("the profiler wrote no capture")
  profile = gpu_profile.read(found[0])
  if profile.device is None or not profile.kernels:
    raise errors.UserError("; ".join(profile.notes) or "no GPU kernels in the capture")
  return profile


def kernel_table(steps: dict[str, Callable[[], float]]):
  """(the kernel table on this GPU from each policy's step profiled, or None, and why
  not). Never raises for a capture it cannot read: the table is evidence, not the run."""
  profiles = {}
  with tempfile.TemporaryDirectory(prefix="mpt-kernels-") as tmp:
    for policy, step in steps.items():
      try:
        profiles[policy] = _profiled(step, pathlib.Path(tmp) / policy)
      except (errors.UserError, tf.errors.OpError) as e:
        return None, f"the kernel table on this GPU was not read ({policy}): {e}"
  if not profiles:
    return None, "the kernel table on this GPU was not read: no policy's step ran"
  device = next(iter(profiles.values())).device
  name = (gpu_specs.identify(device)[0] or device.model or device.name) if device else "GPU"
  notes = sorted({n for p in profiles.values() for n in p.notes})
  return gpu_table.table(profiles, PROFILED_STEPS, name, notes), None
