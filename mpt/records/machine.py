"""The machine a run used and how busy it kept it, typed: summary.json's `hardware`
(mpt/machine/hardware.py `facts()`, at the end of a run) and `util` (the sampler's
whole-run figures, mpt/measure/sampler.py).

The shares the diagnosis judges a run by are computed here, once: the training
device's busy share and the share of the CPU other processes took.
"""

import dataclasses


@dataclasses.dataclass
class Gpu:
  name: str
  compute_capability: list[int] | None = None  # [major, minor]; None: not reported.


@dataclasses.dataclass
class Hardware:
  """What a diagnosis needs to know about the machine a run used."""
  cpu: str = "this CPU"
  cpu_count: int | None = None  # Logical cores the run could use.
  cpu_flags: list[str] = dataclasses.field(default_factory=list)
  gpus: list[Gpu] = dataclasses.field(default_factory=list)
  # TF32 matters only on compute capability >= 8.0; the switch is global.
  tf32: bool = False
  # The host's logical cores, the CPUs in the process' affinity mask, the cgroup's
  # CPU quota in cores (None: none). `cpu_count` is what the run could use of them.
  host_cpu_count: int | None = None
  affinity_cpus: int | None = None
  cpu_quota: float | None = None

  @property
  def gpu_caps(self) -> list[tuple[int, int]]:
    """Compute capabilities of the GPUs the run had, where reported."""
    return [tuple(g.compute_capability) for g in self.gpus if g.compute_capability]


@dataclasses.dataclass
class Stat:
  """A figure over the whole run."""
  mean: float
  max: float


@dataclasses.dataclass
class Utilisation:
  """The sampler's figures over the whole run; None where it had no reading."""
  process_cpu_percent: Stat | None = None  # Of one core: 200 is two cores busy.
  system_cpu_percent: Stat | None = None   # Of the CPUs the process may run on.
  rss_mb: Stat | None = None
  gpu_percent: Stat | None = None          # NVML, mean over the GPUs.
  gpu_memory_mb: Stat | None = None
  tf_peak_memory_mb: Stat | None = None

  def busy(self, hw: Hardware | None) -> tuple[float | None, str]:
    """(busy share of the training device, what was measured)."""
    if self.gpu_percent:
      return self.gpu_percent.mean / 100, "GPU utilisation"
    if hw is None or hw.gpus:  # Trained on a GPU, not sampled (no NVML): CPU use
      return None, ""          # says nothing.
    if self.process_cpu_percent and hw.cpu_count:
      return (self.process_cpu_percent.mean / (100 * hw.cpu_count),
              f"process CPU use over {hw.cpu_count} cores")
    return None, ""

  def others(self, hw: Hardware | None) -> float | None:
    """Share of all CPU cores other processes used during the run (machine load)."""
    system, mine = self.system_cpu_percent, self.process_cpu_percent
    if not system or not mine or not hw or not hw.cpu_count:
      return None
    # The sampler reads the system's use over the CPUs of the affinity mask.
    return max(0.0, system.mean / 100 - mine.mean / (100 * (hw.affinity_cpus or
                                                             hw.cpu_count)))
