"""The GPU kernel table: for each CUDA kernel a profiled run launched, the TensorFlow op
it ran for, its dtype, its time, and whether it used Tensor Cores where the op could;
and the summary a diagnosis needs: the ops that could use Tensor Cores but did not,
with their share of kernel time.

It is read from the profile plugin's `kernel_stats` tool (xprof: `xspace_to_tool_data(
[trace], "kernel_stats", {})`), a DataTable built by GenerateKernelStatsDataTable in
openxla/xprof xprof/convert/xplane_to_kernel_stats_db.cc: JSON {"cols": [{"id",
"label", "type"}], "rows": [{"c": [{"v": ...}]}]}, one row per (kernel, op, launch
shape), ids kernel_name, op_name, occurrences, total_duration_us,
is_op_tensor_core_eligible, is_kernel_using_tensor_core, ... The profile plugin's CSV
export of it (header: the column labels) is read too. Both Tensor Core flags are xprof's
guesses from names (xprof/utils/kernel_stats_utils.cc): "eligible" from the op name
(Conv2D*, */MatMul, BatchMatMul*, ...; a list its own comment calls not exhaustive),
"used" from the kernel name (hmma, xmma, 16816, s1688, ...), so a kernel family newer
than the installed xprof can show as a miss.

A CPU run's trace gives an empty table. Nothing here raises on bad input: empty,
unreadable or foreign data gives no rows and a note saying why. TensorFlow is not
imported; xprof only by `from_trace`.
"""

import csv
import io
import json
import re
from typing import Any

from mpt.machine import traces

# The columns used, by id; a CSV header may carry either the id or the label.
_COLUMNS = {"kernel_name": "Kernel Name", "op_name": "Op Name",
            "occurrences": "Occurrences", "total_duration_us": "Total Duration (μs)",
            "is_op_tensor_core_eligible": "Op is TensorCore eligible",
            "is_kernel_using_tensor_core": "Kernel uses TensorCore"}
_REQUIRED = ("kernel_name", "total_duration_us")

# The dtype a kernel name (or, failing that, an op name) spells: cuBLAS/cuDNN/CUTLASS
# names carry it (ampere_bf16_s16816gemm_bf16, volta_fp16_s884gemm, xmma_gemm_f16f16,
# tf32f32, volta_sgemm; h16816 = half), Eigen's templates name the C++ type. Narrowest
# first: a 16-bit kernel's name often also mentions its float32 accumulator.
_DTYPES = (
    ("bfloat16", r"bf16|bfloat16"),
    ("float16", r"float16|fp16|f16|half|h\d{3,5}(?:gemm|cudnn)|hgemm"),
    ("float32", r"float(?!16|64)|tf32|tfloat32|fp32|f32|sgemm|s\d{3,5}(?:gemm|cudnn)"),
    ("float64", r"float64|fp64|f64|double|dgemm"),
)
# CUTLASS's C++ types in a mangled name follow their length ("...NS_6half_tE...").
_MANGLED = {"bfloat16": "bfloat16_t", "float16": "half_t", "float32": "tfloat32_t"}
_DTYPE_RES = [(d, re.compile(rf"(?<![a-z0-9])(?:{p})"
                             + (rf"|\d{_MANGLED[d]}" if d in _MANGLED else ""), re.I))
              for d, p in _DTYPES]


def dtype_of(kernel: str, op: str | None = None) -> str | None:
  """The dtype the kernel name spells (else the op name), or None."""
  for text in (kernel, op or ""):
    for dtype, pattern in _DTYPE_RES:
      if pattern.search(text):
        return dtype
  return None


def _flag(value: Any) -> bool | None:  # A bool, or its text: "True", "1", "false", ...
  text = str(value).strip().lower()
  return {"true": True, "1": True, "false": False, "0": False}.get(text)


def _number(value: Any) -> float | None:
  try:
    return float(value)
  except (TypeError, ValueError):
    return None


def _key(header: str) -> str:
  return re.sub(r"[^a-z0-9]", "", header.lower())


_BY_KEY = {_key(h): col for col, label in _COLUMNS.items() for h in (col, label)}
_BY_KEY["totaldurationus"] = "total_duration_us"  # Older plugins: "(us)", not "(μs)".


def _table(data: Any) -> tuple[list[str], list[dict[str, Any]], str | None]:
  """(column ids, rows as {column id: value}, note) from JSON, CSV or a DataTable."""
  if data is None:
    return [], [], "no kernel_stats output"
  if isinstance(data, (bytes, bytearray)):
    data = bytes(data).decode("utf-8", errors="replace")
  if isinstance(data, str):
    text = data.strip()
    if not text:
      return [], [], "empty kernel_stats output"
    if text[0] not in "[{":
      try:
        lines = list(csv.reader(io.StringIO(text)))
      except csv.Error as e:
        return [], [], f"kernel_stats output is neither JSON nor CSV ({e})"
      header = [_BY_KEY.get(_key(h), h) for h in lines[0]]
      return header, [dict(zip(header, row)) for row in lines[1:] if row], None
    try:
      data = json.loads(text)
    except ValueError as e:
      return [], [], f"kernel_stats output is not valid JSON ({e})"
  if isinstance(data, list):  # Some tools wrap their table(s) in a list.
    data = next((t for t in data if isinstance(t, dict) and "cols" in t), None)
  if not isinstance(data, dict) or not isinstance(data.get("cols"), list):
    return [], [], "not a kernel_stats DataTable (no `cols`)"
  ids = [c.get("id") if isinstance(c, dict) else None for c in data["cols"]]
  rows = []
  found = data.get("rows")
  for row in found if isinstance(found, list) else []:
    cells = row.get("c") if isinstance(row, dict) else None
    if isinstance(cells, list):
      rows.append({i: (c.get("v") if isinstance(c, dict) else None)
                   for i, c in zip(ids, cells)})
  return ids, rows, None


def parse(data: Any) -> dict[str, Any]:
  """{"rows": [{op, dtype, kernel, ms, occurrences, tensor_core_eligible,
  tensor_core_used}], "note": why the rows are missing or incomplete, or None}."""
  try:
    columns, records, note = _table(data)
  except Exception as e:  # A diagnosis aid: odd output is a note, never a crash.
    return {"rows": [], "note": f"unreadable kernel_stats output ({e!r})"}
  if note:
    return {"rows": [], "note": note}
  missing = [c for c in _REQUIRED if c not in columns]
  if missing:
    return {"rows": [], "note": f"not a kernel_stats table: no {', '.join(missing)}"}
  rows, skipped = [], 0
  for r in records:
    us, kernel = _number(r.get("total_duration_us")), r.get("kernel_name")
    if us is None or not kernel:
      skipped += 1
      continue
    op = r.get("op_name") or None  # Empty: a kernel no TensorFlow op launched.
    count = _number(r.get("occurrences"))
    rows.append({"op": op, "dtype": dtype_of(str(kernel), op), "kernel": str(kernel),
                 "ms": us / 1e3, "occurrences": int(count) if count else count,
                 "tensor_core_eligible": _flag(r.get("is_op_tensor_core_eligible")),
                 "tensor_core_used": _flag(r.get("is_kernel_using_tensor_core"))})
  if not rows:
    note = ("kernel_stats lists no kernels (a CPU-only trace, or no GPU step profiled)"
            + (f"; {skipped} unreadable row(s)" if skipped else ""))
  elif skipped:
    note = f"{skipped} row(s) without a kernel name or duration skipped"
  return {"rows": rows, "note": note}


def missed_tensor_cores(rows: list[dict[str, Any]]) -> dict[str, Any]:
  """Ops xprof calls Tensor Core eligible whose kernels did not use them, per (op,
  dtype), with their time and share of all kernel time, largest first."""
  total = sum(r["ms"] for r in rows)
  groups: dict[tuple, dict[str, Any]] = {}
  for r in rows:
    if r["tensor_core_eligible"] and r["tensor_core_used"] is False:
      g = groups.setdefault((r["op"], r["dtype"]), {
          "op": r["op"], "dtype": r["dtype"], "ms": 0.0, "kernels": []})
      g["ms"] += r["ms"]
      if r["kernel"] not in g["kernels"]:
        g["kernels"].append(r["kernel"])
  missed = sorted(groups.values(), key=lambda g: -g["ms"])
  for g in missed:
    g["share"] = g["ms"] / total if total else None
  missed_ms = sum(g["ms"] for g in missed)
  eligible_ms = sum(r["ms"] for r in rows if r["tensor_core_eligible"])
  return {"kernel_ms": total, "eligible_ms": eligible_ms, "missed_ms": missed_ms,
          "missed_share": missed_ms / total if total else None, "missed": missed,
          "note": None if total else "no kernel time recorded"}


def from_trace(trace: str) -> dict[str, Any]:
  """parse() of xprof's kernel_stats for one `.xplane.pb`; a note when xprof fails."""
  try:
    data, _ = traces.tool_data(trace, "kernel_stats")  # xprof's converter.
  except Exception as e:  # No xprof, or a trace it cannot read: say so, go on.
    return {"rows": [], "note": f"xprof could not convert {trace}: {e}"}
  return parse(data)
