"""cost.json: what one model's training step costs here under each policy, measured
before step 1, and the choice of TensorFlow's oneDNN rewrite; typed, with its cache.

`Cost` is one measurement: the model's compiled train step (mpt/train/before_step1/cost.py) timed
under each policy at one batch, with TF's oneDNN rewrite on or off, and the ms/step it
predicts at the run's batch. `OnednnChoice` is the setting a run trains with and why
(measured, forced, or TF's default). Both are written by the process that measured or
chose, read by the training run (summary.json `cost`, `onednn_choice`), the diagnosis
and `--policy=auto`, and cached per model signature / batch / CPU / TF version /
setting under ~/.cache/mpt/cost/ (or $MPT_CACHE): this module is their one reader and
writer.
"""

import dataclasses
import json
import pathlib
from typing import Any

from mpt import files
from mpt.config import Config
from mpt.records import keyed
from mpt.records import typed
from mpt.records.gpu import GpuKernelTable

SCHEMA = 1
# What a timing stopped before it settled says of its figure (mpt/measure/timer.py):
# its steady step is at most, or at least, that.
AT_MOST, AT_LEAST = "at most", "at least"
# A oneDNN setting must measure this much faster than TF's default to replace it (the
# command line's choice, mpt/train/before_step1/onednn_choice.py) or to be advised (a
# script's, mpt/measure/rewrite.py).
ONEDNN_MARGIN = 0.05
# A per-layer plan is adopted (--policy=auto, mpt/train/before_step1/autopolicy.py) only
# when it measures this much faster than the best uniform policy, side by side.
PLAN_MARGIN = 0.05
# A run of fewer steps costs about as much as measuring its step per policy (three
# traces and first calls, a dozen steps): neither the cost nor the oneDNN choice is
# measured for it.
MIN_RUN_STEPS = 20


@dataclasses.dataclass
class PolicyCost:
  """One policy's step, timed at the run's batch by the one timer
  (mpt/measure/timer.py)."""
  policy: str
  # Settled: the median of its last calls; a bound's value where `bound` says so; the
  # kernel table's prediction where `predicted`; None: not timed.
  ms_per_step: float | None = None
  first_ms: float | None = None  # The first call (its graph optimised: the trace's).
  trace_s: float | None = None  # Tracing and building the step.
  steps_timed: int = 0  # Calls timed after the first.
  spread: float | None = None  # Of its last calls: (max - min) / median.
  # "at most" / "at least": timing stopped before its calls settled, and that is all
  # its figure says (mpt/measure/timer.py); None: a figure.
  bound: str | None = None
  # Why timing stopped before its calls settled, failed, or was not done (predicted
  # from the kernel table, a budget spent); None: settled.
  stopped: str | None = None
  # A per-layer plan over the policy (--layer_policy's value); "": the uniform policy.
  layer_policy: str = ""
  predicted: bool = False  # ms_per_step is float32's by the kernel table's ratio.
  finite: bool = True  # The loss of every call timed was finite.
  # The XLA setting where it is not the run's (--jit_compile's other), else None.
  jit_compile: bool | None = None
  # Where the run's own steps replaced the figure timed before step 1: the run, both
  # figures (said in the diagnosis); and the figure as timed. None: as timed.
  from_run: str | None = None
  timed_ms: float | None = None
  # Not timed because measuring it would pass the share of a run of this many planned
  # steps (mpt/train/before_step1/cost.py); None: not skipped so.
  skipped_at: int | None = None

  def known_for(self, planned_steps: int | None) -> bool:
    """Whether a run of `planned_steps` (None: any length) has nothing more to time
    here: a figure, a bound, a prediction, a failure, or a skip for a run at least as
    long (a longer run can pay for timing it)."""
    return (self.ms_per_step is not None or (self.stopped or "").startswith("failed")
            or bool(self.skipped_at and planned_steps
                    and planned_steps <= self.skipped_at))


@dataclasses.dataclass
class Cost(typed.Record):
  """One measurement of a model's step per policy, under one oneDNN setting."""
  key: dict[str, Any]  # What it is valid for (cache_key's fields).
  onednn: bool | None  # TF's oneDNN rewrite in the measuring process.
  batch: int = 0       # The batch it was timed at: one device's batch of the run.
  policies: list[PolicyCost] = dataclasses.field(default_factory=list)
  seconds: float = 0.0  # What measuring cost, wall time, the TF import excluded.
  source: str = "measured"  # measured | cache: PATH | recorded: PATH
  schema: int = SCHEMA
  # What each candidate ran: mpt's train step on random inputs (the command line), or
  # the step a script's program runs, on a batch it fed (mpt/train/before_step1/
  # scriptcost.py).
  timed: str = "mpt's train step on random inputs of the run's shape"
  # On a GPU: the kernel table from the step profiled per policy, or why there is none.
  gpu_kernels: GpuKernelTable | None = None
  gpu_kernels_note: str | None = None

  def of(self, policy: str, layer_policy: str = "",
         jit_compile: bool | None = None) -> PolicyCost | None:
    return next((p for p in self.policies if p.policy == policy
                 and p.layer_policy == layer_policy and p.jit_compile == jit_compile),
                None)

  def predicted(self) -> dict[str, float]:
    """{policy: predicted ms/step} for the uniform policies with a figure (a bound is
    not one: `bounds`)."""
    return {p.policy: p.ms_per_step for p in self.policies
            if p.ms_per_step and not p.bound and not p.layer_policy
            and p.jit_compile is None}

  def bounds(self) -> dict[str, tuple[str, float]]:
    """{policy: (its bound, "at most" or "at least", its time over float32's)} for the
    uniform policies whose timing stopped before it settled."""
    base = self.predicted().get("float32")
    return {p.policy: (p.bound, p.ms_per_step / base) for p in self.policies
            if p.bound and p.ms_per_step and base and not p.layer_policy
            and p.jit_compile is None}

  def plans(self) -> list[PolicyCost]:
    """The per-layer plans timed beside the uniform policies."""
    return [p for p in self.policies if p.layer_policy]

  def ratios(self) -> dict[str, float]:
    """{policy: predicted time over float32's}; empty without float32."""
    return ratios(self.predicted())


@dataclasses.dataclass
class OnednnChoice(typed.Record):
  """TF's oneDNN rewrite for a run: its state, the variable set, and why."""
  on: bool | None                 # The rewrite's state the run trains with.
  env: str | None                 # TF_ENABLE_ONEDNN_OPTS as the run saw it (None: unset).
  tf_default: bool | None         # TF's own default on this CPU.
  chosen_by: str = "TF's default"  # measured | --onednn | environment | TF's default
  why: str = ""
  # The run policy's ms/step with the rewrite on and off (measured choice), and what
  # measuring them cost (wall seconds, the children's TF imports included).
  measured_ms: dict[str, float] = dataclasses.field(default_factory=dict)
  seconds: float = 0.0
  # What `measured_ms` are of: the command line's step, or a script's op families'
  # kernels (mpt/measure/rewrite.py).
  measured: str = "this model's step"
  # What a cached choice is valid for (records/keyed.py): the machine and the model
  # family; {} where it is not cached.
  key: dict[str, Any] = dataclasses.field(default_factory=dict)
  source: str = "measured"

  def label(self) -> str:
    return "unknown" if self.on is None else "on" if self.on else "off"

  def short(self) -> str:
    """`on (measured faster)`, `off (TF's default)`, ... for a line."""
    by = {"measured": "measured faster" if self.on else "measured, TF's default kept",
          "environment": f"TF_ENABLE_ONEDNN_OPTS={self.env}"}.get(self.chosen_by,
                                                                   self.chosen_by)
    return f"{self.label()} ({by})"


def ratios(ms: dict[str, float] | None) -> dict[str, float]:
  """{policy: its ms over float32's} of a {policy: ms/step}: the one ratio to float32;
  empty without float32."""
  base = (ms or {}).get("float32")
  return {p: v / base for p, v in ms.items()} if base else {}


def times(ratio: float) -> str:
  """A ratio as every line mpt prints says it, three significant digits: "0.567x",
  "2x", "22.3x", "231x", "1,480x". A policy's ratio is its time over float32's (above
  1 is slower); a speed-up says "faster" in its own words."""
  return f"{ratio:.3g}x" if ratio < 1000 else f"{ratio:,.0f}x"


def one_line(cost: Cost, onednn: str) -> str:
  """`mpt: cost here, oneDNN's rewrite ..., measured in ...: float32 ~200 ms/step,
  mixed_float16 ~740 (3.7x), mixed_bfloat16 at most ~3,108 (at most 8.7x: timing
  stopped ...)`."""
  base, parts = cost.predicted().get("float32"), []
  for p in cost.policies:
    name = p.policy + (f" with {p.layer_policy}" if p.layer_policy else "") + (
        f" with XLA {'on' if p.jit_compile else 'off'}" if p.jit_compile is not None
        else "")
    if not p.ms_per_step:
      parts.append(f"{name} ? ({p.stopped or 'not measured'})")
      continue
    ms = f"~{p.ms_per_step:,.0f}" if p.ms_per_step >= 10 else f"~{p.ms_per_step:.1f}"
    bound = f"{p.bound} " if p.bound else ""
    if p.policy == "float32" and not p.layer_policy and p.jit_compile is None:
      parts.append(f"{name} {bound}{ms} ms/step")
      continue
    ratio = f"{bound}{times(p.ms_per_step / base)}" if base else "?"
    how = ("predicted from the kernel table" if p.predicted else p.stopped.split(":")[0]
           if p.stopped else "")
    parts.append(f"{name} {bound}{ms} ({ratio}{': ' + how if how else ''})")
  how = (f"measured in {cost.seconds:.1f} s at batch {cost.batch}"
         if cost.source == "measured" else cost.source)
  return f"mpt: cost here, oneDNN's rewrite {onednn}, {how}: " + ", ".join(parts)


def device_batch(cfg: Config) -> int:
  """The batch one device's step runs: the global batch split over --cpu_devices
  replicas under --strategy=mirrored (a GPU machine's replicas are not known before
  TensorFlow starts: the global batch stands)."""
  replicas = cfg.cpu_devices if cfg.strategy == "mirrored" and cfg.cpu_devices else 1
  return max(1, cfg.batch_size // replicas)


def key_for(cfg: Config, onednn: bool | None, cpu) -> dict[str, Any]:
  """What makes two measurements interchangeable: the model's signature, the device
  batch, the machine (`cpu`: mpt/machine/isa.py's detect()), TensorFlow and the oneDNN
  setting (the classifier's width is not in it: the head is measured with 10 classes,
  a small share of any step)."""
  return {"model": cfg.model, "model_opts": cfg.model_opts, "image_size": cfg.image_size,
          "batch": device_batch(cfg), "batchnorm": cfg.batchnorm,
          "jit_compile": cfg.jit_compile, **machine_key(onednn, cpu)}


def machine_key(onednn: bool | None, cpu) -> dict[str, Any]:
  """The part of every measurement's key that is the machine: the CPU, its logical
  cores, TensorFlow and its oneDNN setting (a script's step keys on it too,
  mpt/train/before_step1/scriptcost.py)."""
  return {"cpu": cpu.name, "logical_cpus": cpu.logical_cpus,
          "tf_version": files.tf_version(), "onednn": onednn}


def read(path: pathlib.Path) -> Cost:
  """A cost.json; ValueError/OSError if it is not one of this schema."""
  return keyed.read(path, SCHEMA, "cost", Cost.from_dict)


def cached(key: dict[str, Any]) -> Cost | None:
  """The cached measurement for `key`, or None (missing, unreadable, another key)."""
  return keyed.cached("cost", key, read)


def save(cost: Cost) -> pathlib.Path | None:
  """Caches a measurement that measured float32 (nothing to predict from otherwise)."""
  return keyed.save("cost", cost) if cost.predicted().get("float32") else None


def read_choice(path: pathlib.Path) -> OnednnChoice:
  """A choice `write` wrote; ValueError/OSError/TypeError if it is not one."""
  return OnednnChoice.from_dict(json.loads(pathlib.Path(path).read_text()))


def write(path: pathlib.Path, obj: Cost | OnednnChoice) -> None:
  files.write_json(pathlib.Path(path), obj.to_dict())
