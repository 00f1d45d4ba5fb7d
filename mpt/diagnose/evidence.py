"""A run folder's evidence for the diagnosis: the files it needs, what it read from
them, and the runs next to it that it is compared with.

`load(run_dir)` reads summary.json as a `RunSummary` (mpt/records/summary.py: any schema
version, typed all the way down) and flags.txt as a `Config` (both required: a UserError
names the one that is missing), dtypes.json and the profiler's op statistics (optional:
a note says which checks that skips), and looks next to the run for the float32 run of
the same configuration (mpt/records/summary.py `baseline_of`: the one rule
`--mode=compare` uses too), the same run with the other --batchnorm, and the newest run
of each other policy; a GPU run's capture (mpt/diagnose/gpu_evidence.py) where it has
one. `Evidence` carries the figures the detectors derive from all of that.
`check_folder` tells a run, a sweep and a profile folder apart (any folder with a
capture: mpt/diagnose/profile.py). Plain data: TensorFlow is imported only through the
model registry, for the names of the variants.
"""

import dataclasses
import json
import pathlib
import shlex
from typing import Any

from mpt import config, speech
from mpt.diagnose import opstats
from mpt.diagnose.gpu_evidence import GpuEvidence
from mpt.errors import UserError
from mpt.machine import gpu_profile, hardware
from mpt.records import cost as cost_records
from mpt.records import summary as summary_lib
from mpt.records import numerics as numerics_lib
from mpt.records.machine import Hardware
from mpt.records.numerics import Numerics
from mpt.records.summary import RunSummary
from mpt.records.verdict import PolicyVerdict

REQUIRED = ("summary.json", "flags.txt")


@dataclasses.dataclass
class Evidence:
  """Everything the detectors may read about one run."""
  summary: RunSummary
  flags: config.Config | None  # flags.txt; None for a script's run (it has none).
  dtypes: dict[str, Any] | None = None  # dtypes.json (mpt/measure/dtypes.py)
  op_stats: dict[str, Any] | None = None  # op_stats.json (mpt/diagnose/opstats.py)
  baseline: RunSummary | None = None  # The float32 run of the same configuration.
  model_names: tuple[str, ...] = ()
  run_dir: pathlib.Path | None = None  # The folder diagnosed (its flags.txt replays it).
  # The same configuration with the other --batchnorm, completed, next to it.
  other_batchnorm: RunSummary | None = None
  # The newest completed run of the same configuration per other policy, next to it.
  siblings: dict[str, RunSummary] = dataclasses.field(default_factory=dict)
  gpu: GpuEvidence | None = None  # A GPU run's profiler capture, where it has one.
  numerics: Numerics | None = None  # numerics.json, where the run sampled it.
  # Completed float32 runs of the same configuration and length next to it (any
  # seed): float32's own spread of the final metrics.
  float32_runs: list[RunSummary] = dataclasses.field(default_factory=list)

  @property
  def speedup(self) -> float | None:
    """float32's ms/step over this run's, measured next to it: > 1 is faster."""
    return self.summary.speedup_vs(self.baseline)

  @property
  def verdict(self) -> PolicyVerdict | None:
    """The run's policy verdict when a measurement made it (this model's step timed
    per policy, or the kernel probe); None when only the CPU flags spoke, or the run
    predates it."""
    found = self.summary.policy_verdict
    return found if found and found.measured else None

  @property
  def top_ops(self) -> list[dict[str, Any]]:
    """The trace's op types by share of op time, largest first ([] without one)."""
    return (self.op_stats or {}).get("top_ops") or []

  def slowdown(self) -> tuple[float, str] | None:
    """(this 16-bit run's time over float32's, what measured it): "sibling runs" (the
    float32 run next to it), else "probe" (the verdict's ratio for this model)."""
    if self.speedup:
      return 1 / self.speedup, "sibling runs"
    found = self.verdict
    if found and found.ratio and self.summary.sixteen and (
        found.bound != cost_records.AT_MOST):  # An upper bound measures no slowdown.
      return found.ratio, "probe"
    return None

  def no_fast_path(self, policy: str | None = None) -> tuple[str, str] | None:
    """`no_fast_path` for `policy` (by default the 16-bit policy the run computes
    in, --layer_policy included, else its policy) on the run's machine."""
    return no_fast_path(self.summary.hardware,
                        policy or self.summary.sixteen or self.summary.policy)

  def rerun(self, policy: str, layer_policy: str = "") -> str:
    """The command that trains this run again under `policy` (flags.txt replayed),
    with a per-layer plan (`layer_policy`: --layer_policy's value); a script's run
    gets the plan as the DTypePolicyMap its run folder holds (policy_map.json)."""
    folder = self.run_dir or pathlib.Path(self.summary.run_dir or ".")
    if self.summary.script and layer_policy:  # A script's run with a per-layer plan.
      return (f"rerun your script with {speech.apply_line(folder / speech.MAP_FILE)} "
              f"({policy} with {layer_policy}) and a new run folder")
    if self.summary.script:  # A script's run (mpt.callbacks, mpt.track).
      return (f"rerun your script with keras.mixed_precision.set_global_policy("
              f"{policy!r}) and a new run folder")
    plan = f" --layer_policy={shlex.quote(layer_policy)}" if layer_policy else ""
    return (f"python -m mpt.main --flagfile={shlex.quote(str(folder / 'flags.txt'))} "
            f"--policy={policy}{plan}")

  def traced_share(self, op: str) -> float | None:
    """The share of traced op time in op type `op` (a kernel-table name such as
    `Conv2DBackpropFilterWithBias` or `MatMul/grad_input` counts as the TensorFlow op
    the trace groups it under); None without a trace or when it is not among the
    top."""
    want = opstats.canonical_type(op.split("/")[0])
    shares = [o["share"] for o in self.top_ops
              if opstats.canonical_type(o["type"]) == want]
    return sum(shares) if shares else None

  def layer_shares(self, names: list[str]) -> list[dict[str, Any]]:
    """Per named layer: dims, its share of the FLOPs dtypes.json's shares are of
    (`flops_of`), share of traced op time."""
    d = self.dtypes or {}
    rows = {r["name"]: r for r in d.get("layers", [])}
    total = d.get("forward_flops_per_example") or 1
    layer_time = (self.op_stats or {}).get("layer_time_share", {})
    # A row's flops_share: written since the step is counted; before, of the table.
    return [{"name": n, "class": rows[n]["class"], "dims": rows[n]["dims"],
             "flops_share": rows[n].get("flops_share", rows[n]["flops"] / total),
             "time_share": layer_time.get(n)}
            for n in names if n in rows]

  @property
  def flops_of(self) -> str:
    """What dtypes.json's FLOP shares are of: the step's FLOPs, counted from its
    graph, or (no step counted) the forward table's."""
    return (self.dtypes or {}).get("shares_of", "forward FLOPs")


def no_fast_path(hw: Hardware | None, policy: str) -> tuple[str, str] | None:
  """hardware.fast_path for `policy` on the machine a run recorded: (why it has no
  fast path, the policy to use), or None."""
  return hardware.fast_path(policy, set(hw.cpu_flags) if hw else set(),
                            hw.gpu_caps if hw else [], hw.cpu if hw else "this CPU")


def check_folder(path: pathlib.Path) -> str:
  """'run', 'sweep' or 'profile' (no run files at all, but a profiler capture under
  it: a TensorBoard logdir of any script); a UserError naming what is missing."""
  if not path.is_dir():
    raise UserError(f"--run={path}: no such folder")
  if (path / "sweep.csv").is_file():
    return "sweep"
  missing = [name for name in REQUIRED if not (path / name).is_file()]
  if missing == ["flags.txt"] and _script_run(path / "summary.json"):
    return "run"  # mpt.callbacks / mpt.track: summary.json's `program` says what ran.
  if len(missing) == len(REQUIRED) and gpu_profile.find_traces(path):
    return "profile"
  if missing:
    what = (" (it is a --mode=microbench folder)" if (path / "microbench.json").exists()
            else "" if len(missing) < len(REQUIRED) else
            ", and no profiler capture (*.xplane.pb) under it")
    raise UserError(f"--run={path}: missing {' and '.join(missing)}{what}; diagnose "
                    f"takes a training run folder (summary.json, flags.txt), a sweep "
                    f"folder (sweep.csv) or a profile folder (a TensorBoard logdir "
                    f"with plugins/profile/<run>/*.xplane.pb)")
  return "run"


def _script_run(path: pathlib.Path) -> bool:
  try:
    return summary_lib.read(path).script
  except UserError:
    return False


def _neighbours(run_dir: pathlib.Path) -> list[tuple[RunSummary, float]]:
  """(summary, mtime) of each completed, timed run next to `run_dir`."""
  found = []
  for path in run_dir.parent.glob("*/summary.json"):
    if path.parent == run_dir:
      continue
    try:
      other = summary_lib.read(path)
    except UserError:  # Not a summary: not a comparison either.
      continue
    if other.status == "completed" and other.ms_per_step:
      found.append((other, path.stat().st_mtime))
  return found


def _relatives(s: RunSummary, neighbours) -> dict[str, Any]:
  """Evidence's fields that come from the runs next to this one."""
  newest: dict[str, tuple[float, RunSummary]] = {}
  for other, mtime in neighbours:
    if other.policy != s.policy and summary_lib.same_config(other, s):
      if other.policy not in newest or mtime > newest[other.policy][0]:
        newest[other.policy] = (mtime, other)
  bn = [(mtime, other) for other, mtime in neighbours
        if other.batchnorm != s.batchnorm and other.policy == s.policy
        and other.loop == s.loop and summary_lib.same_config(other, s, but=("batchnorm",))]
  same_length = [(m, o) for o, m in neighbours if o.policy == "float32" and
                 summary_lib.same_config(o, s) and (o.epochs, o.steps) == (s.epochs, s.steps)]
  return {"baseline": summary_lib.baseline_of(s, [(o, m, o) for o, m in neighbours]),
          "float32_runs": [o for _, o in sorted(same_length, key=lambda f: f[0])],
          "siblings": {p: other for p, (_, other) in newest.items()},
          "other_batchnorm": max(bn, key=lambda f: f[0])[1] if bn else None}


def _notes(s: RunSummary, op_stats, notes: list[str]) -> None:
  """What the diagnosis could not read, and where measurements disagree."""
  if op_stats is None and s.sixteen:
    notes.append("no profiler trace: for op-level evidence rerun with "
                 "--profile_steps=A,B (steps after the warm-up)")
  if not s.hardware:
    notes.append("summary.json records no hardware facts (a run made before mpt "
                 "recorded them): the hardware checks were skipped")
  for what, why in s.not_measured.items():
    notes.append(f"not measured ({what.replace('_', ' ')}): {why}")
  for row in (s.cost.policies if s.cost else []):
    if row.from_run:  # The run's own steps outrank the timing before step 1.
      notes.append(f"the step's cost per policy: {row.from_run}; the record and this "
                   "diagnosis take the run's")
  found = s.policy_verdict
  if found is None:
    notes.append("summary.json records no kernel verdict (a run made before mpt "
                 "measured its kernels): the slow-kernel and faster-policy checks had "
                 "nothing to read, the CPU flags decide")
    return
  if found.note:
    notes.append(f"kernel table: {found.note}")
  if found.evidence in ("cost", "probe") and found.contradicts:
    what, short = (("kernel probe", "probe") if found.evidence == "probe" else
                   ("step's timing", "timing"))
    notes.append(f"the {what} and the CPU flags disagree: "
                 f"{found.contradicts}; the diagnosis follows the {short}")


def load(run_dir: pathlib.Path, notes: list[str]) -> Evidence:
  s = summary_lib.read(run_dir / "summary.json")
  flags = None if s.script else _flags(run_dir / "flags.txt")
  dtypes = None
  if (run_dir / "dtypes.json").is_file():
    try:
      dtypes = json.loads((run_dir / "dtypes.json").read_text())
    except (OSError, ValueError) as e:
      raise UserError(f"{run_dir / 'dtypes.json'} cannot be read as JSON: {e}") from None
  else:
    notes.append("dtypes.json missing (a --noinstrument run): the misaligned-shape and "
                 "float32-work checks were skipped")
  op_stats = None
  try:
    op_stats = opstats.load(run_dir, dtypes)
  except Exception as e:  # A broken trace or no xprof: the rest still holds.
    notes.append(f"the profiler trace could not be read ({type(e).__name__}: {e})")
  _notes(s, op_stats, notes)
  try:
    from mpt import models  # Registered variants, for the "aligned" suggestion.
    names = tuple(models.names())
  except ImportError:
    names = ()
  ev = Evidence(s, flags, dtypes, op_stats, model_names=names, run_dir=run_dir,
                **_relatives(s, _neighbours(run_dir)))
  ev.gpu = _gpu(ev, notes)
  try:
    ev.numerics = numerics_lib.read(run_dir)
  except (OSError, ValueError) as e:
    notes.append(f"numerics.json could not be read ({type(e).__name__}: {e})")
  if ev.numerics:
    notes += [f"numerics not measured ({k}): {v}" for k, v in ev.numerics.not_measured.items()]
  return ev


def _flags(path: pathlib.Path) -> config.Config:
  try:
    return config.from_flagfile(path.read_text())
  except (OSError, UserError) as e:
    raise UserError(f"{path}: {e}") from None


def _gpu(ev: Evidence, notes: list[str]) -> GpuEvidence | None:
  """A GPU run's capture, read for its kernels; None on a CPU or without a trace."""
  trace = opstats.find_trace(ev.run_dir)
  if trace is None or not (ev.summary.device or "").startswith("GPU"):
    return None
  try:
    profile = gpu_profile.read(trace)
  except UserError as e:
    notes.append(f"the GPU capture could not be read: {e}")
    return None
  notes += [f"GPU capture: {note}" for note in profile.notes]
  if profile.device is None:
    return None
  return GpuEvidence(profile, ev.summary.policy, ev.rerun, ev.summary.layer_policy or "")
