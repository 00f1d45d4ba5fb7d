"""Diagnosis: why mixed precision did or did not speed a run up, from its measurements.

After every training run and every sweep, and on demand
(`python -m mpt.main --mode=diagnose --run=logs/<run>`), mpt reads the run folder
(mpt/evidence.py: summary.json, flags.txt, dtypes.json, the profiler trace's op
statistics, and a float32 run of the same configuration found next to it), runs the
detectors of mpt/detectors.py, and prints the run's measured figures and a ranked list
of findings, each with its threshold, its evidence and a next step. It writes
`diagnosis.json` and `diagnosis.md` into the folder. A sweep folder is diagnosed across its cells (mpt/diagnose_sweep.py).
"""

import dataclasses
import json
import pathlib
from typing import Any

from absl import logging

from mpt import config
from mpt import detectors
from mpt import diagnose_sweep
from mpt import evidence
from mpt.errors import UserError


def _figures(ev: evidence.Evidence) -> dict[str, Any]:
  """The run's measured figures, printed above the findings whatever they are."""
  s, d, ops = ev.summary, ev.dtypes or {}, ev.op_stats or {}
  busy, what = evidence.busy(s)
  per_layer = lambda names: evidence.layer_shares(ev, names)
  return {
      "run": f"{s.get('model')}, {s.get('policy')}, {s.get('loop')} loop, "
             f"{s.get('image_size')} px, batch {s.get('batch_size')}, {s.get('status')}",
      "device": s.get("device"),
      "ms_per_step": s.get("ms_per_step"),
      "speedup_vs_float32": evidence.speedup(ev),
      "baseline_ms_per_step": (ev.baseline or {}).get("ms_per_step"),
      "baseline_run": (ev.baseline or {}).get("run_dir"),
      "flops_share_16bit": d.get("flops_share_16bit"),
      "flops_share_32bit": d.get("flops_share_32bit"),
      "float32_layers": per_layer([l["name"] for l in d.get("float32_layers", [])]),
      "float32_time_share": ops.get("float32_time_share"),
      "cast_time_share": ops.get("cast_time_share"),
      "misaligned_flops_share": d.get("misaligned_flops_share"),
      "misaligned_layers": per_layer(d.get("misaligned_layers", [])),
      "data_wait_share": s.get("data_wait_share"),
      "utilisation": busy, "utilisation_of": what,
      "achieved_gflops": s.get("achieved_gflops"),
      "microbench_gflops": s.get("microbench_gflops"),
      "skipped_steps": s.get("skipped_steps"), "loss_scale": s.get("loss_scale"),
  }


def _layers(layers: list[dict[str, Any]]) -> str:
  return ", ".join(f"{l['name']}{' ' + l['dims'] if l['dims'] else ''} "
                   f"{l['flops_share']:.1%}" + (f" / {l['time_share']:.1%} of time"
                                                if l["time_share"] is not None else "")
                   for l in layers[:6])


def format_figures(f: dict[str, Any]) -> list[str]:
  """Speed, precision, shapes, input and loss scale, one line each."""
  speed = f"{f['ms_per_step']:.1f} ms/step" if f["ms_per_step"] else "no timed steps"
  if f["speedup_vs_float32"]:
    speed += (f", {f['speedup_vs_float32']:.2f}x float32's speed (float32: "
              f"{f['baseline_ms_per_step']:.1f} ms/step in {f['baseline_run']})")
  if f["achieved_gflops"]:
    speed += f"; {f['achieved_gflops']:.1f} GFLOP/s achieved" + (
        f", matmul microbenchmark {f['microbench_gflops']:.1f}"
        if f["microbench_gflops"] else "")
  precision = (f"16-bit FLOPs {_pct(f['flops_share_16bit'])}, float32 FLOPs "
               f"{_pct(f['flops_share_32bit'])}")
  if f["float32_layers"] and f["flops_share_16bit"]:
    precision += f" ({_layers(f['float32_layers'])})"
  if f["cast_time_share"] is not None:
    precision += (f"; traced time in float32 layers {_pct(f['float32_time_share'])}, "
                  f"in Cast ops {_pct(f['cast_time_share'])}")
  shapes = f"misaligned (not multiples of 8) {_pct(f['misaligned_flops_share'])} of FLOPs"
  if f["misaligned_layers"]:
    shapes += f": {_layers(f['misaligned_layers'])}"
  data = f"data wait {_pct(f['data_wait_share'])} of step time"
  if f["utilisation"] is not None:
    data += f"; {f['utilisation_of']} {f['utilisation']:.0%}"
  lines = [f"speed:     {speed}", f"precision: {precision}", f"shapes:    {shapes}",
           f"input:     {data}"]
  if f["loss_scale"] is not None:
    lines.append(f"scaling:   loss scale {f['loss_scale']:g}, {f['skipped_steps']} "
                 f"steps skipped")
  return lines


def diagnose_run(run_dir: pathlib.Path) -> dict[str, Any]:
  """The diagnosis of one training run folder, as written to diagnosis.json."""
  notes: list[str] = []
  ev = evidence.load(run_dir, notes)
  findings, checked = [], []
  for name, detect in detectors.DETECTORS.items():
    if name in detectors.NEEDS and ev.dtypes is None:
      continue
    finding = detect(ev)
    (findings.append(finding) if finding else checked.append(name))
  return {"kind": "run", "run_dir": str(run_dir), "figures": _figures(ev),
          "findings": [dataclasses.asdict(f) for f in detectors.rank(findings)],
          "checked_clear": checked, "notes": notes,
          "op_stats": ev.op_stats}


def _pct(x) -> str:
  return "n/a" if x is None else f"{x:.1%}"


def format_findings(findings: list[dict[str, Any]], markdown: bool) -> list[str]:
  """Numbered findings with their evidence, threshold and next step."""
  lines = []
  for i, g in enumerate(findings, 1):
    title = f"{i}. [{g['severity']}] {g['title']}"
    lines.append(f"## {title}" if markdown else title)
    lines += [f"   - {e}" for e in g["evidence"]]
    lines += [f"   threshold: {g['threshold']}", f"   next: {g['next_step']}"]
  return lines


def format_report(report: dict[str, Any], markdown: bool = False) -> str:
  """A run's or a sweep's diagnosis as text for the terminal, or as Markdown."""
  if report["kind"] == "sweep":
    return _format_sweep(report, markdown)
  f = report["figures"]
  head = f"mpt: diagnosis of {report['run_dir']}"
  lines = [f"# {head[5:]}" if markdown else head, "", f"{f['run']}; {f['device']}"]
  lines += [f"- {l}" if markdown else l for l in format_figures(f)]
  lines.append("")
  if not report["findings"]:
    lines.append("No findings: none of the checks fired (" +
                 ", ".join(report["checked_clear"]) + "); nothing mpt can measure is "
                 "holding this run back.")
  lines += format_findings(report["findings"], markdown)
  if report["findings"] and report["checked_clear"]:
    lines.append(f"checked, nothing found: {', '.join(report['checked_clear'])}")
  for note in report["notes"]:
    lines.append(f"note: {note}")
  return "\n".join(lines) + "\n"


def _format_sweep(report: dict[str, Any], markdown: bool) -> str:
  head = f"diagnosis of sweep {report['run_dir']}"
  lines = [f"# {head}" if markdown else f"mpt: {head}", ""]
  if not report["findings"]:
    lines.append("No sweep-wide findings (speed-up, memory, overhead).")
  lines += format_findings(report["findings"], markdown)
  lines += ["", "| cell | status | ms/step | top finding |", "|---|---|---|---|"]
  for c in report["cells"]:
    ms = f"{float(c['ms_per_step']):.1f}" if c["ms_per_step"] else ""
    lines.append(f"| {c['cell']} | {c['status']} | {ms} | {c['top']} |")
  return "\n".join(lines) + "\n"


def write(folder: pathlib.Path, report: dict[str, Any]) -> None:
  (folder / "diagnosis.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
  (folder / "diagnosis.md").write_text(format_report(report, markdown=True))


def diagnose_folder(path: pathlib.Path) -> dict[str, Any]:
  """Diagnoses a run or sweep folder, writes diagnosis.json/.md there, prints it."""
  if evidence.check_folder(path) == "sweep":
    report = diagnose_sweep.diagnose(path)
  else:
    report = diagnose_run(path)
  write(path, report)
  print(format_report(report), end="", flush=True)
  return report


def after_run(run_dir: pathlib.Path) -> dict[str, Any] | None:
  """The diagnosis at the end of a run or sweep; a failure here never fails the run."""
  try:
    return diagnose_folder(run_dir)
  except Exception as e:  # pylint: disable=broad-except
    logging.error("diagnosis failed (the run's outputs are complete): %s", e)
    print(f"mpt: diagnosis failed: {e}", flush=True)
    return None


def run(cfg: config.Config) -> dict[str, Any]:
  """`--mode=diagnose --run=logs/<run>`."""
  if not cfg.run:
    raise UserError("--mode=diagnose needs --run=logs/<run> (a run or sweep folder)")
  path = pathlib.Path(cfg.run).expanduser()
  report = diagnose_folder(path)
  return {"status": "completed", "run_dir": str(path),
          "findings": len(report["findings"])}
