"""A sweep's records and report: `sweep.csv` (one row per cell, written as cells
finish), the seed-style Markdown table `sweep.md`, and the optional `sweep.png`.

The table is laid out like the seed's: one table per model and image size (and XLA
setting), rows = batch size, columns = ms/step per policy (x loop when there are
several), then the speed-up of each 16-bit policy over float32 (float32 ms/step over
the policy's ms/step: > 1 means faster). A cell that did not finish shows its status
(`OOM`, `timeout`, `failed`) instead of a number, as the seed showed a dash.
"""

import csv
import importlib.metadata
import json
import pathlib
from typing import Any

COLUMNS = ("model", "image_size", "batch_size", "policy", "loop", "jit_compile",
           "status", "ms_per_step", "images_per_sec", "peak_rss_mb", "cpu_percent",
           "val_accuracy", "device", "error", "run_dir", "tf_version", "cpu", "cpu_isa")


def environment() -> dict[str, str]:
  """What the numbers were measured on (without importing TensorFlow)."""
  from mpt.microbench import isa
  cpu = isa.detect()
  try:
    tf_version = importlib.metadata.version("tensorflow")
  except importlib.metadata.PackageNotFoundError:
    tf_version = "?"
  return {"tf_version": tf_version, "cpu": cpu.name,
          "cpu_isa": " ".join(k for k, v in cpu.isa().items() if v)}


def from_summary(path: pathlib.Path) -> dict[str, Any]:
  """A finished cell's figures, from its summary.json."""
  s = json.loads(path.read_text())
  util = s.get("util") or {}
  return {"ms_per_step": s["ms_per_step"], "images_per_sec": s["images_per_sec"],
          "val_accuracy": s.get("val_accuracy"), "device": s.get("device"),
          "peak_rss_mb": util.get("rss_mb", {}).get("max"),
          "cpu_percent": util.get("process_cpu_percent", {}).get("mean")}


def cell_id(cell: dict[str, Any]) -> str:
  """The cell's name, the same for a fresh cell and for its row read back from CSV."""
  xla = str(cell["jit_compile"]).lower() in ("true", "1")
  return (f"{cell['model']}_{cell['image_size']}px_b{cell['batch_size']}_"
          f"{cell['policy']}_{cell['loop']}{'_xla' if xla else ''}")


def read_csv(path: pathlib.Path) -> list[dict[str, str]]:
  """sweep.csv's rows, the newest per cell (a cell run again appends a row), in the
  order the cells first appear."""
  if not path.exists():
    return []
  with path.open(newline="") as f:
    latest = {}
    for row in csv.DictReader(f):
      latest[cell_id(row)] = row
    return list(latest.values())


def append_csv(path: pathlib.Path, row: dict[str, Any]) -> None:
  new = not path.exists()
  with path.open("a", newline="") as f:
    writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
    if new:
      writer.writeheader()
    writer.writerow({k: "" if row.get(k) is None else row[k] for k in COLUMNS})
    f.flush()


def _ms(row) -> float | None:
  return float(row["ms_per_step"]) if row["status"] == "ok" and row["ms_per_step"] \
      not in ("", None) else None


def markdown(rows: list[dict[str, Any]]) -> str:
  """The seed-style tables of a sweep's rows (from the CSV or fresh)."""
  groups: dict[tuple, list] = {}
  for row in rows:
    key = (row["model"], str(row["image_size"]), str(row["jit_compile"]))
    groups.setdefault(key, []).append(row)
  out = []
  for (model, size, jit), group in groups.items():
    loops = list(dict.fromkeys(str(r["loop"]) for r in group))
    columns = list(dict.fromkeys((str(r["policy"]), str(r["loop"])) for r in group))
    label = lambda p, l: p if len(loops) == 1 else f"{p} {l}"
    speedups = [(p, l) for p, l in columns if p != "float32" and ("float32", l) in columns]
    cell = {(int(r["batch_size"]), str(r["policy"]), str(r["loop"])): r for r in group}
    batches = sorted({b for b, _, _ in cell})
    xla = ", XLA" if jit in ("True", "true", "1") else ""
    out.append(f"## {model}, {size} px{xla}: ms/step\n")
    header = ["batch"] + [label(p, l) for p, l in columns] + \
        [f"{label(p, l)} vs float32" for p, l in speedups]
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "---|" * len(header))
    for b in batches:
      line = [str(b)]
      for p, l in columns:
        r = cell.get((b, p, l))
        line.append("" if r is None else (f"{_ms(r):.1f}" if _ms(r) else r["status"]))
      for p, l in speedups:
        mine, base = cell.get((b, p, l)), cell.get((b, "float32", l))
        ok = mine and base and _ms(mine) and _ms(base)
        line.append(f"{_ms(base) / _ms(mine):.2f}x" if ok else "-")
      out.append("| " + " | ".join(line) + " |")
    out.append("")
  return "\n".join(out)


def plot(rows: list[dict[str, Any]], path: pathlib.Path) -> str:
  """ms/step and images/s vs batch size, a line per policy/loop; optional matplotlib."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
  except ImportError:
    return "plot skipped: matplotlib is not installed (pip install matplotlib)"
  done = [r for r in rows if _ms(r)]
  if not done:
    return "plot skipped: no finished cell"
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  lines: dict[str, list] = {}
  for r in done:
    key = f"{r['model']} {r['image_size']}px {r['policy']} {r['loop']}"
    lines.setdefault(key, []).append((int(r["batch_size"]), _ms(r),
                                      float(r["images_per_sec"])))
  for key, points in lines.items():
    points.sort()
    ax1.plot([p[0] for p in points], [p[1] for p in points], "o-", label=key)
    ax2.plot([p[0] for p in points], [p[2] for p in points], "o-", label=key)
  for ax, ylabel in ((ax1, "ms/step"), (ax2, "images/s")):
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("batch size")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
  ax1.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path.name
