"""Diagnosis of a sweep folder: what only a grid of cells shows.

- speed-up: each 16-bit policy's ms/step against float32's, cell by cell (same model,
  image size, loop, XLA, batch), with the hardware reason when there is one;
- memory: a 16-bit policy fits a batch size at which float32 ran out of memory;
- overhead: step time that barely grows with the batch size (per-step overhead);
- and each cell's own top finding, from the diagnosis its run wrote.
mpt/diagnose.py prints and writes the result.
"""

import collections
import json
import pathlib
from typing import Any

from mpt import detectors
from mpt import evidence
from mpt import sweep_report

SCALING = 0.5  # step-time growth / batch growth below this: overhead dominates


def cell_dir(folder: pathlib.Path, row) -> pathlib.Path | None:
  """A cell's run folder: under the sweep folder's cells/ (wherever the sweep was run
  from, or copied to), else the path the CSV recorded."""
  if not row.get("run_dir"):
    return None
  inside = folder / "cells" / pathlib.Path(row["run_dir"]).name
  return inside if inside.is_dir() else pathlib.Path(row["run_dir"])


def _key(row):
  return (row["model"], row["image_size"], row["loop"], row["jit_compile"])


def _ms(row) -> float | None:
  return float(row["ms_per_step"]) if row.get("status") == "ok" and row.get(
      "ms_per_step") else None


def speedups(folder: pathlib.Path, rows) -> list[detectors.Finding]:
  base = {(_key(r), r["batch_size"]): _ms(r) for r in rows if r["policy"] == "float32"}
  by_policy = collections.defaultdict(list)
  for r in rows:
    b, ms = base.get((_key(r), r["batch_size"])), _ms(r)
    if r["policy"] in detectors.SIXTEEN and b and ms:
      by_policy[r["policy"]].append((b / ms, r))
  findings = []
  for policy, cells in sorted(by_policy.items()):
    xs = [x for x, _ in cells]
    if max(xs) >= detectors.SLOWER_THAN_FLOAT32:
      continue
    lines = [f"{policy} vs float32 in {len(cells)} cell(s): {min(xs):.2f}x to "
                f"{max(xs):.2f}x float32's speed"]
    lines += [f"batch {r['batch_size']}, {r['loop']}: {x:.2f}x" for x, r in cells[:6]]
    reason = evidence.no_fast_path({"hardware": _hardware(folder, rows)}, policy)
    if reason:
      lines.insert(0, reason[0])
    findings.append(detectors.Finding(
        f"no_speedup:{policy}", "high" if reason else "medium", 1 - max(xs),
        f"{policy} is slower than float32 in every cell",
        f"speed-up over float32 < {detectors.SLOWER_THAN_FLOAT32:g}x", lines,
        f"--policy={reason[1]}" if reason else
        "profile one cell (--profile_steps=A,B) and diagnose it"))
  return findings


def _hardware(folder: pathlib.Path, rows) -> dict[str, Any]:
  for r in rows:
    path = (cell_dir(folder, r) or folder / "-") / "summary.json"
    if path.is_file():
      hw = json.loads(path.read_text()).get("hardware")
      if hw:
        return hw
  return {}


def memory(rows) -> list[detectors.Finding]:
  findings = []
  groups = collections.defaultdict(list)
  for r in rows:
    groups[_key(r)].append(r)
  for key, cells in groups.items():
    oom32 = sorted((int(r["batch_size"]), r.get("error") or "") for r in cells
                   if r["policy"] == "float32" and r["status"] == "OOM")
    if not oom32:
      continue
    (oom_batch, error), oom32 = oom32[0], [b for b, _ in oom32]
    fit32 = max((int(r["batch_size"]) for r in cells
                 if r["policy"] == "float32" and r["status"] == "ok"), default=None)
    for policy in detectors.SIXTEEN:
      fits = sorted(int(r["batch_size"]) for r in cells
                    if r["policy"] == policy and r["status"] == "ok"
                    and int(r["batch_size"]) >= oom32[0])
      if fits:
        findings.append(detectors.Finding(
            f"memory:{policy}", "low", 0.0,
            f"{policy} fits batch {fits[-1]} where float32 ran out of memory",
            "a float32 cell OOM and a 16-bit cell of that batch size or larger ok",
            [f"{key[0]} {key[1]} px {key[2]}: float32 OOM at batch {oom_batch} "
             f"({error[:120]}); largest float32 batch that fit: {fit32}",
             f"{policy} ran batch(es) {fits}"],
            f"--policy={policy} --batch_size={fits[-1]} (check accuracy at that batch)"))
  return findings


def overhead(rows) -> list[detectors.Finding]:
  findings = []
  groups = collections.defaultdict(list)
  for r in rows:
    if _ms(r):
      groups[_key(r) + (r["policy"],)].append((int(r["batch_size"]), _ms(r)))
  for key, points in groups.items():
    if len(points) < 2:
      continue
    (b0, t0), (b1, t1) = min(points), max(points)
    growth = (t1 / t0) / (b1 / b0)
    if growth < SCALING:
      findings.append(detectors.Finding(
          f"overhead:{key[4]}", "medium", 1 - growth,
          f"{key[4]} step time barely grows with the batch size",
          f"(step-time ratio / batch ratio) < {SCALING}",
          [f"{key[0]} {key[2]}: batch {b0} {t0:.1f} ms/step, batch {b1} {t1:.1f} ms/step"
           f" ({t1 / t0:.2f}x the time for {b1 / b0:.0f}x the images)"],
          f"--batch_size={b1} or larger; --jit_compile"))
  return findings


def diagnose(folder: pathlib.Path) -> dict[str, Any]:
  rows = sweep_report.read_csv(folder / "sweep.csv")
  findings = detectors.rank(speedups(folder, rows) + memory(rows) + overhead(rows))
  cells = []
  for r in rows:
    path = (cell_dir(folder, r) or folder / "-") / "diagnosis.json"
    top = "-"
    if path.is_file():
      found = json.loads(path.read_text()).get("findings") or []
      top = found[0]["title"] if found else "no findings"
    cells.append({"cell": f"{r['model']} {r['image_size']}px b{r['batch_size']} "
                          f"{r['policy']} {r['loop']}" + (" xla" if r["jit_compile"] in
                                                          ("True", True) else ""),
                  "status": r["status"], "ms_per_step": r.get("ms_per_step"), "top": top})
  return {"kind": "sweep", "run_dir": str(folder),
          "findings": [f.__dict__ for f in findings], "cells": cells}
