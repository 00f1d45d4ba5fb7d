"""summary.json: the one record of a finished (or stopped) training run, typed.

`RunSummary` is the only writer and `read()` the only reader of the file: the training
run fills it in, the sweep takes a cell's figures from it, the diagnosis reads the
run it explains and the float32 run it compares with. `schema_version` 2 added the
version itself and `message`; a file without a version (written before) is version 1
and reads with the defaults below, in this one place. Keys a newer mpt wrote and this
one does not know are dropped on reading.
"""

import dataclasses
import json
import pathlib
from typing import Any

from mpt.errors import UserError
from mpt.records import rundir

SCHEMA_VERSION = 2
STATUSES = ("completed", "interrupted", "diverged", "oom", "failed")
# Two runs are the same configuration, apart from their policy and loop, when these
# fields are equal: a float32 run so is the baseline of a 16-bit one (the diagnosis'
# and `--mode=compare`'s speed-up vs float32).
SAME_CONFIG = ("model", "model_opts", "image_size", "batch_size", "dataset", "strategy",
               "jit_compile", "device", "input_work", "batchnorm", "onednn")
Stats = dict[str, Any]


@dataclasses.dataclass
class RunSummary:
  """What a run wrote to summary.json; None where it has no value (not measured)."""
  # How it ended, and where its folder is (None for a worker other than the chief).
  status: str = "failed"
  run_dir: str | None = None
  message: str | None = None  # Interrupted or diverged: what happened, what to do.
  # What ran.
  policy: str | None = None
  loop: str | None = None
  model: str | None = None
  model_opts: str = ""
  batchnorm: str = "keras"  # --batchnorm (files before it existed: Keras' layer)
  dataset: str | None = None
  data_source: str | None = None
  image_size: int | None = None
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
  step_time_ms: Stats | None = None
  timed_steps: int = 0
  data_wait_share: float | None = None
  images_per_sec: float | None = None
  train_s: float = 0.0
  wall_s: float = 0.0
  # Results.
  train_loss: float | None = None
  train_accuracy: float | None = None
  val_loss: float | None = None
  val_accuracy: float | None = None
  # Precision.
  loss_scale: float | None = None
  skipped_steps: int = 0
  slow_path_warning: str | None = None
  # The measured verdict on the policy here (mpt/machine/fastpath.py): evidence
  # (probe or flags), ratio to float32, the worst op and its kernel, the policy
  # measured fastest, the table's source. None: written before mpt measured it.
  kernels: dict[str, Any] | None = None
  # --policy=auto: each candidate's timed steps, the choice, what choosing cost.
  policy_choice: dict[str, Any] | None = None
  # This model's step timed under each policy before step 1 (mpt/records/cost.py's
  # Cost: predicted ms/step per policy, what was timed, what measuring cost). None:
  # not measured (a short run, a stand-in of none, or written before mpt measured it).
  cost: dict[str, Any] | None = None
  # TF's oneDNN rewrite: "on"/"off" as TF reported it in the run (None: written
  # before mpt recorded it), the variable as the run saw it, and why (OnednnChoice).
  onednn: str | None = None
  tf_enable_onednn_opts: str | None = None
  onednn_choice: dict[str, Any] | None = None
  # Memory: the preflight's estimate (this policy's breakdown, every policy's total,
  # what was available) and the measured peak (peak_rss_mb; gpu_peak_mb on a GPU),
  # with estimate_over_measured. None: written before mpt estimated memory.
  memory: dict[str, Any] | None = None
  flops_share_16bit: float | None = None
  # FLOP rates: the run's, the machine's peak, the microbenchmark's measured rate.
  flops_per_step: int | None = None
  achieved_gflops: float | None = None
  peak_gflops: float | None = None
  peak_source: str | None = None
  mfu: float | None = None
  microbench_gflops: float | None = None
  microbench_gflops_by_dtype: dict[str, float | None] = dataclasses.field(
      default_factory=dict)
  achieved_vs_microbench: float | None = None
  # Utilisation and checkpoints.
  util: dict[str, Stats] | None = None
  gpu_util_absent: bool | None = None
  checkpoint: str | None = None
  checkpoint_ms: Stats | None = None
  # The machine and the software.
  device: str | None = None
  hardware: dict[str, Any] = dataclasses.field(default_factory=dict)
  tf_version: str | None = None
  keras_version: str | None = None
  python_version: str | None = None
  # Distribution (mpt/train/distribute.py).
  strategy: str = "default"
  replicas: int = 1
  workers: int = 1
  task: str | None = None
  devices: list[str] = dataclasses.field(default_factory=list)
  per_replica_batch: int | None = None
  schema_version: int = SCHEMA_VERSION

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def write(self, path: pathlib.Path) -> None:
    """Writes summary.json atomically (a reader never sees half a file)."""
    rundir.write_json(path, self.to_dict())

  @classmethod
  def from_dict(cls, data: dict[str, Any]) -> "RunSummary":
    known = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in data.items() if k in known}
    values.setdefault("schema_version", 1)  # Written before the version existed.
    return cls(**values)


def read(path: pathlib.Path) -> RunSummary:
  """A summary.json, any schema version; UserError if it is not one."""
  try:
    data = json.loads(pathlib.Path(path).read_text())
  except (OSError, ValueError) as e:
    raise UserError(f"{path} cannot be read as JSON: {e}") from None
  if not isinstance(data, dict):
    raise UserError(f"{path} is not a run summary (a JSON object)")
  return RunSummary.from_dict(data)
