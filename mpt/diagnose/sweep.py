"""Diagnosis of a sweep folder: what only a grid of cells shows.

- speed-up: each 16-bit policy's ms/step against float32's, cell by cell (same model,
  image size, loop, XLA, batch), with the reason and the policy to use from the
  cells' measured policy verdict (summary.json `policy_verdict`) when they
  recorded one, else from the CPU flags / compute capability;
- memory: a 16-bit policy fits a batch size at which float32 ran out of memory;
- overhead: step time that barely grows with the batch size (per-step overhead);
- accuracy: each 16-bit policy's final metrics over seeds (--seeds) against
  float32's spread over its seeds (mpt/records/spread.py): which stayed within;
- and each cell's own top finding, from the diagnosis its run wrote.
mpt/diagnose/diagnosis.py prints and writes the result (mpt/diagnose/report.py). The
cells come from sweep.csv through mpt/records/cells.py, their machine from a cell's
summary.json through mpt/records/summary.py.
"""

import collections
import json
import pathlib
from typing import Any

from mpt import config
from mpt.diagnose import evidence
from mpt.diagnose import findings as words
from mpt.diagnose.findings import Finding, rank
from mpt.diagnose.thresholds import HIGH_LOSS, SCALING, SLOWER_THAN_FLOAT32
from mpt.records import cells as cells_lib
from mpt.records import spread
from mpt.records import summary as summary_lib
from mpt.records.cells import Cell
from mpt.records.cost import times
from mpt.records.machine import Hardware
from mpt.records.verdict import PolicyVerdict


def _cell_file(folder: pathlib.Path, cell: Cell, name: str) -> pathlib.Path:
  """A file of the cell's run folder: under the sweep folder's cells/ (wherever the
  sweep was run from, or copied to), else the path the CSV recorded (a path to nothing
  where it recorded none)."""
  if not cell.run_dir:
    return folder / "-" / name
  inside = folder / "cells" / pathlib.Path(cell.run_dir).name
  return (inside if inside.is_dir() else pathlib.Path(cell.run_dir)) / name


def _summaries(folder: pathlib.Path, cells: list[Cell]):
  """The cells' summary.json records, each read when it is reached, where there is one."""
  for c in cells:
    path = _cell_file(folder, c, "summary.json")
    if path.is_file():
      yield summary_lib.read(path)


def _key(c: Cell) -> tuple:
  """Cells that differ only in policy and batch size."""
  return (c.model, c.image_size, c.loop, c.jit_compile)


def speedups(folder: pathlib.Path, cells: list[Cell]) -> list[Finding]:
  base = {(_key(c), c.batch_size): c.ms for c in cells if c.policy == "float32"}
  by_policy = collections.defaultdict(list)
  for c in cells:
    b = base.get((_key(c), c.batch_size))
    if config.sixteen_bit(c.policy) and b and c.ms:
      by_policy[c.policy].append((b / c.ms, c))
  findings = []
  slower = {p for p, found in by_policy.items()
            if max(x for x, _ in found) < SLOWER_THAN_FLOAT32}
  for policy in sorted(slower):
    found = by_policy[policy]
    xs = [x for x, _ in found]
    loss = 1 / max(xs)  # Every cell of the policy lost at least this much.
    lines = [f"{policy} vs float32 in {len(found)} cell(s): {times(min(xs))} to "
                f"{times(max(xs))} float32's speed"]
    lines += [f"batch {c.batch_size}, {c.loop}: {times(x)}" for x, c in found[:6]]
    based_on = ["sibling runs"]
    if k := _kernels(folder, [c for _, c in found]):
      # The policy measured fastest, unless this sweep measured it slower too.
      better = k.fastest or "float32"
      if better == policy or better in slower:
        better = "float32"
      reason = (_probe_reason(k, policy), better)
      based_on.append("probe")
      severity = "high" if loss >= HIGH_LOSS else "medium"
    else:
      hw = _hardware(folder, cells)
      reason = evidence.no_fast_path(hw, policy)
      if reason:
        based_on.append("compute capability" if hw and hw.gpus else "flags")
      severity = "high" if reason or loss >= HIGH_LOSS else "medium"
    if reason:
      lines.insert(0, reason[0])
    findings.append(Finding(
        f"no_speedup:{policy}", severity, 1 - max(xs),
        f"{policy} is slower than float32 in every cell",
        f"speed-up over float32 < {times(SLOWER_THAN_FLOAT32)} in every cell; "
        f"high from {times(HIGH_LOSS)} float32's time, or when the CPU flags / "
        f"compute capability explain it", lines,
        f"--policy={reason[1]}" if reason else
        "profile one cell (--profile_steps=A,B) and diagnose it", based_on, loss))
  return findings


def _kernels(folder: pathlib.Path, cells: list[Cell]) -> PolicyVerdict | None:
  """The measured verdict (summary.json `policy_verdict`: the step's cost or the kernel
  probe) of the first of `cells` (one policy's) that recorded one."""
  return next((s.policy_verdict for s in _summaries(folder, cells)
               if s.policy_verdict and s.policy_verdict.measured), None)


def _probe_reason(k: PolicyVerdict, policy: str) -> str:
  """Why the measurement says `policy` is slow here (or that its kernels are not)."""
  ratio = k.ratio or k.policy_ratios.get(policy)
  why = (f"{words.rests_on(k)} ({k.source or 'probe'}): {policy} at {times(ratio)} "
         "float32's time")
  if k.slow:
    kernel = (k.impl or "?") + (" (oneDNN's reference kernel)" if k.reference else "")
    why += ((f"; worst: {k.op} runs {kernel}" if k.op else "")
            + (f", {times(k.op_ratio)} float32's time" if k.op_ratio else ""))
  else:
    why += ": its kernels alone do not explain the loss"
  if k.fastest and k.fastest != policy and k.fastest_ratio:
    why += f"; measured fastest: {k.fastest} ({times(k.fastest_ratio)} float32's time)"
  if k.contradicts:
    why += f" ({k.contradicts})"
  return why


def _hardware(folder: pathlib.Path, cells: list[Cell]) -> Hardware | None:
  """The machine the sweep ran on: the first cell's summary.json that records it."""
  return next((s.hardware for s in _summaries(folder, cells) if s.hardware), None)


def _groups(cells: list[Cell], key) -> dict[tuple, list[Cell]]:
  groups = collections.defaultdict(list)
  for c in cells:
    groups[key(c)].append(c)
  return groups


def memory(cells: list[Cell]) -> list[Finding]:
  findings = []
  for key, group in _groups(cells, _key).items():
    oom32 = sorted((c.batch_size, c.error) for c in group
                   if c.policy == "float32" and c.status.startswith("OOM"))
    if not oom32:
      continue
    oom_batch, error = oom32[0]
    fit32 = max((c.batch_size for c in group
                 if c.policy == "float32" and c.status == "ok"), default=None)
    for policy in config.SIXTEEN:
      fits = sorted(c.batch_size for c in group
                    if c.policy == policy and c.status == "ok"
                    and c.batch_size >= oom_batch)
      if fits:
        findings.append(Finding(
            f"memory:{policy}", "low", 0.0,
            f"{policy} fits batch {fits[-1]} where float32 ran out of memory",
            "a float32 cell OOM and a 16-bit cell of that batch size or larger ok",
            [f"{key[0]} {key[1]} px {key[2]}: float32 OOM at batch {oom_batch} "
             f"({error[:120]}); largest float32 batch that fit: {fit32}",
             f"{policy} ran batch(es) {fits}"],
            f"--policy={policy} --batch_size={fits[-1]} (check accuracy at that batch)"))
  return findings


def overhead(cells: list[Cell]) -> list[Finding]:
  findings = []
  timed = [c for c in cells if c.ms]
  for key, group in _groups(timed, lambda c: _key(c) + (c.policy,)).items():
    points = [(c.batch_size, c.ms) for c in group]
    if len(points) < 2:
      continue
    (b0, t0), (b1, t1) = min(points), max(points)
    growth = (t1 / t0) / (b1 / b0)
    if growth < SCALING:
      findings.append(Finding(
          f"overhead:{key[4]}", "medium", 1 - growth,
          f"{key[4]} step time barely grows with the batch size",
          f"(step-time ratio / batch ratio) < {SCALING}",
          [f"{key[0]} {key[2]}: batch {b0} {t0:.1f} ms/step, batch {b1} {t1:.1f} ms/step"
           f" ({times(t1 / t0)} the time for {times(b1 / b0)} the images)"],
          f"--batch_size={b1} or larger; --jit_compile"))
  return findings


def accuracy(cells: list[Cell]) -> tuple[list[Finding], list[str]]:
  """(a finding per 16-bit policy whose final metrics left float32's spread over seeds
  in some configuration, a line per policy and configuration saying whether it stayed
  within)."""
  rows = spread.across_seeds([c for c in cells if c.status == "ok"],
                             lambda c: _key(c) + (c.batch_size, c.machine))
  findings, lines = [], []
  if not any(r.within is not None for r in rows):
    seeds = max((r.seeds for r in rows if r.policy == "float32"), default=0)
    return [], ([f"not judged: float32 ran {seeds} seed(s) per cell (--seeds=3 gives "
                 "its spread)"] if len(rows) > 1 else [])
  for r in rows:
    if r.policy == "float32":
      continue
    model, size, loop, jit, batch, machine = r.key
    where = f"{model} {size} px b{batch} {loop}{' XLA' if jit else ''}" + (
        f" on {machine}" if machine else "")
    verdict = ("not judged (float32 needs 2+ seeds: --seeds=3)" if r.within is None
               else "within float32's spread" if r.within else "OUTSIDE float32's spread")
    lines.append(f"{r.policy} at {where}: {verdict} ({r.seeds} seeds; {r.describe()})")
    if r.within is False:
      out = [j for j in r.judged if not j.within]
      findings.append(Finding(
          f"metrics_spread:{r.policy}", "high" if any("accuracy" in j.metric for j in out)
          else "medium", 1.0, f"{r.policy}'s final metrics outside float32's spread "
          f"({where})", "a seed's final metric outside float32's min..max over seeds, "
          "widened by its width", [j.describe() for j in out],
          f"diagnose the {r.policy} cells' run folders: their numerics name the layer "
          "(--numerics=on)", ["sibling runs"]))
  return findings, lines


def diagnose(folder: pathlib.Path) -> dict[str, Any]:
  """The sweep-wide findings and each cell's top finding, as written to diagnosis.json."""
  cells = cells_lib.read_csv(folder / "sweep.csv")
  spread_findings, accuracy_lines = accuracy(cells)
  findings = rank(speedups(folder, cells) + memory(cells) + overhead(cells) +
                  spread_findings)
  table = []
  for c in cells:
    path = _cell_file(folder, c, "diagnosis.json")
    top = "-"
    if path.is_file():
      found = json.loads(path.read_text()).get("findings") or []
      top = found[0]["title"] if found else "no findings"
    table.append({"cell": c.label, "status": c.status, "ms_per_step": c.ms_per_step,
                  "top": top})
  return {"kind": "sweep", "run_dir": str(folder),
          "findings": [f.__dict__ for f in findings], "cells": table,
          "accuracy": accuracy_lines}
