"""A run folder's evidence for the diagnosis: the files it needs, what it read from
them, and the float32 run of the same configuration it is compared with.

`load(run_dir)` reads summary.json (through mpt/records/summary.py: any schema
version) and flags.txt (required: a UserError names the one that is missing),
dtypes.json and the profiler's op statistics (optional: a note says which checks that
skips), and looks next to the run for a completed float32 run with the same model,
options, image size, batch, dataset, strategy, XLA setting, device and input work
(the same loop preferred, then the newest). Plain data: TensorFlow is
imported only through the model registry, for the names of the variants.

summary.json's `kernels` block is the run's measured verdict on its policy here
(mpt/machine/fastpath.py: the kernel probe's table, or the CPU flags when nothing was
measured); `kernels(ev)` returns it when it rests on the probe, and `slowdown(ev)` is
the run's loss against float32: measured by the float32 run next to it, else the
probe's ratio for this model's ops.
"""

import dataclasses
import json
import pathlib
import shlex
from typing import Any

from mpt import config
from mpt.diagnose import opstats
from mpt.errors import UserError
from mpt.machine import hardware
from mpt.records import summary as summary_lib

REQUIRED = ("summary.json", "flags.txt")
# A float32 run is comparable when these match (the loop is preferred, not required).
SAME = summary_lib.SAME_CONFIG


@dataclasses.dataclass
class Evidence:
  """Everything the detectors may read about one run."""
  # summary.json as RunSummary.to_dict(): every field, its default where the file
  # has none; a dict, so that the detectors (and the tests) read and patch it freely.
  summary: dict[str, Any]
  flags: dict[str, Any]
  dtypes: dict[str, Any] | None = None
  op_stats: dict[str, Any] | None = None
  baseline: dict[str, Any] | None = None  # float32 summary of the same configuration
  model_names: tuple[str, ...] = ()
  run_dir: pathlib.Path | None = None  # The folder diagnosed (its flags.txt replays it).
  # The same configuration with the other --batchnorm, completed, next to it.
  other_batchnorm: dict[str, Any] | None = None
  # The newest completed run of the same configuration per other policy, next to it.
  siblings: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


def _read_json(path: pathlib.Path) -> dict[str, Any]:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise UserError(f"{path} cannot be read as JSON: {e}") from None


def check_folder(path: pathlib.Path) -> str:
  """'run' or 'sweep'; a UserError naming the missing file otherwise."""
  if not path.is_dir():
    raise UserError(f"--run={path}: no such folder")
  if (path / "sweep.csv").is_file():
    return "sweep"
  missing = [name for name in REQUIRED if not (path / name).is_file()]
  if missing:
    what = (" (it is a --mode=microbench folder)" if (path / "microbench.json").exists()
            else "")
    raise UserError(f"--run={path}: missing {' and '.join(missing)}{what}; diagnose "
                    f"takes a training run folder (summary.json, flags.txt) or a sweep "
                    f"folder (sweep.csv)")
  return "run"


def _neighbours(run_dir: pathlib.Path):
  """(mtime, summary dict) of each completed, timed run next to `run_dir`."""
  for path in run_dir.parent.glob("*/summary.json"):
    if path.parent == run_dir:
      continue
    try:
      other = summary_lib.read(path).to_dict()
    except UserError:  # Not a summary: not a comparison either.
      continue
    if other.get("status") == "completed" and other.get("ms_per_step"):
      yield path.stat().st_mtime, other


def find_baseline(run_dir: pathlib.Path, summary: dict[str, Any]) -> dict[str, Any] | None:
  """The newest completed float32 run of the same configuration next to `run_dir`
  (the same loop preferred)."""
  if summary.get("policy") == "float32":
    return None
  found = [(other.get("loop") == summary.get("loop"), mtime, other)
           for mtime, other in _neighbours(run_dir)
           if other.get("policy") == "float32"
           and all(other.get(k) == summary.get(k) for k in SAME)]
  return max(found, key=lambda f: f[:2])[2] if found else None


def find_siblings(run_dir: pathlib.Path,
                  summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
  """{policy: the newest completed run of the same configuration under it}, for the
  policies other than this run's."""
  found: dict[str, tuple[float, dict[str, Any]]] = {}
  for mtime, other in _neighbours(run_dir):
    policy = other.get("policy")
    if policy != summary.get("policy") and all(other.get(k) == summary.get(k)
                                               for k in SAME):
      if policy not in found or mtime > found[policy][0]:
        found[policy] = (mtime, other)
  return {p: other for p, (_, other) in found.items()}


def find_other_batchnorm(run_dir: pathlib.Path,
                         summary: dict[str, Any]) -> dict[str, Any] | None:
  """The newest completed run next to `run_dir` that differs only in --batchnorm."""
  same = [k for k in SAME if k != "batchnorm"] + ["policy", "loop"]
  found = [(mtime, other) for mtime, other in _neighbours(run_dir)
           if other.get("batchnorm") != summary.get("batchnorm")
           and all(other.get(k) == summary.get(k) for k in same)]
  return max(found, key=lambda f: f[0])[1] if found else None


def load(run_dir: pathlib.Path, notes: list[str]) -> Evidence:
  summary = summary_lib.read(run_dir / "summary.json").to_dict()
  try:
    flags = dataclasses.asdict(config.from_flagfile((run_dir / "flags.txt").read_text()))
  except UserError as e:
    raise UserError(f"{run_dir / 'flags.txt'}: {e}") from None
  dtypes = None
  if (run_dir / "dtypes.json").is_file():
    dtypes = _read_json(run_dir / "dtypes.json")
  else:
    notes.append("dtypes.json missing (a --noinstrument run): the misaligned-shape and "
                 "float32-work checks were skipped")
  op_stats = None
  try:
    op_stats = opstats.load(run_dir, dtypes)
  except Exception as e:  # A broken trace or no xprof: the rest still holds.
    notes.append(f"the profiler trace could not be read ({type(e).__name__}: {e})")
  if op_stats is None and summary.get("policy") in hardware.SIXTEEN:
    notes.append("no profiler trace: for op-level evidence rerun with "
                 "--profile_steps=A,B (steps after the warm-up)")
  if not summary.get("hardware"):
    notes.append("summary.json records no hardware facts (a run made before mpt "
                 "recorded them): the hardware checks were skipped")
  found = summary.get("kernels")
  if found is None:
    notes.append("summary.json records no kernel verdict (a run made before mpt "
                 "measured its kernels): the slow-kernel and faster-policy checks had "
                 "nothing to read, the CPU flags decide")
  else:
    if found.get("note"):
      notes.append(f"kernel table: {found['note']}")
    if found.get("evidence") in MEASURED and found.get("contradicts"):
      what = "kernel probe" if found["evidence"] == "probe" else "step's timing"
      short = "probe" if found["evidence"] == "probe" else "timing"
      notes.append(f"the {what} and the CPU flags disagree: "
                   f"{found['contradicts']}; the diagnosis follows the {short}")
  try:
    from mpt import models  # Registered variants, for the "aligned" suggestion.
    names = tuple(models.names())
  except ImportError:
    names = ()
  return Evidence(summary, flags, dtypes, op_stats, find_baseline(run_dir, summary),
                  names, run_dir, find_other_batchnorm(run_dir, summary),
                  find_siblings(run_dir, summary))


def speedup(ev: Evidence) -> float | None:
  """float32 ms/step over this run's: > 1 means this run is faster."""
  ms, base = ev.summary.get("ms_per_step"), (ev.baseline or {}).get("ms_per_step")
  return base / ms if ms and base else None


# The verdicts that rest on a measurement: this model's step timed per policy before
# step 1 ("cost", mpt/train/cost.py), or the kernel probe's representative shapes.
MEASURED = ("cost", "probe")


def kernels(ev: Evidence) -> dict[str, Any] | None:
  """summary.json's `kernels` verdict when a measurement made it: the model's step
  timed per policy, or the kernel probe (None when it rests on the CPU flags only, or
  the run predates it)."""
  found = ev.summary.get("kernels") or {}
  if found.get("evidence") in MEASURED and found.get("policy_ratios"):
    return found
  return None


def slowdown(ev: Evidence) -> tuple[float, str] | None:
  """(this 16-bit run's time over float32's, what measured it): "sibling runs" (the
  float32 run next to it), else "probe" (the kernels' ratio for this model's ops)."""
  x = speedup(ev)
  if x:
    return 1 / x, "sibling runs"
  found = kernels(ev)
  if (found and found.get("ratio")
      and ev.summary.get("policy") in hardware.SIXTEEN):
    return found["ratio"], "probe"
  return None


def rerun(ev: Evidence, policy: str) -> str:
  """The command that trains this run again under `policy` (its flags.txt replayed)."""
  folder = ev.run_dir or pathlib.Path(ev.summary.get("run_dir") or ".")
  return (f"python -m mpt.main --flagfile={shlex.quote(str(folder / 'flags.txt'))} "
          f"--policy={policy}")


def traced_share(ev: Evidence, op: str) -> float | None:
  """The share of traced op time in op type `op` (a kernel-table name such as
  `Conv2DBackpropFilterWithBias` or `MatMul/grad_input` counts as the TensorFlow op
  the trace groups it under); None without a trace or when it is not among the top."""
  want = opstats.canonical_type(op.split("/")[0])
  shares = [o["share"] for o in (ev.op_stats or {}).get("top_ops") or []
            if opstats.canonical_type(o["type"]) == want]
  return sum(shares) if shares else None


def busy(s: dict[str, Any]) -> tuple[float | None, str]:
  """(busy share of the training device, what was measured), from the sampler."""
  util, hw = s.get("util") or {}, s.get("hardware") or {}
  if "gpu_percent" in util:
    return util["gpu_percent"]["mean"] / 100, "GPU utilisation"
  if hw.get("gpus"):  # Trained on a GPU, not sampled (no NVML): CPU use says nothing.
    return None, ""
  cpu, cores = util.get("process_cpu_percent"), hw.get("cpu_count")
  if cpu and cores:
    return cpu["mean"] / (100 * cores), f"process CPU use over {cores} cores"
  return None, ""


def others(s: dict[str, Any]) -> float | None:
  """Share of all CPU cores that other processes used during the run (machine load)."""
  util, hw = s.get("util") or {}, s.get("hardware") or {}
  system, mine = util.get("system_cpu_percent"), util.get("process_cpu_percent")
  if not system or not mine or not hw.get("cpu_count"):
    return None
  return max(0.0, system["mean"] / 100 - mine["mean"] / (100 * hw["cpu_count"]))


def gpu_caps(s: dict[str, Any]) -> list[tuple[int, int]]:
  """Compute capabilities of the GPUs the run had (summary.json `hardware`)."""
  return [tuple(g["compute_capability"]) for g in (s.get("hardware") or {}).get("gpus", [])
          if g.get("compute_capability")]


def layer_shares(ev: Evidence, names: list[str]) -> list[dict[str, Any]]:
  """Per named layer: dims, share of forward FLOPs, share of traced op time (or None)."""
  d = ev.dtypes or {}
  rows = {r["name"]: r for r in d.get("layers", [])}
  total = d.get("forward_flops_per_example") or 1
  layer_time = (ev.op_stats or {}).get("layer_time_share", {})
  return [{"name": n, "class": rows[n]["class"], "dims": rows[n]["dims"],
           "flops_share": rows[n]["flops"] / total, "time_share": layer_time.get(n)}
          for n in names if n in rows]


def no_fast_path(s: dict[str, Any], policy: str | None = None) -> tuple[str, str] | None:
  """hardware.fast_path on the machine a run recorded (summary.json `hardware`)."""
  hw = s.get("hardware") or {}
  return hardware.fast_path(policy or s.get("policy"), set(hw.get("cpu_flags", [])),
                            gpu_caps(s), hw.get("cpu", "this CPU"))
