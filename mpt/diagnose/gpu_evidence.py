"""A GPU capture as the diagnosis reads it: the profile (mpt/records/gpu.py, read by
mpt/machine/gpu_profile.py), whether it is of a 16-bit run, the data-sheet ceiling of
its GPU (mpt/machine/gpu_specs.py), and the upper bound on what mixed_float16 could
gain from its own kernel time (`Bound`).

The bound is Amdahl's law over the capture's kernel time, split by what ran it:

  kernel time after / before >= other + memory/2 + eligible/R + tensor_core/R_tf32

where R is the data sheet's float16 Tensor Core rate over its float32 rate (V100
125/15.7, T4 65/8.1): an eligible op (convolution, matmul) gains at most that;
memory-bound ops at most 2x (half the bytes); the rest nothing. A float32 op that
already ran on Tensor Cores (TF32, Ampere and newer) gains at most R_tf32. Without
Tensor Cores the eligible part gains nothing. The step bound keeps the idle part of
the step (1 - busy share) as it is. Casts, loss scaling and misaligned shapes take some
of it back: a ceiling, never a forecast.
"""

import dataclasses
import functools
from typing import Callable

from mpt import config
from mpt.diagnose.thresholds import SIXTEEN_BIT_RUN
from mpt.machine import gpu_specs
from mpt.records.gpu import GpuProfile

FOREIGN_POLICY = 'keras.mixed_precision.set_global_policy("{policy}")'


@dataclasses.dataclass
class Bound:
  """mixed_float16's most over float32, from one float32 capture."""
  # Of kernel time: tensor_core, eligible_not_tc, memory (casts apart), casts, other.
  shares: dict[str, float]
  ratio: float | None  # R; None: the eligible part is taken as free (no data sheet).
  tf32_ratio: float | None
  kernel_bound: float  # Kernel time before over after, at best.
  step_bound: float | None  # The same for the step; None without a busy share.
  formula: str  # The sum with the capture's numbers.


@dataclasses.dataclass
class GpuEvidence:
  """What the GPU rules read: the capture, and what a run folder adds to it."""
  profile: GpuProfile
  policy: str | None = None  # The mpt run's --policy; None: a foreign capture.
  rerun: Callable[[str], str] | None = None  # The run's command under a policy.
  layer_policy: str = ""  # The mpt run's --layer_policy.

  @property
  def sixteen_bit(self) -> bool:
    """Whether the capture is of a 16-bit run: the run's policy, else its kernels."""
    if self.policy:
      return config.sixteen_bit(self.policy,
                                config.layer_policies(self.layer_policy)) is not None
    return (self.profile.sixteen_bit_share or 0.0) >= SIXTEEN_BIT_RUN

  @functools.cached_property
  def ceiling(self) -> gpu_specs.Ceiling | None:
    device = self.profile.device
    return gpu_specs.ceiling(device) if device else None

  @property
  def kernel_ms(self) -> float:
    return self.profile.split.total

  def share(self, ms: float) -> float:
    return ms / self.kernel_ms if self.kernel_ms else 0.0

  def policy_step(self, policy: str) -> str:
    """The next step that trains under `policy`: the run's own command, else the
    line a Keras script needs (before it builds the model)."""
    if self.rerun:
      return self.rerun(policy)
    return FOREIGN_POLICY.format(policy=policy) + " before building the model"

  @functools.cached_property
  def bound(self) -> Bound | None:
    """The bound for a float32 capture with kernel time; None otherwise."""
    if self.sixteen_bit or not self.kernel_ms or self.ceiling is None:
      return None
    return bound(self.profile, self.ceiling, self.profile.device_busy_share)


def bound(profile: GpuProfile, ceiling: gpu_specs.Ceiling, busy: float | None) -> Bound:
  """Amdahl's bound on mixed_float16's speed-up over this float32 capture."""
  split, total = profile.split, profile.split.total
  # A float32 step's casts are conversions cuDNN makes for its float32 kernels (layout,
  # type): the 16-bit kernels may need none, so they may vanish rather than halve.
  # The real H200 captures (tests/data/gpu_captures) show it: 7% of float32's kernel
  # time in cuDNN's convertTensor, none under mixed_float16, whose kernel time fell
  # 2.30x where halving them gave a 2.28x "bound".
  casts = sum(k.ms for k in profile.kernels
              if k.family == "cast" and not k.eligible and not k.tensor_core) / total
  shares = {"tensor_core": split.tensor_core / total,
            "eligible_not_tc": split.eligible_not_tc / total,
            "memory": split.memory_bound / total - casts, "casts": casts,
            "other": split.other / total}
  terms = [(shares["other"], 1.0, "other"), (shares["memory"], 2.0, "memory-bound"),
           (shares["casts"], float("inf"), "float32 conversions, may vanish")]
  if ceiling.tensor_cores:
    # An unknown ratio: the eligible part is taken as free, still a ceiling.
    terms += [(shares["eligible_not_tc"], ceiling.ratio or float("inf"), "eligible"),
              (shares["tensor_core"], ceiling.tf32_ratio or 1.0, "on Tensor Cores")]
  else:  # No Tensor Cores: the eligible ops gain nothing, whatever the data sheet.
    terms.append((shares["eligible_not_tc"] + shares["tensor_core"], 1.0, "eligible"))
  after = sum(share / ratio for share, ratio, _ in terms)
  formula = " + ".join(f"{share:.3f} ({what})" if ratio == 1.0
                       else f"{share:.3f}/{ratio:.3g} ({what})"
                       for share, ratio, what in terms if share)
  step = 1 / ((1 - busy) + busy * after) if busy else None
  return Bound(shares, ceiling.ratio if ceiling.tensor_cores else None,
               ceiling.tf32_ratio, 1 / after if after else float("inf"), step,
               f"{formula} = {after:.3f} of the kernel time")
