"""What is known about a policy's speed on this machine before training, typed: the
verdict on the run's policy (summary.json `policy_verdict`, mpt/machine/fastpath.py)
and `--policy=auto`'s timed choice (summary.json `policy_choice`,
mpt/train/before_step1/autopolicy.py).

A verdict rests on one of three kinds of evidence, most direct first: "cost" (this
model's step timed per policy before step 1, mpt/train/before_step1/cost.py), "probe" (the kernel
table's representative shapes, mpt/machine/kernels.py) or "flags" (the CPU flags or the
GPU's compute capability: nothing measured). The first two are `measured`.
"""

import dataclasses

# The evidence that rests on a measurement, and the name the diagnosis gives each as
# the basis of a finding (mpt/diagnose/detectors: BASES).
MEASURED = {"cost": "step cost", "probe": "probe"}


@dataclasses.dataclass
class PolicyVerdict:
  """The measured verdict on a run's policy here (fields in the order the file has
  always had them)."""
  evidence: str = "flags"  # cost | probe | flags
  slow: bool = False  # The policy measured >= fastpath.SLOW times float32's time.
  ratio: float | None = None  # Its time over float32's (None: only the flags spoke).
  # The op whose 16-bit kernel is slowest against float32's, from the kernel table.
  op: str | None = None
  impl: str | None = None  # Its kernel, as oneDNN names it.
  op_ratio: float | None = None
  reference: bool = False  # oneDNN's reference (unoptimised) kernel.
  fastest: str | None = None  # The policy measured fastest, or the flags' advice.
  fastest_ratio: float | None = None
  contradicts: str | None = None  # Where the measurement and the CPU flags disagree.
  # Each policy's time over float32's: the kernel table's (evidence "probe"), or the
  # step cost's (evidence "cost": summary.json keeps those in `cost` only).
  policy_ratios: dict[str, float] = dataclasses.field(default_factory=dict)
  text: str | None = None  # The one-line warning printed before step 1, or None.
  # "at least" / "at most": its step's timing stopped before it settled, and `ratio`
  # is that bound (mpt/measure/timer.py); None: a figure.
  bound: str | None = None
  source: str | None = None  # Where the table or timing came from.
  note: str | None = None  # The kernel table's note (a stand-in, a failed probe).
  # On a GPU, from its kernel table: the 16-bit policy's share of eligible kernel
  # time on CUDA cores rather than Tensor Cores, and those kernels' layers.
  cuda_cores_share: float | None = None
  cuda_cores_layers: list[str] = dataclasses.field(default_factory=list)

  @property
  def measured(self) -> bool:
    """Whether a measurement made it, with a ratio for every policy measured."""
    return self.evidence in MEASURED and bool(self.policy_ratios)

  @property
  def basis(self) -> str:
    """The diagnosis' name of what it rests on: "step cost", "probe" or "flags"."""
    return MEASURED.get(self.evidence, "flags")


BESIDE = "timed beside the plan"  # A uniform policy timed again next to a plan.


@dataclasses.dataclass
class Candidate:
  """One policy `--policy=auto` considered. A uniform policy's times are its row of
  the step's cost (summary.json keeps them in `cost` only); a per-layer plan's, and
  its policy's timed BESIDE it, are the choice's own measurement."""
  TIMED = ("first_ms", "ms_per_step", "finite", "predicted_ms", "time_vs_float32")
  policy: str
  first_ms: float | None = None  # Its first step (None: not timed).
  ms_per_step: float | None = None  # Median of the timed steps, or the prediction.
  finite: bool = True  # Its loss stayed finite.
  dropped: str | None = None  # Why it was not timed to the end, or None.
  predicted_ms: float | None = None  # Its step's predicted cost (mpt/train/before_step1/cost.py).
  time_vs_float32: float | None = None  # Its ms/step over float32's (above 1: slower).
  # On a GPU, from the kernel table (mpt/machine/gpu_table.py): the share of its
  # convolution/matmul kernel time on Tensor Cores, and the layers left on CUDA cores.
  tensor_cores: float | None = None
  cuda_cores_layers: list[str] = dataclasses.field(default_factory=list)
  layer_policy: str = ""  # A per-layer plan over `policy` ("": the uniform policy).
  vs_float32: float | None = None  # Read only: older files' float32 ms over its own.

  def __post_init__(self):  # An older file's ratio, turned the way mpt keeps ratios.
    if self.vs_float32 and self.time_vs_float32 is None:
      self.time_vs_float32 = 1 / self.vs_float32
    self.vs_float32 = None

  def to_dict(self) -> dict:  # Written without the older files' key.
    return {k: v for k, v in dataclasses.asdict(self).items() if k != "vs_float32"}

  @property
  def from_cost(self) -> bool:
    """Whether its times are its row of the step's cost (not the choice's own)."""
    return not self.layer_policy and self.dropped != BESIDE

  def timed_by(self, row, base_ms: float | None) -> "Candidate":
    """Its times from its row of a measurement (mpt/records/cost.py PolicyCost),
    against float32's ms/step `base_ms`."""
    ms = row.ms_per_step
    self.first_ms, self.ms_per_step, self.finite = row.first_ms, ms, row.finite
    self.predicted_ms = ms if row.predicted else None
    self.time_vs_float32 = ms / base_ms if base_ms and ms else None
    return self


@dataclasses.dataclass
class PolicyChoice:
  """`--policy=auto`: each candidate's timed steps, the choice, what choosing cost."""
  requested: str = "auto"
  chosen: str = "float32"
  steps_timed: int = 0
  candidates: list[Candidate] = dataclasses.field(default_factory=list)
  seconds: float = 0.0
  # The per-layer plan adopted over `chosen` ("": none), and why a plan was or was
  # not adopted (or why nothing was measured).
  layer_policy: str = ""
  note: str = ""
