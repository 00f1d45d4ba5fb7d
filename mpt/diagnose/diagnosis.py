"""Diagnosis: why mixed precision did or did not speed a run up, from its measurements.

After every training run and every sweep (mpt/main.py passes `after_run` to both),
and on demand (`python -m mpt.main --mode=diagnose --run=logs/<run>`), mpt reads the
run folder (mpt/diagnose/evidence.py), runs the detectors of mpt/diagnose/detectors/,
and prints the run's measured figures and a ranked list of findings, each with its
threshold, its evidence, a next step and what it is based on (probe, trace, sibling
runs, flags, ...). It writes `diagnosis.json` and `diagnosis.md` into the folder
(mpt/diagnose/report.py). A sweep folder is diagnosed across its cells
(mpt/diagnose/sweep.py); a folder with no run files but a profiler capture (any
TensorBoard logdir) from the capture alone (mpt/diagnose/profile.py); `--run=A,B,C`
diagnoses each folder and prints them side by side (GPU, Tensor Cores, eligible share,
mixed_float16's bound, step time).
"""

import dataclasses
import pathlib
from typing import Any

from mpt import speech
from mpt.diagnose import detectors, evidence, profile, report
from mpt.diagnose import sweep as diagnose_sweep
from mpt.diagnose.options import DiagnoseOptions
from mpt.diagnose.findings import rank
from mpt.errors import UserError
from mpt.records import numerics as numerics_lib
from mpt.records import typed


def _figures(ev: evidence.Evidence) -> dict[str, Any]:
  """The run's measured figures, printed above the findings whatever they are."""
  s, d, ops, b = ev.summary, ev.dtypes or {}, ev.op_stats or {}, ev.baseline
  busy, what = s.busy()
  return {
      "run": f"{s.model}, {s.policy}, {s.loop} loop, {_inputs(s)}, batch "
             f"{s.batch_size}, {s.status}",
      "device": s.device,
      "ms_per_step": s.ms_per_step,
      "speedup_vs_float32": ev.speedup,
      "baseline_ms_per_step": b.ms_per_step if b else None,
      "baseline_run": b.run_dir if b else None,
      "flops_share_16bit": d.get("flops_share_16bit"),
      "flops_share_32bit": d.get("flops_share_32bit"),
      # The float32 layers that hold a share of the FLOPs or of the traced time (a
      # float32 flatten or pooling layer holds none worth a word).
      "float32_layers": [l for l in ev.layer_shares(
          [l["name"] for l in d.get("float32_layers", [])])
          if l["flops_share"] >= 0.001 or l["time_share"]],
      "float32_time_share": ops.get("float32_time_share"),
      "cast_time_share": ops.get("cast_time_share"),
      "misaligned_flops_share": d.get("misaligned_flops_share"),
      "misaligned_layers": ev.layer_shares(d.get("misaligned_layers", [])),
      "data_wait_share": s.data_wait_share,
      "utilisation": busy, "utilisation_of": what,
      "achieved_gflops": s.achieved_gflops,
      "microbench_gflops": s.microbench_gflops,
      "skipped_steps": s.skipped_steps, "loss_scale": s.loss_scale,
      # diagnosis.json's name for the policy verdict (summary.json's `kernels` before
      # schema 3): a reader of diagnosis.json sees no change.
      "kernels": s.policy_verdict and typed.to_dict(s.policy_verdict),
      "policy_choice": s.policy_choice and typed.to_dict(s.policy_choice),
  }


def _inputs(s) -> str:
  """What the model was fed: "64 px" images, else each input's shape as it is."""
  if s.image_size:
    return f"{s.image_size} px"
  inputs = s.program.inputs if s.program else {}
  return "inputs " + (", ".join(f"{name} {tuple(shape)}" for name, shape in inputs.items())
                      or "not seen")


def _in_its_words(findings, notes: list[str], api: str) -> None:
  """A script's run: each finding's next step, evidence and the notes in its API's
  words (mpt/diagnose/speech.py)."""
  for f in findings:
    f.next_step = speech.for_api(f.next_step, api)
    f.evidence = [speech.for_api(e, api) for e in f.evidence]
  notes[:] = [speech.for_api(n, api) for n in notes]


def diagnose_run(run_dir: pathlib.Path) -> dict[str, Any]:
  """The diagnosis of one training run folder, as written to diagnosis.json."""
  notes: list[str] = []
  ev = evidence.load(run_dir, notes)
  findings, checked = detectors.run(ev)
  _in_its_words(findings, notes, ev.summary.api)
  figures = _figures(ev)
  typical = (ev.summary.step_time_ms or {}).get("data_wait_share_median")
  if typical is not None and ev.summary.data_wait_share is not None:  # Newer runs.
    figures["data_wait_share_median"] = typical
  found = {"kind": "run", "run_dir": str(run_dir), "figures": figures,
           "findings": [dataclasses.asdict(f) for f in rank(findings)],
           "checked_clear": checked, "notes": notes,
           "op_stats": ev.op_stats}
  if ev.numerics and ev.numerics.samples:  # Only then: older runs read as they did.
    figures["numerics"] = numerics_lib.describe(ev.numerics)
    found["numerics_table"] = numerics_lib.format_table(ev.numerics)
  if ev.gpu:  # A GPU run's capture: only then, so CPU runs read as they always did.
    found["gpu"] = profile.gpu_figures(ev.gpu, ev.gpu.profile.trace)
  return found


def _diagnosis(path: pathlib.Path) -> dict[str, Any]:
  """Diagnoses a run, sweep or profile folder and writes diagnosis.json/.md there."""
  kind = evidence.check_folder(path)
  if kind == "profile":
    diagnosis = profile.diagnose(path)
    try:  # Someone else's logdir may be read-only: the diagnosis still prints.
      report.write(path, diagnosis)
    except OSError as e:
      diagnosis["notes"].append(f"diagnosis.json/.md not written into {path}: "
                                f"{e.strerror or e}")
    return diagnosis
  diagnosis = diagnose_sweep.diagnose(path) if kind == "sweep" else diagnose_run(path)
  report.write(path, diagnosis)
  return diagnosis


def diagnose_folder(path: pathlib.Path) -> dict[str, Any]:
  """Diagnoses a run, sweep or profile folder, writes diagnosis.json/.md there,
  prints it."""
  diagnosis = _diagnosis(path)
  print(report.format_report(diagnosis), end="", flush=True)
  return diagnosis


def diagnose_folders(paths: list[pathlib.Path]) -> dict[str, Any]:
  """Each folder's diagnosis written into it; one row per folder printed."""
  diagnosis = profile.across([(path, _diagnosis(path)) for path in paths])
  print(report.format_report(diagnosis), end="", flush=True)
  return diagnosis


def report_of(folder: pathlib.Path) -> str:
  """The diagnosis of a run folder, printed and written, as Markdown (for the run's
  TensorBoard text); raises what failed (a script's run records it as not measured,
  mpt/train/common/ending.py)."""
  return report.format_report(diagnose_folder(folder), markdown=True)


def after_run(folder: pathlib.Path) -> str | None:
  """The diagnosis at the end of a run or sweep, as Markdown (for the run's
  TensorBoard text); None if it failed, which never fails the run."""
  try:
    return report_of(folder)
  except Exception as e:  # pylint: disable=broad-except
    print(f"mpt: diagnosis failed (the run's outputs are complete): {e}", flush=True)
    return None


def run(opts: DiagnoseOptions) -> dict[str, Any]:
  """`--mode=diagnose --run=logs/<run>`."""
  if not opts.run:
    raise UserError("--mode=diagnose needs --run=logs/<run> (a run, sweep or profile "
                    "folder; several, comma-separated, side by side)")
  path = pathlib.Path(opts.run).expanduser()
  if "," in opts.run and not path.exists():  # A folder may have a comma in its name.
    paths = [pathlib.Path(p).expanduser() for p in opts.run.split(",") if p.strip()]
    diagnosis = diagnose_folders(paths)
  else:
    diagnosis = diagnose_folder(path)
  return {"status": "completed", "run_dir": str(path),
          "findings": len(diagnosis["findings"])}
