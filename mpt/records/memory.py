"""The memory plan of a run, typed: the preflight's estimate of a training step's peak
memory per policy before step 1 (mpt/measure/memory.py does the arithmetic,
mpt/train/before_step1/preflight.py the check) and the peak measured after it, as summary.json's
`memory`; sweeps read each policy's line from it to predict which batches fit.
"""

import dataclasses
from typing import Any


@dataclasses.dataclass
class Estimate:
  """One policy's estimated peak at one per-replica batch, in MB by part."""
  policy: str
  batch_size: int  # Per replica.
  baseline_mb: float
  parameters_mb: float
  gradients_mb: float
  optimizer_mb: float
  weight_copies_mb: float
  activations_mb_per_example: float
  input_mb_per_example: float
  # 16-bit ops emulated in float32 working copies (see mpt/measure/memory.py).
  emulated_16bit: bool = False
  DERIVED = ("total_mb", "per_example_mb")  # Written for readers of the file.

  @property
  def fixed_mb(self) -> float:
    return (self.baseline_mb + self.parameters_mb + self.gradients_mb +
            self.optimizer_mb + self.weight_copies_mb)

  @property
  def per_example_mb(self) -> float:
    return self.activations_mb_per_example + self.input_mb_per_example

  @property
  def total_mb(self) -> float:
    return self.fixed_mb + self.batch_size * self.per_example_mb

  def line(self) -> "Line":
    return Line(round(self.fixed_mb, 2), round(self.per_example_mb, 5),
                round(self.baseline_mb, 2))

  def to_dict(self) -> dict[str, Any]:
    return {**dataclasses.asdict(self), "total_mb": round(self.total_mb, 1),
            "per_example_mb": round(self.per_example_mb, 4)}


@dataclasses.dataclass
class Line:
  """A policy's estimate as a line in the per-replica batch: fixed + batch x slope."""
  fixed_mb: float
  per_example_mb: float
  baseline_mb: float  # Part of fixed_mb: the process before step 1.

  def total_mb(self, batch: int) -> float:
    return self.fixed_mb + batch * self.per_example_mb


@dataclasses.dataclass
class MemoryPlan:
  """summary.json `memory`: the estimate before step 1 and the peak measured after."""
  estimate: Estimate  # The run's policy at its per-replica batch.
  estimate_mb_by_policy: dict[str, float] = dataclasses.field(default_factory=dict)
  policies: dict[str, Line] = dataclasses.field(default_factory=dict)
  available_mb: float = 0.0
  available: str = ""  # What `available_mb` is ("available RAM", "GPU memory", ...).
  replicas: int = 1
  # Measured at the end of the run: the process's RSS high-water mark, and TF's peak
  # on a GPU the step ran on; the estimate over the one that applies.
  peak_rss_mb: float | None = None
  gpu_peak_mb: float | None = None
  estimate_over_measured: float | None = None

  @property
  def peak_mb(self) -> float | None:
    """The measured peak that applies: the GPU's where the step ran on one."""
    return self.gpu_peak_mb or self.peak_rss_mb
