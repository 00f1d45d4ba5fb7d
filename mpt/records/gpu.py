"""What a GPU did in a profiled run, typed: read from a TensorFlow (or JAX) profiler
capture (`*.xplane.pb`) by mpt/machine/gpu_profile.py, read by the diagnosis
(mpt/diagnose/) and written into the diagnosis of a profile folder.

Device time is split by what ran it (`Split`): kernels that used Tensor Cores; kernels
of ops that could have (convolutions, matmuls, einsums, batched matmuls: "eligible")
but ran on CUDA cores; memory-bound ops (BatchNorm, elementwise, casts, layout
transposes and copies, reductions); the rest of the compute. Old captures (TF <= 2.4)
lose xprof's "eligible" flag: eligibility is then derived from the op type and dtype
(`eligible_from` says which).
"""

import dataclasses
import re

# What a family of ops is bound by on a GPU: "matmul" families can use Tensor Cores.
FAMILIES = ("conv", "matmul", "batchnorm", "elementwise", "cast", "transpose", "copy",
            "reduction", "random", "other")
_REPLICA = re.compile(r"^replica_\d+$")  # tf.distribute's scope per GPU.
_JAX_FUNCTION = re.compile(r"^(jit|pjit|pmap)\(.*\)$")
_JAX_TRANSFORM = re.compile(r"^(?:jvp|transpose|vmap|remat|checkpoint|pjit)\((.*)\)$")


def _unwrapped(part: str) -> str:
  """A name part without JAX's transformations: "transpose(jvp(conv1))" -> "conv1"."""
  while (inner := _JAX_TRANSFORM.match(part)):
    part = inner.group(1)
  return part


@dataclasses.dataclass
class GpuDevice:
  """A GPU of the capture, from its device plane's stats."""
  name: str  # The plane's name ("/device:GPU:0"), or the model where recorded.
  model: str | None = None  # "Tesla V100-SXM2-16GB" where the capture names it.
  compute_capability: list[int] | None = None  # [major, minor]
  sms: int | None = None
  clock_mhz: float | None = None
  memory_bandwidth_gbs: float | None = None
  memory_gb: float | None = None

  @property
  def tensor_cores(self) -> bool | None:
    """Whether it has Tensor Cores (compute capability >= 7.0); None: unknown."""
    cc = self.compute_capability
    return None if not cc else tuple(cc) >= (7, 0)


@dataclasses.dataclass
class Kernel:
  """One (kernel, TF op) row of the capture's kernel stats."""
  kernel: str
  op_name: str  # The TF op's full name ("model/conv1/Conv2D"); "" when unknown.
  op_type: str  # Its type ("Conv2D"), from the name.
  family: str  # One of FAMILIES.
  dtype: str | None  # What the kernel (else the op) name spells.
  ms: float
  occurrences: int = 1
  tensor_core: bool = False  # The kernel used Tensor Cores (xprof, from its name).
  eligible: bool = False  # The op could have used them.

  @property
  def layer(self) -> str:
    """The Keras layer the op belongs to: its name's part before the op, less the
    `gradient_tape` and `replica_N` scopes, and for a gradient less the forward op it
    differentiates: "gradient_tape/net/conv2d/Conv2D/Conv2DBackpropFilter" is in
    "net/conv2d". JAX names the traced function and its transformations instead:
    "jit(train_step)/transpose(jvp(conv1))/conv_general_dilated" is in "conv1"."""
    parts = self.op_name.split("/")
    if parts and _JAX_FUNCTION.match(parts[0]):  # JAX: "jit(train_step)/jvp(conv1)/..."
      parts = [_unwrapped(p) for p in parts[1:]]
    kept = [p for p in parts if p != "gradient_tape" and not _REPLICA.match(p)]
    if "gradient_tape" in parts and len(kept) > 2 and kept[-2][:1].isupper():
      del kept[-2]  # The forward op (Conv2D): Keras names layers in lower case.
    return "/".join(kept[:-1]) if len(kept) > 1 else (kept or [self.op_name])[0]


@dataclasses.dataclass
class Split:
  """Device kernel time, ms, by what ran it."""
  tensor_core: float = 0.0
  eligible_not_tc: float = 0.0
  memory_bound: float = 0.0
  other: float = 0.0

  @property
  def total(self) -> float:
    return self.tensor_core + self.eligible_not_tc + self.memory_bound + self.other


@dataclasses.dataclass
class GpuProfile:
  """A capture's GPU evidence; None where the capture does not say."""
  trace: str  # The xplane.pb read.
  device: GpuDevice | None = None  # The GPU with the most kernel time.
  gpus: int = 0  # GPU planes in the capture (with or without kernels).
  step_ms: float | None = None  # Average step time (xprof's overview).
  device_busy_share: float | None = None  # Kernel time over the steps' time.
  input_share: float | None = None  # Step time waiting for input (xprof's analysis).
  # Step time xprof files under "All others": host gaps (Python, I/O, an input pipeline
  # TF did not attribute); with input_statement, xprof's own verdict on it.
  host_gap_share: float | None = None
  input_statement: str | None = None
  memcpy_ms: float = 0.0  # Device time in memcpys (host to device and back), all GPUs.
  split: Split = dataclasses.field(default_factory=Split)
  by_family: dict[str, float] = dataclasses.field(default_factory=dict)  # ms
  by_layer: dict[str, float] = dataclasses.field(default_factory=dict)  # ms
  kernels: list[Kernel] = dataclasses.field(default_factory=list)
  sixteen_bit_share: float | None = None  # Share of kernel time in 16-bit kernels.
  eligible_from: str = "xprof"  # "xprof" | "op type" (old captures: derived)
  notes: list[str] = dataclasses.field(default_factory=list)  # What it could not read.


@dataclasses.dataclass
class FamilyRow:
  """One op family's kernels in one policy's profiled steps (mpt/machine/gpu_table.py)."""
  family: str  # FAMILIES' name: conv, matmul, batchnorm, ...
  dtype: str  # The policy's compute dtype: float32, float16, bfloat16.
  ms: float  # Kernel time per step.
  tensor_core: float  # Share of it on Tensor Cores.
  cuda_cores_ms: float = 0.0  # Per step: Tensor-Core-eligible kernels on CUDA cores.
  kernel: str = ""  # The kernel with the most time, its name shortened.
  layers: list[str] = dataclasses.field(default_factory=list)  # Those CUDA-core
  # kernels' layers, most time first.
  ratio: float | None = None  # ms over float32's for the same family.


@dataclasses.dataclass
class GpuKernelTable:
  """The kernel table on a GPU: this model's step, profiled under each policy."""
  device: str  # The GPU, as the data sheet or the capture names it.
  steps: int  # Profiled steps per policy.
  rows: list[FamilyRow] = dataclasses.field(default_factory=list)
  notes: list[str] = dataclasses.field(default_factory=list)

  def as_table(self) -> dict:
    """In the CPU kernel table's shape (mpt/machine/kernels.py), for fastpath.py: an
    op family per row, its "impl" the Tensor Core share and the busiest kernel."""
    return {"kind": "gpu", "source": f"{self.device}: this model's step, profiled",
            "rows": [{"op": r.family, "dtype": r.dtype, "ms": r.ms, "ratio": r.ratio,
                      "impl": f"{r.tensor_core:.0%} on Tensor Cores ({r.kernel})",
                      "reference": False, "tensor_core": r.tensor_core,
                      "cuda_cores_ms": r.cuda_cores_ms, "layers": r.layers}
                     for r in self.rows]}
