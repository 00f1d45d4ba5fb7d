"""What a GPU did in a profiled run, from its capture (`*.xplane.pb`): the device, the
step time and how busy the GPU was in it, and its kernel time split by what ran it
(mpt/records/gpu.py `GpuProfile`). The capture may be any TensorFlow (or JAX) profile
folder, mpt's or a user's own: `find_traces` finds them, `read` reads one.

Two sources, each for what only it gives: xprof's converter (mpt/machine/traces.py, in
a child process) for the kernel table with its Tensor Core flags, the step time and
the input analysis; the XSpace itself (mpt/machine/xspace.py) for the GPU planes'
stats and per-GPU kernel time, and for the op each kernel ran for where xprof 2.24
drops it (TF <= 2.4 captures: every kernel_stats row has an empty op name).

Families are mpt/machine/kernel_families.py's. Eligibility for Tensor Cores is xprof's
flag where it flags any op; xprof 2.24 flags none in TF <= 2.4 captures (and by op
name, so never a fused convolution named after its activation), so then it is derived
here from the op type: convolutions and matmuls (einsums, batched and fused ones
included), not in float64. `eligible_from` and a note say which.
"""

import json
import pathlib
import re
from typing import Any

from google.protobuf import message

from mpt import errors
from mpt.machine import gpu_kernels, kernel_families, traces, xspace
from mpt.records import gpu as records

TOOLS = ("kernel_stats", "overview_page", "input_pipeline_analyzer")


def find_traces(folder: pathlib.Path) -> list[pathlib.Path]:
  """Every capture under `folder` (a TensorBoard logdir, a `plugins/profile/<run>/`
  folder or anything above it; a `.xplane.pb` itself), newest run first: run folders
  are named by their capture time (YYYY_MM_DD_HH_MM_SS), else by modification time."""
  folder = pathlib.Path(folder)
  if folder.is_file():
    return [folder] if folder.name.endswith(".xplane.pb") else []
  found = [p for p in folder.rglob("*.xplane.pb") if p.is_file()]
  return sorted(found, key=lambda p: (p.parent.name, p.stat().st_mtime, p.name),
                reverse=True)


def _space(trace: pathlib.Path):
  """The capture's XSpace; UserError, one line, when there is none to read."""
  try:
    data = trace.read_bytes()
  except OSError as e:
    raise errors.UserError(f"cannot read the profile {trace}: {e.strerror or e}") from e
  try:
    space = xspace.parse(data)
  except message.DecodeError as e:
    raise errors.UserError(
        f"{trace} is not a readable profiler capture (an XSpace protobuf): truncated "
        f"or another kind of file ({e})") from e
  if not any(p.name for p in space.planes):
    raise errors.UserError(f"{trace} holds no profiler planes: empty, or not a "
                           f"profiler capture ({len(data)} bytes)")
  return space


def _converted(trace: pathlib.Path) -> dict[str, tuple[Any, Any, str | None]]:
  """xprof's tables of the trace; UserError when xprof cannot convert it at all."""
  newer = (f"the capture may be from a newer TensorFlow/xprof than the installed "
           f"xprof {traces.XPROF_VERSION}")
  try:
    tables = traces.convert(trace, TOOLS)
  except ImportError as e:
    raise errors.UserError(f"reading {trace} needs xprof {traces.XPROF_VERSION} "
                           f"(pip install xprof): {e}") from e
  except traces.ConverterError as e:
    raise errors.UserError(f"{_line(str(e))}; {newer}") from e
  data, _, error = tables["kernel_stats"]
  if error or not data:
    said = f": {_line(error)}" if error else " (empty output)"
    raise errors.UserError(f"xprof could not convert {trace} to its kernel "
                           f"table{said}; {newer}")
  return tables


def _line(text: str) -> str:
  return " ".join(text.split())[:400]


def _kernel(kernel: str, op_name: str, op_type: str, ms: float, count: int,
            tensor_core: bool, eligible: bool | None) -> records.Kernel:
  """A Kernel; `eligible` None: derived from its family and dtype."""
  op_type = op_type or (op_name.rsplit("/", 1)[-1].split(":")[0] if op_name else "")
  op_type = re.sub(r"_\d+$", "", op_type)  # "MatMul_1": TF's second MatMul in scope.
  fam = kernel_families.family(op_type, kernel)
  dtype = gpu_kernels.dtype_of(kernel, op_name)
  if eligible is None:
    eligible = fam in kernel_families.ELIGIBLE and dtype != "float64"
  # xprof flags the op; its helper kernels (cuDNN's conversions, padding, split-K's
  # sum: families by name) are not what Tensor Cores would run.
  eligible = eligible and fam in kernel_families.ELIGIBLE
  # xprof's flag, or the name: xprof knows only Volta's and Turing's Tensor Core names.
  tensor_core = tensor_core or kernel_families.tensor_core(kernel)
  return records.Kernel(kernel, op_name, op_type, fam, dtype, ms, count, tensor_core,
                        eligible)


def _kernels(rows: list[dict[str, Any]], gpus: list[xspace.Gpu],
             notes: list[str]) -> tuple[list[records.Kernel], str]:
  """One Kernel per kernel_stats row where xprof names the ops, else per (kernel, op)
  of the trace's kernel events; and where eligibility came from."""
  by_xprof = any(r["tensor_core_eligible"] for r in rows)
  if any(r["op"] for r in rows):
    kernels = [_kernel(r["kernel"], r["op"] or "", "", r["ms"], r["occurrences"] or 1,
                       bool(r["tensor_core_used"]),
                       bool(r["tensor_core_eligible"]) if by_xprof else None)
               for r in rows]
  else:
    tc = {r["kernel"] for r in rows if r["tensor_core_used"]}  # xprof: by kernel name.
    groups: dict[tuple[str, str, str], list[int]] = {}
    for event in (e for g in gpus for e in g.kernels):
      group = groups.setdefault((event.kernel, event.op, event.op_type), [0, 0])
      group[0] += event.ps
      group[1] += 1
    ranked = sorted(groups.items(), key=lambda g: -g[1][0])  # Most time first.
    kernels = [_kernel(k, op, kind, ps / 1e9, n, k in tc, None)
               for (k, op, kind), (ps, n) in ranked]
    by_xprof = False
    if kernels:
      notes.append(f"op names from the trace's kernel events: xprof "
                   f"{traces.XPROF_VERSION}'s kernel table names none (a TF <= 2.4 "
                   f"capture)")
  if any(k.tensor_core for k in kernels) and not any(r["tensor_core_used"] for r in rows):
    notes.append(f"Tensor Core use read from the kernel names (xmma, TensorOp, ...): "
                 f"xprof {traces.XPROF_VERSION} flags only Volta's and Turing's")
  if by_xprof:
    return kernels, "xprof"
  if any(k.family in kernel_families.ELIGIBLE for k in kernels):
    notes.append("Tensor Core eligibility derived from the op type (convolutions, "
                 "matmuls, einsums, fused ones too; not float64): xprof flags no op "
                 "eligible in this capture (TF <= 2.4 captures lose the flag)")
  return kernels, "op type"


def _split(kernels: list[records.Kernel]) -> records.Split:
  split = records.Split()
  for k in kernels:
    part = ("tensor_core" if k.tensor_core else "eligible_not_tc" if k.eligible
            else "memory_bound" if k.family in kernel_families.MEMORY_BOUND else "other")
    setattr(split, part, getattr(split, part) + k.ms)
  return split


def _tables(data: Any) -> list[dict[str, Any]]:
  """The DataTables of an xprof tool's JSON (one, or a list of them)."""
  try:
    found = json.loads(data) if isinstance(data, (str, bytes)) and data else []
  except ValueError:
    return []
  return [t for t in (found if isinstance(found, list) else [found])
          if isinstance(t, dict)]


def _step_breakdown(tables: list[dict[str, Any]]) -> dict[str, Any]:
  """{step_ms, steps, input_ms, other_ms, statement} from the step-time table, means
  over its rows (the `p` averages are rounded to 0.1 ms)."""
  for table in tables:
    ids = [c.get("id") for c in table.get("cols", [])]
    if "stepTimeMs" not in ids:
      continue
    rows = [[c.get("v") if isinstance(c, dict) else None for c in r.get("c", [])]
            for r in table.get("rows", [])]
    mean = lambda col: (sum(float(r[ids.index(col)] or 0) for r in rows) / len(rows)
                        if rows and col in ids else None)
    statement = table.get("p", {}).get("input_conclusion") or None
    return {"step_ms": mean("stepTimeMs"), "steps": len(rows),
            "input_ms": mean("infeedTimeMs"), "other_ms": mean("otherTimeMs"),
            "statement": statement}
  return {}


def _sixteen_bit_check(share: float, overview: Any) -> list[str]:
  """A note when xprof's overview (its own count, by op) disagrees with the kernels'
  names on the 16-bit share by more than 10 points."""
  said = next((t["p"]["device_compute_16bit_percent"] for t in _tables(overview)
               if "device_compute_16bit_percent" in t.get("p", {})), None)
  try:
    theirs = float(str(said).rstrip("%")) / 100
  except ValueError:
    return []
  if abs(theirs - share) <= 0.10:
    return []
  return [f"xprof's overview puts {theirs:.1%} of device compute in 16-bit ops; the "
          f"kernels' names say {share:.1%} of kernel time"]


def _steps(profile: records.GpuProfile, tables: dict, device: xspace.Gpu | None) -> None:
  """Step time, busy, input and host-gap shares, from the input analysis (else the
  overview) and the device's own step span."""
  found = {}
  for tool in ("input_pipeline_analyzer", "overview_page"):
    data, _, error = tables[tool]
    found = found or _step_breakdown(_tables(data))
    if error:
      profile.notes.append(f"xprof's {tool} failed: {_line(error)}")
  step = found.get("step_ms")
  if not step:
    profile.notes.append("no step time: xprof found no steps in the capture")
    return
  profile.step_ms = step
  for share, ms in (("input_share", "input_ms"), ("host_gap_share", "other_ms")):
    setattr(profile, share, found[ms] / step if found[ms] is not None else None)
  profile.input_statement = found["statement"]
  if device is not None:  # The device's "Steps" line spans exactly the steps profiled.
    span_ms = device.steps_ps / 1e9 or step * found["steps"]
    profile.device_busy_share = min(device.kernel_ms / span_ms, 1.0) if span_ms else None


def _device(gpu: xspace.Gpu) -> records.GpuDevice:
  s = gpu.stats
  cc = [int(s["compute_cap_major"]), int(s.get("compute_cap_minor", 0))] \
      if "compute_cap_major" in s else None
  number = lambda key, scale: float(s[key]) / scale if s.get(key) else None
  return records.GpuDevice(gpu.name, gpu.model, cc,
                           int(s["core_count"]) if s.get("core_count") else None,
                           number("clock_rate", 1e3), number("memory_bandwidth", 1e9),
                           number("memory_size", 1e9))


def read(trace: pathlib.Path) -> records.GpuProfile:
  """The GPU evidence of one capture. UserError (one line) when the file is not a
  capture, or xprof cannot convert it; a CPU-only capture gives no device, a note."""
  trace = pathlib.Path(trace)
  space = _space(trace)
  tables = _converted(trace)
  gpus = xspace.gpus(space)
  profile = records.GpuProfile(trace=str(trace), gpus=len(gpus))
  busy = [g for g in gpus if g.kernels]
  device = max(busy, key=lambda g: g.kernel_ms) if busy else None
  profile.device = _device(device or gpus[0]) if gpus else None
  rows = gpu_kernels.parse(tables["kernel_stats"][0])["rows"]
  profile.kernels, profile.eligible_from = _kernels(rows, gpus, profile.notes)
  profile.split = _split(profile.kernels)
  for k in profile.kernels:
    profile.by_family[k.family] = profile.by_family.get(k.family, 0.0) + k.ms
    profile.by_layer[k.layer] = profile.by_layer.get(k.layer, 0.0) + k.ms
  total = profile.split.total
  if total:
    profile.sixteen_bit_share = sum(
        k.ms for k in profile.kernels if k.dtype in ("float16", "bfloat16")) / total
    profile.notes += _sixteen_bit_check(profile.sixteen_bit_share,
                                        tables["overview_page"][0])
  profile.memcpy_ms = sum(g.memcpy_ps for g in gpus) / 1e9
  _steps(profile, tables, device)
  profile.notes += _gaps(gpus, busy, profile)
  return profile


def _gaps(gpus: list[xspace.Gpu], busy: list[xspace.Gpu],
          profile: records.GpuProfile) -> list[str]:
  """What the capture does not hold."""
  if not gpus:
    return ["no GPU in the capture (a CPU-only trace): no kernel table"]
  notes = []
  if not busy and not profile.kernels:
    notes.append(f"none of the {len(gpus)} GPU(s) ran a kernel in the capture")
  elif len(busy) < len(gpus):
    notes.append(f"kernels on {len(busy)} of {len(gpus)} GPUs "
                 f"({', '.join(g.name for g in busy)}); the other planes hold none: "
                 f"a partial capture, shares are of the GPUs that have kernels")
  if busy and not any(k.family in kernel_families.ELIGIBLE for k in profile.kernels):
    notes.append("no convolution or matmul kernel in the capture: nothing here could "
                 "use Tensor Cores (the profiled window missed them?)")
  if profile.device and not profile.device.compute_capability:
    notes.append(f"{profile.device.name}: no compute capability in the capture")
  return notes
