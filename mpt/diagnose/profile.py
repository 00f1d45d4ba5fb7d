"""The diagnosis of a profile folder: any folder with a profiler capture under it
(`*.xplane.pb`: a TensorBoard logdir that Keras' TensorBoard callback or
`tf.profiler` wrote for a user's own script, or a `plugins/profile/<run>/` folder) and
no run files, diagnosed from the newest capture alone; and the table of several
captures side by side (`--run=A,B,C`: mpt/diagnose/diagnosis.py).

A GPU capture is read by mpt/machine/gpu_profile.py and judged by the GPU rules
(mpt/diagnose/detectors/gpu.py); a CPU-only capture gives the host's op statistics
(mpt/diagnose/opstats.py) and one check, Cast ops. The diagnosis says what a capture
alone cannot tell (no summary.json: no ms/step baseline, no loss scale, no policy
verdict). Same dict as a run's diagnosis (kind, run_dir, figures, findings,
checked_clear, notes); mpt/diagnose/report.py prints it.
"""

import dataclasses
import pathlib
from typing import Any

from mpt.diagnose import opstats
from mpt.diagnose.detectors import gpu as gpu_rules
from mpt.diagnose.findings import Finding, rank
from mpt.diagnose.gpu_evidence import GpuEvidence
from mpt.diagnose.thresholds import FLOAT32_TIME_SHARE
from mpt.errors import UserError
from mpt.machine import gpu_profile, traces, xspace

MISSING = ("no summary.json: no ms/step baseline, no loss scale, no policy verdict, no "
           "float32 run to compare with; diagnosed from the profiler capture alone")


def diagnose(path: pathlib.Path) -> dict[str, Any]:
  """The diagnosis of the newest capture under `path`; UserError on a bad capture."""
  traces = gpu_profile.find_traces(path)
  if not traces:
    raise UserError(f"--run={path}: no profiler capture (*.xplane.pb) under it")
  trace, notes = traces[0], [MISSING]
  name = str(trace.relative_to(path))  # Found under it.
  if len(traces) > 1:
    notes.append(f"{len(traces)} captures under it: read the newest, {name}")
  profile = gpu_profile.read(trace)
  if profile.device is None:
    figures, found, clear = _cpu(trace, name, notes)
  else:
    g = GpuEvidence(profile)
    results = {rule: check(g) for rule, check in gpu_rules.RULES.items()}
    found = [f for f in results.values() if f]
    clear = [rule for rule, f in results.items() if not f]
    figures = gpu_figures(g, name)
    notes += profile.notes + _autotune(g)
  return {"kind": "profile", "run_dir": str(path), "figures": figures,
          "findings": [dataclasses.asdict(f) for f in rank(found)],
          "checked_clear": clear, "notes": notes}


def _autotune(g: GpuEvidence) -> list[str]:
  """A note when the capture holds cuDNN's autotuner: a first step, not a typical one."""
  ms = sum(k.ms for k in g.profile.kernels if "redzone_checker" in k.kernel)
  if not ms:
    return []
  return [f"the capture holds cuDNN's autotuning ({ms:.1f} ms of redzone_checker "
          f"kernels, and its trial kernels): the profiled step was among the first; "
          f"profile a later one (profile_batch=(10, 12)) for typical times"]


def gpu_figures(g: GpuEvidence, trace: str) -> dict[str, Any]:
  p, c, d, b = g.profile, g.ceiling, g.profile.device, g.bound
  return {
      "capture": "GPU", "trace": trace, "gpu": c.gpu, "device": d.name,
      "compute_capability": ".".join(map(str, d.compute_capability or [])) or None,
      "sms": d.sms, "memory_bandwidth_gbs": d.memory_bandwidth_gbs,
      "memory_gb": d.memory_gb, "gpus": p.gpus, "tensor_cores": c.tensor_cores,
      "rates": c.source, "step_ms": p.step_ms, "device_busy_share": p.device_busy_share,
      "input_share": p.input_share, "host_gap_share": p.host_gap_share,
      "kernel_ms": g.kernel_ms, "memcpy_ms": p.memcpy_ms,
      "split": {k: g.share(getattr(p.split, k)) for k in
                ("tensor_core", "eligible_not_tc", "memory_bound", "other")},
      "families": {f: g.share(ms) for f, ms in
                   sorted(p.by_family.items(), key=lambda i: -i[1])},
      "layers_ms": dict(sorted(p.by_layer.items(), key=lambda i: -i[1])[:8]),
      "sixteen_bit_share": p.sixteen_bit_share,
      "precision": "16-bit" if g.sixteen_bit else "float32",
      "eligible_from": p.eligible_from,
      "bound": {"kernel": b.kernel_bound, "step": b.step_bound, "ratio": b.ratio,
                "formula": b.formula, "tensor_cores": bool(c.tensor_cores)} if b else None,
  }


def _cpu(trace: pathlib.Path, name: str, notes: list[str]):
  """(figures, findings, checks clear) of a CPU-only capture: the host's op stats."""
  newer = f"a capture from a newer TensorFlow/xprof than xprof {traces.XPROF_VERSION}?"
  try:
    rows = opstats.framework_op_stats(trace)
  except Exception as e:  # Whatever xprof raised on it: one line, and what it may mean.
    said = " ".join(f"{type(e).__name__}: {e}".split())[:300]
    raise UserError(f"xprof could not read the op statistics of {trace} ({said}); "
                    f"{newer}") from None
  if not any(r["type"] != "IDLE" for r in rows):
    planes = sorted({p.name for p in xspace.parse(trace.read_bytes()).planes})
    # XLA's module protos in their own plane: what JAX's profiler writes.
    why = ("a JAX (XLA) capture of a CPU run: mpt reads a JAX capture's GPU kernels, "
           "and a CPU's only from TensorFlow's ops" if "/host:metadata" in planes
           else f"{newer} Or a profile window that caught no step")
    raise UserError(f"{trace} has no GPU plane and no TensorFlow op xprof can read "
                    f"(planes: {', '.join(planes)}): {why}")
  stats = opstats.condense(rows, None, name)
  notes.append("a CPU-only capture (no GPU plane): the host's op statistics (xprof's "
               "TensorFlow stats); whether this CPU's 16-bit kernels are fast is not "
               "in a trace: `--mode=microbench` on that machine measures it")
  figures = {"capture": "CPU", "trace": name, "op_time_ms": stats["op_time_ms"],
             "top_ops": stats["top_ops"], "cast_time_share": stats["cast_time_share"]}
  cast = stats["cast_time_share"]
  if cast < FLOAT32_TIME_SHARE:
    return figures, [], ["cpu_casts"]
  finding = Finding(
      "cpu_casts", "medium", cast, f"Cast ops take {cast:.0%} of the host's op time",
      f"Cast ops >= {FLOAT32_TIME_SHARE:.0%} of traced op time", [
          f"Cast {cast:.1%} of {stats['op_time_ms']:.1f} ms op time; most op time: "
          + ", ".join(f"{o['type']} {o['share']:.1%}" for o in stats["top_ops"][:4])],
      "fewer dtype boundaries: keep whole blocks in one dtype (a float32 layer between "
      "16-bit ones casts twice), cast the input once in the input pipeline", ["trace"])
  return figures, [finding], []


def across(diagnoses: list[tuple[pathlib.Path, dict[str, Any]]]) -> dict[str, Any]:
  """One row per folder's diagnosis: GPU, Tensor Cores, eligible share, the bound,
  the measured step time, the top finding."""
  return {"kind": "across", "run_dir": ",".join(str(p) for p, _ in diagnoses),
          "rows": [_row(path, d) for path, d in diagnoses],
          "findings": [f for _, d in diagnoses for f in d["findings"]]}


def _row(path: pathlib.Path, d: dict[str, Any]) -> dict[str, Any]:
  f = d["figures"]
  row = {"folder": str(path), "gpu": None, "tensor_cores": None, "eligible_share": None,
         "precision": None, "kernel_bound": None, "step_bound": None, "step_ms": None,
         "busy": None, "top": d["findings"][0]["title"] if d["findings"] else "no findings"}
  if d["kind"] == "run":
    row.update(step_ms=f["ms_per_step"], precision=f["run"].split(", ")[1])
    if not d.get("gpu"):  # A CPU run, or a GPU run without a capture.
      return {**row, "gpu": f["device"]}
    f = {**d["gpu"], "step_ms": f["ms_per_step"]}  # The run's own step time.
  elif f["capture"] == "CPU":
    return {**row, "gpu": "CPU"}
  b = f["bound"] or {}
  cc = f" ({f['compute_capability']})" if f["compute_capability"] else ""
  return {**row, "gpu": f"{f['gpu']}{cc}", "tensor_cores": f["tensor_cores"],
          "eligible_share": f["split"]["tensor_core"] + f["split"]["eligible_not_tc"],
          "precision": f["precision"], "kernel_bound": b.get("kernel"),
          "step_bound": b.get("step"), "step_ms": f["step_ms"],
          "busy": f["device_busy_share"]}
