"""summary.json: the one record of a finished (or stopped) training run, typed.

`RunSummary` is the only writer and `read()` the only reader of the file: the training
run fills it in, the sweep takes a cell's figures from it, the diagnosis reads the
run it explains and the float32 run it compares with, all as types: its sub-records
are the dataclasses of mpt/records/ (verdict.py, memory.py, machine.py, cost.py),
read back through mpt/records/typed.py.

Old files read, by one set of rules in `upgrade()`: a file without a version is
version 1 (its missing fields take the defaults below); version 2 added the version
itself and `message`; version 3 named the policy verdict for what it holds
(`policy_verdict`, written as `kernels` before); version 4 added `api` (which entry
point made the run: a script's run was told by its dataset "user" before) and a
script's `program` record; version 5 dropped the copies of other records
(`slow_path_warning`, `onednn`, `tf_enable_onednn_opts`, `microbench_gflops`: still
read, as properties of the records they copied) and added `layer_policy` and
`layer_costs`; version 6 writes each per-policy figure once, in `cost`: the
verdict's ratios where it rests on the cost, and `--policy=auto`'s uniform
candidates' times, are read back from it (`_from_cost`; before, they were copies and
the verdict also copied each policy's ms as `step_ms`). Keys a newer mpt wrote and
this one does not know are dropped on reading.
"""

import dataclasses
import json
import pathlib
from typing import Any

from mpt.errors import UserError
from mpt import config
from mpt import files
from mpt.records import typed
from mpt.records.cost import Cost, OnednnChoice
from mpt.records.layers import LayerCosts
from mpt.records.machine import Hardware, Utilisation
from mpt.records.memory import MemoryPlan
from mpt.records.numerics import Overflow
from mpt.records.program import Program
from mpt.records.verdict import Candidate, PolicyChoice, PolicyVerdict

SCHEMA_VERSION = 6
# Two runs are the same configuration, apart from their policy and loop, when these
# fields are equal: a float32 run so is the baseline of a 16-bit one (the diagnosis'
# and `--mode=compare`'s speed-up vs float32).
SAME_CONFIG = ("model", "model_opts", "image_size", "batch_size", "dataset", "strategy",
               "jit_compile", "device", "input_work", "batchnorm", "onednn")


@dataclasses.dataclass
class RunSummary:
  """What a run wrote to summary.json; None where it has no value (not measured)."""
  # How it ended, and where its folder is (None for a worker other than the chief).
  status: str = "failed"
  run_dir: str | None = None
  message: str | None = None  # Interrupted or diverged: what happened, what to do.
  stop_signal: str | None = None  # Interrupted by a signal: which (SIGTERM, SIGHUP, ...).
  # Which entry point ran it: "cli" (python -m mpt: flags.txt replays it), or a
  # script's "mpt.callbacks" / "mpt.track" (`program` says what it ran).
  api: str = "cli"
  program: Program | None = None
  # What ran.
  policy: str | None = None
  # --layer_policy: the layers kept in another policy ("" : none).
  layer_policy: str = ""
  loop: str | None = None
  model: str | None = None
  model_opts: str = ""
  batchnorm: str = "keras"  # --batchnorm (files before it existed: Keras' layer)
  dataset: str | None = None
  data_source: str | None = None
  image_size: int | None = None  # None: the inputs are not images (program.inputs).
  batch_size: int | None = None
  input_work: int = 0
  jit_compile: bool = False
  instrument: bool = True
  seed: int = 0
  deterministic: bool = False
  resumed: bool = False
  checkpoints: bool = True  # False: --checkpoint=false, the run cannot be resumed.
  compute_dtype: str | None = None
  variable_dtype: str | None = None
  # How far it got.
  epochs: int | None = None
  epochs_completed: int = 0
  steps_per_epoch: int | None = None
  steps: int = 0
  warmup_steps: int = 0
  n_train: int | None = None
  n_val: int | None = None
  skipped_files: int = 0
  skipped_file_names: list[str] = dataclasses.field(default_factory=list)
  # Speed.
  ms_per_step: float | None = None
  step_time_ms: dict[str, Any] | None = None  # Its median, mean, ...
  timed_steps: int = 0
  data_wait_share: float | None = None
  images_per_sec: float | None = None  # None where the inputs are not images.
  examples_per_sec: float | None = None
  train_s: float = 0.0
  wall_s: float = 0.0
  # Results.
  train_loss: float | None = None
  train_accuracy: float | None = None
  val_loss: float | None = None
  val_accuracy: float | None = None
  # Every figure of the last epoch's logs, by Keras' name (accuracy above is the one
  # accuracy metric among them, whatever its name: binary_accuracy, acc, ...).
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)
  # Precision.
  loss_scale: float | None = None
  skipped_steps: int = 0
  # Why steps were skipped: each replayed skipped step's first non-finite op and its
  # layer (numerics.json `overflows`, its owner, copied here as the run's headline).
  skip_causes: list[Overflow] = dataclasses.field(default_factory=list)
  # What this run could not measure, by what ({"cost": why, "data_wait": why}): a
  # script's run (mpt.callbacks, mpt.track) says so instead of leaving a gap.
  not_measured: dict[str, str] = dataclasses.field(default_factory=dict)
  # The measured verdict on the policy here (mpt/machine/fastpath.py): evidence
  # (cost, probe or flags), ratio to float32, the worst op and its kernel, the policy
  # measured fastest, the table's source. None: written before mpt measured it.
  policy_verdict: PolicyVerdict | None = None
  # --policy=auto: each candidate's timed steps, the choice, what choosing cost.
  policy_choice: PolicyChoice | None = None
  # This model's step timed under each policy before step 1 (predicted ms/step per
  # policy, what was timed, what measuring cost). None: not measured (a short run, a
  # stand-in of none, or written before mpt measured it).
  cost: Cost | None = None
  # Each layer's forward and backward ms per policy, the casts and the optimizer
  # (mpt/measure/layercost.py), where measured: to explain a 16-bit policy measured
  # slower than float32, or found in the cache.
  layer_costs: LayerCosts | None = None
  # TF's oneDNN rewrite: its state as TF reported it in the run, the variable as the
  # run saw it, and why (OnednnChoice; None: written before mpt recorded it).
  onednn_choice: OnednnChoice | None = None
  # Memory: the preflight's estimate (this policy's breakdown, every policy's total,
  # what was available) and the measured peak (peak_rss_mb; gpu_peak_mb on a GPU),
  # with estimate_over_measured. None: written before mpt estimated memory.
  memory: MemoryPlan | None = None
  flops_share_16bit: float | None = None
  # FLOP rates: the run's, the machine's peak, the microbenchmark's measured rate.
  # flops_per_step: one step at the global batch, and how it was counted
  # (flops_counted_by: the traced step's graph, mpt/train/common/stepflops.py; None:
  # not counted, not_measured["flops"] says why). flops_matmul: of which the
  # MatMul/BatchMatMul/Einsum/convolution ops.
  flops_per_step: int | None = None
  flops_counted_by: str | None = None
  flops_matmul: int | None = None
  achieved_gflops: float | None = None
  peak_gflops: float | None = None
  peak_source: str | None = None
  mfu: float | None = None
  microbench_gflops_by_dtype: dict[str, float | None] = dataclasses.field(
      default_factory=dict)
  achieved_vs_microbench: float | None = None
  # Utilisation and checkpoints.
  util: Utilisation | None = None
  gpu_util_absent: bool | None = None
  checkpoint: str | None = None
  checkpoint_ms: dict[str, Any] | None = None  # Its median, mean, ...
  # The machine and the software.
  device: str | None = None
  hardware: Hardware | None = None  # None: written before mpt recorded it.
  tf_version: str | None = None
  keras_version: str | None = None
  python_version: str | None = None
  # Distribution (mpt/train/cli/distribute.py).
  strategy: str = "default"
  replicas: int = 1
  workers: int = 1
  task: str | None = None
  devices: list[str] = dataclasses.field(default_factory=list)
  per_replica_batch: int | None = None
  schema_version: int = SCHEMA_VERSION

  def to_dict(self) -> dict[str, Any]:
    """The file's content: each per-policy figure once, in `cost`."""
    data = typed.to_dict(self)
    if self.cost is not None:
      verdict, choice = data.get("policy_verdict"), data.get("policy_choice")
      if verdict and verdict["evidence"] == "cost":
        verdict.pop("policy_ratios")
      for row, candidate in zip((choice or {}).get("candidates", []),
                                self.policy_choice.candidates if choice else []):
        for name in Candidate.TIMED if candidate.from_cost else ():
          row.pop(name)
    return data

  def write(self, path: pathlib.Path) -> None:
    """Writes summary.json atomically (a reader never sees half a file)."""
    files.write_json(path, self.to_dict())

  @classmethod
  def from_dict(cls, data: dict[str, Any],
                unknown: list[str] | None = None) -> "RunSummary":
    """Any version's summary.json, as this version's record; `unknown` collects the
    keys it has no field for (mpt/records/typed.py)."""
    return _from_cost(typed.from_dict(cls, upgrade(data), unknown))

  # Figures derived from the record, for every reader. Versions before 5 also wrote
  # the first three as copies (`upgrade` folds them into the records they copied).
  @property
  def slow_path_warning(self) -> str | None:
    """The warning printed before step 1 (the policy verdict's text), or None."""
    return self.policy_verdict.text if self.policy_verdict else None

  @property
  def onednn(self) -> str | None:
    """"on" / "off": TF's oneDNN rewrite in the run; None where not recorded."""
    return self.onednn_choice.label() if self.onednn_choice else None

  @property
  def tf_enable_onednn_opts(self) -> str | None:
    return self.onednn_choice.env if self.onednn_choice else None

  @property
  def microbench_gflops(self) -> float | None:
    """The microbenchmark's matmul rate here in the run's compute dtype."""
    return (self.microbench_gflops_by_dtype or {}).get(self.compute_dtype or "")

  @property
  def sixteen(self) -> str | None:
    """The 16-bit policy the run computes in, --layer_policy included
    (config.sixteen_bit); None: a float32 run."""
    return config.sixteen_bit(self.policy or "",
                              config.layer_policies(self.layer_policy or ""))

  @property
  def script(self) -> bool:
    """A user's script made the run (mpt.callbacks, mpt.track): no flags.txt, and
    advice speaks its API, not the command line's flags."""
    return self.api != "cli"

  def speedup_vs(self, baseline: "RunSummary | None") -> float | None:
    """`baseline`'s ms/step over this run's: > 1 means this run is faster."""
    ms, base = self.ms_per_step, baseline.ms_per_step if baseline else None
    return base / ms if ms and base else None

  @property
  def gpu_caps(self) -> list[tuple[int, int]]:
    return self.hardware.gpu_caps if self.hardware else []

  def busy(self) -> tuple[float | None, str]:  # Utilisation.busy, from the sampler.
    return self.util.busy(self.hardware) if self.util else (None, "")

  def others(self) -> float | None:  # Utilisation.others.
    return self.util.others(self.hardware) if self.util else None


def achieved_gflops(flops_per_step: float | None,
                    ms_per_step: float | None) -> float | None:
  """The FLOP rate a training step achieved, in GFLOP/s; None without both figures."""
  if not flops_per_step or not ms_per_step:
    return None
  return flops_per_step / ms_per_step * 1e3 / 1e9


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
  """An older version's summary.json as this version's keys: the one place that
  knows what each version wrote."""
  data = dict(data)
  version = data.setdefault("schema_version", 1)  # Written before the version existed.
  if version < 3 and "kernels" in data:  # The policy verdict's name before version 3.
    data["policy_verdict"] = data.pop("kernels")
  if version < 4 and data.get("dataset") == "user":  # A script's run, before `api`.
    data["api"] = "mpt.track" if data.get("loop") == "custom" else "mpt.callbacks"
  if not data.get("hardware"):  # Versions 1-2 wrote {} when nothing was recorded.
    data.pop("hardware", None)
  # Versions 1-4 wrote copies beside the records they copied: folded back in (a copy a
  # file was edited through wins, as the reader of that version would have read it).
  # The warning is dropped: it was the verdict's text, or (before version 3) the
  # flags' warning no reader of this version reads.
  data.pop("slow_path_warning", None)
  (data.get("policy_verdict") or {}).pop("step_ms", None)  # Cost's, copied (1-5).
  state, env = data.pop("onednn", None), data.pop("tf_enable_onednn_opts", None)
  if state in ("on", "off") or env is not None:
    choice = dict(data.get("onednn_choice") or {"tf_default": None, "env": None})
    if state in ("on", "off"):
      choice["on"] = state == "on"
    choice.setdefault("on", None)
    choice["env"] = env if env is not None else choice.get("env")
    data["onednn_choice"] = choice
  rate = data.pop("microbench_gflops", None)
  if rate is not None and data.get("compute_dtype"):
    data["microbench_gflops_by_dtype"] = {
        **(data.get("microbench_gflops_by_dtype") or {}), data["compute_dtype"]: rate}
  return data


def _from_cost(summary: RunSummary) -> RunSummary:
  """The figures a version-6 file keeps in `cost` only, back where readers look:
  the verdict's ratios (where it rests on the cost), the uniform candidates' times."""
  cost, verdict, choice = summary.cost, summary.policy_verdict, summary.policy_choice
  if cost is None:
    return summary
  if verdict and verdict.evidence == "cost" and not verdict.policy_ratios:
    verdict.policy_ratios = cost.ratios()
  base = cost.predicted().get("float32")
  for candidate in choice.candidates if choice else []:
    row = cost.of(candidate.policy)
    if candidate.from_cost and row and candidate.ms_per_step is None:
      candidate.timed_by(row, base)
  return summary


def same_config(a: RunSummary, b: RunSummary, but: tuple[str, ...] = ()) -> bool:
  """Whether two runs are the same configuration (SAME_CONFIG), apart from `but`."""
  return all(getattr(a, k) == getattr(b, k) for k in SAME_CONFIG if k not in but)


def baseline_of(summary: RunSummary, candidates):
  """The float32 run `summary` is compared with: among `candidates`, (RunSummary,
  mtime, item) triples of finished, timed runs, the item of the newest float32 run of
  the same configuration, the same loop preferred; None for a float32 run itself or
  when there is none."""
  if summary.policy == "float32":
    return None
  found = [((other.loop == summary.loop, mtime), item)
           for other, mtime, item in candidates
           if other.policy == "float32" and same_config(other, summary)]
  return max(found, key=lambda f: f[0])[1] if found else None


def read(path: pathlib.Path) -> RunSummary:
  """A summary.json, any schema version; UserError if it is not one."""
  try:
    data = json.loads(pathlib.Path(path).read_text())
  except (OSError, ValueError) as e:
    raise UserError(f"{path} cannot be read as JSON: {e}") from None
  if not isinstance(data, dict):
    raise UserError(f"{path} is not a run summary (a JSON object)")
  try:
    return RunSummary.from_dict(data)
  except ValueError as e:  # A sub-record that is not one.
    raise UserError(f"{path} is not a run summary: {e}") from None
