"""A diagnosis as text: the terminal's report, diagnosis.md, and diagnosis.json.

The diagnosis (mpt/diagnose/diagnosis.py for a run, mpt/diagnose/sweep.py for a sweep)
is a plain dict, the same that diagnosis.json holds; this module only formats it and
writes it into the folder it explains.
"""

import json
import pathlib
from typing import Any

from mpt.diagnose import findings as words
from mpt.records.cost import times


def _pct(x) -> str:
  return "n/a" if x is None else f"{x:.1%}"


def _layers(layers: list[dict[str, Any]]) -> str:
  return ", ".join(f"{l['name']}{' ' + l['dims'] if l['dims'] else ''} "
                   f"{l['flops_share']:.1%}" + (f" / {l['time_share']:.1%} of time"
                                                if l["time_share"] is not None else "")
                   for l in layers[:6])


def format_figures(f: dict[str, Any]) -> list[str]:
  """Speed, precision, shapes, input and loss scale, one line each."""
  speed = f"{f['ms_per_step']:.1f} ms/step" if f["ms_per_step"] else "no timed steps"
  if f["speedup_vs_float32"]:
    speed += (f", {times(f['speedup_vs_float32'])} float32's speed (float32: "
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
  if f.get("data_wait_share_median") is not None:
    data += f" (the median step's: {_pct(f['data_wait_share_median'])})"
  if f["utilisation"] is not None:
    data += f"; {f['utilisation_of']} {f['utilisation']:.0%}"
  lines = [f"speed:     {speed}", f"precision: {precision}", f"shapes:    {shapes}",
           f"input:     {data}"]
  if k := f.get("kernels"):
    lines.append(f"kernels:   {_kernels(k)}")
  choice = f.get("policy_choice")
  if choice and choice.get("candidates"):
    lines.append(f"auto:      --policy=auto chose {choice.get('chosen')}; time over "
                 f"float32's, timed on this model: " + ", ".join(
                     f"{c['policy']} " + (times(c["time_vs_float32"])
                                          if c.get("time_vs_float32") else
                                          "dropped" if c.get("dropped") else "-")
                     for c in choice["candidates"]))
  if f["loss_scale"] is not None:
    lines.append(f"scaling:   loss scale {f['loss_scale']:g}, {f['skipped_steps']} "
                 f"steps skipped")
  if f.get("numerics"):
    lines.append(f"numerics:  {f['numerics']}")
  return lines


def _kernels(k: dict[str, Any]) -> str:
  """summary.json's `kernels` verdict in one line."""
  if k.get("evidence") not in ("cost", "probe") or not k.get("policy_ratios"):
    return ("not measured, by the CPU flags / GPU compute capability: "
            + (k.get("text") or "no slow-path warning"))
  line = words.ratios_line(k["evidence"], k.get("source"), k["policy_ratios"])
  if k.get("op"):
    line += (f"; worst {k['op']}: {k.get('impl')}"
             + (" (reference)" if k.get("reference") else "")
             + (f", {times(k['op_ratio'])}" if k.get("op_ratio") else ""))
  return line


def format_findings(findings: list[dict[str, Any]], markdown: bool) -> list[str]:
  """Numbered findings with their evidence and next step; Markdown (diagnosis.md, the
  run's TensorBoard text) also gives each one's threshold, while the terminal keeps
  to what to read and do, with what it was based on in its title line."""
  lines = []
  for i, g in enumerate(findings, 1):
    title = f"{i}. [{g['severity']}] {g['title']}"
    # A diagnosis.json written before findings said what they were based on has none.
    based = ", ".join(g.get("based_on") or [])
    if not markdown:
      lines.append(title + (f" (based on: {based})" if based else ""))
      lines += [f"   - {e}" for e in g["evidence"]] + [f"   next: {g['next_step']}"]
      continue
    # Markdown: the evidence as a list, then threshold, next and based on as
    # paragraphs of their own (indented lines after a list would be read as the
    # last item's continuation, and rendered inside it).
    lines += [f"## {title}"] + [f"- {e}" for e in g["evidence"]]
    lines += ["", f"**threshold:** {g['threshold']}", "", f"**next:** {g['next_step']}"]
    lines += (["", f"**based on:** {based}"] if based else []) + [""]
  return lines


def _title(head: str, markdown: bool) -> str:
  return f"# {head}" if markdown else f"mpt: {head}"


def format_report(report: dict[str, Any], markdown: bool = False) -> str:
  """A run's or a sweep's diagnosis as text for the terminal, or as Markdown."""
  if report["kind"] == "sweep":
    return _format_sweep(report, markdown)
  if report["kind"] == "across":
    return _format_across(report, markdown)
  f, clear = report["figures"], ", ".join(report["checked_clear"])
  lines = [_title(f"diagnosis of {report['run_dir']}", markdown), ""]
  if report["kind"] == "profile":
    lines.append(f"a profile folder: {f['capture']} capture {f['trace']}")
    figures = profile_figures(f)
  else:
    lines.append(f"{f['run']}; {f['device']}")
    figures = format_figures(f) + (profile_figures(report["gpu"]) if report.get("gpu")
                                   else [])
  lines += [f"- {l}" if markdown else l for l in figures] + [""]
  if markdown and report.get("numerics_table"):
    lines += ["## Numerics per layer", "", report["numerics_table"], ""]
  if not report["findings"] and report["kind"] == "profile":
    lines.append(f"No findings from the capture (checked: {clear}); see the notes for "
                 "what a capture alone cannot tell.")
  elif not report["findings"]:
    lines.append(f"No findings: none of the checks fired ({clear}); nothing mpt can "
                 "measure is holding this run back.")
  lines += format_findings(report["findings"], markdown)
  if report["findings"] and clear:
    lines.append(f"checked, nothing found: {clear}")
  lines += [f"note: {note}" for note in report["notes"]]
  return "\n".join(lines) + "\n"


def profile_figures(f: dict[str, Any]) -> list[str]:
  """A profile folder's figures: the GPU, the step, the kernel split and the bound;
  for a CPU capture, the host's op time."""
  if f["capture"] == "CPU":
    return [f"ops:       {f['op_time_ms']:.1f} ms of host op time: " + ", ".join(
                f"{o['type']} {o['share']:.1%}" for o in f["top_ops"][:5]),
            f"precision: Cast ops {_pct(f['cast_time_share'])} of op time"]
  gb = lambda v, unit: f", {v:.0f} {unit}" if v else ""
  lines = [f"gpu:       {f['gpu']} (compute capability {f['compute_capability'] or '?'}, "
           f"{f['sms'] or '?'} SMs{gb(f['memory_bandwidth_gbs'], 'GB/s')}"
           f"{gb(f['memory_gb'], 'GB')}; {f['gpus']} GPU plane(s)): "
           + {True: "Tensor Cores", False: "no Tensor Cores", None: "Tensor Cores unknown"}[
               f["tensor_cores"]] + f"; {f['rates']}"]
  if f["step_ms"]:
    lines.append(f"profiled:  {f['step_ms']:.1f} ms/step; GPU busy "
                 f"{_pct(f['device_busy_share'])}, input wait {_pct(f['input_share'])}, "
                 f"host gaps {_pct(f['host_gap_share'])}")
  sp = f["split"]
  lines.append(f"kernels:   {f['kernel_ms']:.1f} ms: on Tensor Cores "
               f"{_pct(sp['tensor_core'])}, eligible on CUDA cores "
               f"{_pct(sp['eligible_not_tc'])} (eligibility from {f['eligible_from']}), "
               f"memory-bound {_pct(sp['memory_bound'])}, other {_pct(sp['other'])}")
  lines.append("families:  " + ", ".join(f"{k} {v:.1%}" for k, v in
                                         list(f["families"].items())[:6]))
  lines.append(f"16-bit:    {_pct(f['sixteen_bit_share'])} of kernel time in 16-bit "
               f"kernels: a {f['precision']} capture")
  if b := f["bound"]:
    step = f", {times(b['step'])} per step" if b["step"] else ""
    what = "" if b["tensor_cores"] else " (memory-bound ops only: no Tensor Cores)"
    lines.append(f"bound:     mixed_float16 at most {times(b['kernel'])} in kernel "
                 f"time{step}{what}; an upper bound, not a forecast")
  return lines


def _bound_cell(r: dict[str, Any]) -> str:
  if r["kernel_bound"] is None:
    return "16-bit already" if r["precision"] == "16-bit" else "-"
  step = f" / {times(r['step_bound'])}" if r["step_bound"] else ""
  return f"<= {times(r['kernel_bound'])}{step}" + ("" if r["tensor_cores"] else
                                                 " (memory-bound only)")


def _format_across(report: dict[str, Any], markdown: bool) -> str:
  """One row per folder: the seed's question across GPUs, from each one's evidence."""
  lines = [_title("mixed_float16 across the captures, each from its own kernels",
                  markdown), "",
           "| folder | GPU | Tensor Cores | eligible share | mixed_float16 bound "
           "(kernels / step) | step ms | GPU busy | top finding |",
           "|---|---|---|---|---|---|---|---|"]
  yes = {True: "yes", False: "no", None: "?"}
  for r in report["rows"]:
    cpu = str(r["gpu"]).startswith("CPU")
    step = f"{r['step_ms']:.1f}" if r["step_ms"] else "-"
    lines.append(f"| {r['folder']} | {r['gpu']} | {'-' if cpu else yes[r['tensor_cores']]} | "
                 f"{_pct(r['eligible_share'])} | {_bound_cell(r)} | {step} | "
                 f"{_pct(r['busy'])} | {r['top']} |")
  lines += ["", "Bounds are ceilings (Amdahl over each capture's kernel time with its "
            "GPU's data-sheet Tensor Core/float32 ratio), not forecasts; each folder's "
            "full diagnosis is in its diagnosis.md."]
  return "\n".join(lines) + "\n"


def _format_sweep(report: dict[str, Any], markdown: bool) -> str:
  lines = [_title(f"diagnosis of sweep {report['run_dir']}", markdown), ""]
  if not report["findings"]:
    lines.append("No sweep-wide findings (speed-up, memory, overhead, accuracy).")
  lines += format_findings(report["findings"], markdown)
  if report.get("accuracy"):
    lines += ["", "accuracy beside speed (final metrics over seeds):"]
    lines += [f"- {l}" for l in report["accuracy"]]
  lines += ["", "| cell | status | ms/step | top finding |", "|---|---|---|---|"]
  for c in report["cells"]:
    ms = f"{c['ms_per_step']:.1f}" if c["ms_per_step"] else ""
    lines.append(f"| {c['cell']} | {c['status']} | {ms} | {c['top']} |")
  return "\n".join(lines) + "\n"


def write(folder: pathlib.Path, report: dict[str, Any]) -> None:
  """diagnosis.json (the dict as it is) and diagnosis.md into the diagnosed folder."""
  (folder / "diagnosis.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
  (folder / "diagnosis.md").write_text(format_report(report, markdown=True))
