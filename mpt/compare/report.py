"""The comparison's table and chart, from the runs' records: `lines(entries)` decides
each run's float32 baseline and what sets it apart; `text()`, `markdown()` and `plot()`
lay it out for the terminal, compare.md and compare.png.

One row per run, grouped by configuration (summary.SAME_CONFIG: what must be equal for
a float32 run to be the baseline of a 16-bit one), float32 first in each group. The
speed-up is the float32 run's ms/step over the run's, the float32 run of the same
configuration among the compared runs (mpt/records/summary.py `baseline_of`, the rule
the diagnosis uses too: the same loop preferred, then the newest); a float32 run is
its own baseline. A figure a run's summary.json lacks is computed from
those it has where it can be (images/s from the batch and ms/step, GFLOP/s from the
FLOPs per step), else shown as `-`.
"""

import collections
import dataclasses
import pathlib

from mpt import config
from mpt.records import cost as cost_records
from mpt.records import spread
from mpt.records import summary as summary_lib
from mpt.records.summary import RunSummary

# A run that differs from the others in one of these (not only in policy and loop) is
# flagged: its speed-up or its accuracy are not like for like.
FLAGGED = summary_lib.SAME_CONFIG + ("epochs", "steps_per_epoch", "seed")
HEADER = ("run", "model", "policy", "loop", "ms/step (p10-p90)", "images/s",
          "val acc", "vs float32", "achieved / ceiling GFLOP/s", "notes")
NUMERIC = {4, 5, 6, 7, 8}  # Right-aligned columns.
LEGEND = (
    "ms/step: median step time after warm-up (p10-p90 of the timed steps).",
    "vs float32: the ms/step of the float32 run of the same configuration over this "
    "run's (> 1 = faster); `(vs fit)`: that float32 run used the other loop.",
    "achieved / ceiling: the GFLOP/s the run achieved over the matmul rate "
    "--mode=microbench measured for its compute dtype, or over the `peak` (data sheet "
    "or estimate) where none was measured.")
FLAG_LEGEND = "*: differs from the other runs in more than policy and loop (notes)."


@dataclasses.dataclass
class Entry:
  """One compared run: its label (the folder, relative to the runs' common parent),
  its record, and when the record was written."""
  label: str
  summary: RunSummary
  mtime: float = 0.0

  @property
  def ms(self) -> float | None:
    s = self.summary
    return s.ms_per_step if s.status == "completed" else None

  @property
  def machine(self) -> str:
    """The machine the run measured: its CPU model and GPUs (or its device line)."""
    hw = self.summary.hardware
    if hw is None:
      return self.summary.device or "unknown machine"
    gpus = sorted({g.name for g in hw.gpus})
    return hw.cpu + (f" + {', '.join(gpus)}" if gpus else "")


@dataclasses.dataclass
class Line:
  """One row of the table: the run, its float32 baseline, what sets it apart."""
  entry: Entry
  baseline: Entry | None
  differs: list[str]

  @property
  def speedup(self) -> float | None:
    mine, base = self.entry.summary.ms_per_step, self.baseline and self.baseline.ms
    return base / mine if mine and base else None


def _config(s: RunSummary) -> tuple:
  return tuple(getattr(s, k) for k in summary_lib.SAME_CONFIG)


def baseline(entry: Entry, entries: list[Entry]) -> Entry | None:
  """The float32 run of `entry`'s configuration; itself for a float32 run."""
  if entry.summary.policy == "float32":
    return entry
  return summary_lib.baseline_of(entry.summary,
                                 [(e.summary, e.mtime, e) for e in entries if e.ms])


def _show(value) -> str:
  return '""' if value == "" else str(value)


def differences(entries: list[Entry]) -> dict[str, list[str]]:
  """{label: ["batch_size 64 (others 32)", ...]}: where a run's FLAGGED field is not
  the one value most of the runs share (each run, where no value is the most common)."""
  out: dict[str, list[str]] = {e.label: [] for e in entries}
  for key in FLAGGED:
    values = [getattr(e.summary, key) for e in entries]
    counts = collections.Counter(map(repr, values)).most_common()
    if len(counts) < 2:
      continue
    common = counts[0][0] if counts[0][1] > counts[1][1] else None
    for e, value in zip(entries, values):
      if repr(value) != common:
        others = dict.fromkeys(_show(v) for v in values if repr(v) != repr(value))
        out[e.label].append(f"{key} {_show(value)} (others {', '.join(others)})")
  return out


def lines(entries: list[Entry]) -> list[Line]:
  """The table's rows: grouped by configuration (in order of first appearance), then
  by loop, float32 first."""
  machines = list(dict.fromkeys(e.machine for e in entries))
  groups = list(dict.fromkeys(_config(e.summary) for e in entries))
  rank = lambda p: config.POLICIES.index(p) if p in config.POLICIES else len(
      config.POLICIES)
  ordered = sorted(entries, key=lambda e: (machines.index(e.machine),
                                           groups.index(_config(e.summary)),
                                           e.summary.loop or "",
                                           rank(e.summary.policy), e.label))
  differs = differences(entries)
  return [Line(e, baseline(e, entries), differs[e.label]) for e in ordered]


def _achieved(s: RunSummary) -> str:
  achieved = s.achieved_gflops
  if achieved is None:
    achieved = summary_lib.achieved_gflops(s.flops_per_step, s.ms_per_step)
  if achieved is None:
    return "-"
  ceiling, peak = s.microbench_gflops, ""
  if not ceiling and s.peak_gflops:
    ceiling, peak = s.peak_gflops, " peak"
  if not ceiling:
    return f"{achieved:.1f} / -"
  if achieved > ceiling:  # Then it was no ceiling: say so rather than print 695%.
    return f"{achieved:.1f} / {ceiling:.0f}{peak} (above it: not a ceiling)"
  return f"{achieved:.1f} / {ceiling:.0f}{peak} ({achieved / ceiling:.0%})"


def row(line: Line) -> list[str]:
  """The row's cells, as text."""
  s = line.entry.summary
  times = s.step_time_ms or {}
  ms = "-" if s.ms_per_step is None else f"{s.ms_per_step:.1f}"
  if s.ms_per_step is not None and times.get("p10") is not None \
      and times.get("p90") is not None:
    ms += f" ({times['p10']:.1f}-{times['p90']:.1f})"
  ips = s.images_per_sec
  if ips is None and s.ms_per_step and s.batch_size:
    ips = s.batch_size / s.ms_per_step * 1e3
  speedup = "-" if line.speedup is None else cost_records.times(line.speedup)
  if line.speedup is not None and line.baseline.summary.loop != s.loop:
    speedup += f" (vs {line.baseline.summary.loop})"
  notes = line.differs + ([s.status] if s.status != "completed" else [])
  model = s.model or "-"
  return [line.entry.label + (" *" if line.differs else ""),
          model + (f" ({s.model_opts})" if s.model_opts else ""),
          s.policy or "-", s.loop or "-", ms,
          "-" if ips is None else f"{ips:.1f}",
          "-" if s.val_accuracy is None else f"{s.val_accuracy:.3f}",
          speedup, _achieved(s), "; ".join(notes)]


def accuracy(rows: list[Line]) -> list[str]:
  """Accuracy beside speed: per configuration and policy, the final metrics over the
  compared seeds, and whether each 16-bit run stayed within float32's spread
  (mpt/records/spread.py); [] where no configuration ran float32 with 2+ seeds."""
  key = lambda s: _config(s) + (s.loop, s.epochs, s.steps)
  found = spread.across_seeds([l.entry.summary for l in rows
                               if l.entry.summary.status == "completed"], key)
  if not any(r.within is not None for r in found):
    return []
  out = []
  for r in found:
    verdict = ("float32's spread" if r.policy == "float32" else
               "not judged" if r.within is None else
               "within float32's spread" if r.within else "OUTSIDE float32's spread: "
               + "; ".join(j.describe() for j in r.judged if not j.within))
    out.append(f"{r.key[0]} b{r.key[3]} {r.key[-3]} {r.policy} ({r.seeds} seeds): "
               f"{r.describe()}; {verdict}")
  return out


def _legend(rows: list[Line]) -> list[str]:
  return list(LEGEND) + ([FLAG_LEGEND] if any(l.differs for l in rows) else [])


def by_machine(rows: list[Line]) -> list[tuple[str, list[Line]]]:
  """The rows in one block per machine (runs copied from several machines into one
  logdir); one block, unnamed, when they all come from one."""
  machines = list(dict.fromkeys(l.entry.machine for l in rows))
  if len(machines) < 2:
    return [("", rows)]
  return [(m, [l for l in rows if l.entry.machine == m]) for m in machines]


def text(rows: list[Line]) -> str:
  """The table as aligned plain text (a block per machine), and its legend."""
  cells = [list(HEADER)] + [row(l) for l in rows]
  widths = [max(len(r[i]) for r in cells) for i in range(len(HEADER))]
  fmt = lambda r: "  ".join((c.rjust if i in NUMERIC else c.ljust)(widths[i])
                            for i, c in enumerate(r)).rstrip()
  out = []
  for machine, block in by_machine(rows):
    out += ([f"on {machine}:"] if machine else []) + [
        fmt(cells[0]), "  ".join("-" * w for w in widths)] + [fmt(row(l)) for l in block]
  said = accuracy(rows)
  out += ["", "accuracy beside speed (final metrics over seeds):"] + said if said else []
  return "\n".join(out + [""] + _legend(rows)) + "\n"


def markdown(rows: list[Line], note: str = "") -> str:
  """compare.md: a title, `note` (where the runs are), the table, its legend."""
  out = [f"# mpt compare: {len(rows)} run{'s' if len(rows) != 1 else ''}", ""]
  if note:
    out += [note, ""]
  for machine, block in by_machine(rows):
    out += [f"## On {machine}", ""] if machine else []
    out.append("| " + " | ".join(HEADER) + " |")
    out.append("|" + "|".join("---:" if i in NUMERIC else "---"
                              for i in range(len(HEADER))) + "|")
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row(l)) + " |"
            for l in block] + ([""] if machine else [])
  said = accuracy(rows)
  out += ["", "## Accuracy beside speed", ""] + [f"- {l}" for l in said] if said else []
  return "\n".join(out + [""] + [f"{l}  " for l in _legend(rows)]) + "\n"


def plot(rows: list[Line], path: pathlib.Path) -> str | None:
  """compare.png: ms/step per run (p10-p90 whiskers, colour per policy, flagged runs
  hatched, the speed-up at the bar's end); None, or the one line saying why not."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.patches
    import matplotlib.pyplot as plt
  except ImportError:
    return "compare.png skipped: matplotlib is not installed (pip install matplotlib)"
  shown = [l for l in rows if l.entry.summary.ms_per_step]
  if not shown:
    return "compare.png skipped: no run has a ms/step"
  colours = {p: f"C{i}" for i, p in enumerate(config.POLICIES)}
  fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * len(shown)))
  for y, l in enumerate(shown):
    s = l.entry.summary
    ms, times = s.ms_per_step, s.step_time_ms or {}
    whiskers = times.get("p10") is not None and times.get("p90") is not None
    ax.barh(y, ms, xerr=[[ms - times["p10"]], [times["p90"] - ms]] if whiskers else None,
            color=colours.get(s.policy, "grey"), capsize=3, edgecolor="black",
            hatch="//" if l.differs else None, linewidth=0.5)
    if l.speedup is not None:  # Past the whisker, so that neither hides the other.
      ax.annotate(cost_records.times(l.speedup),
                  (max(ms, times["p90"] if whiskers else ms), y), xytext=(4, 0),
                  textcoords="offset points", va="center", fontsize=8)
  ax.set_yticks(range(len(shown)))
  ax.set_yticklabels([row(l)[0] for l in shown], fontsize=8)
  ax.invert_yaxis()  # The table's order, top to bottom.
  ax.margins(x=0.1)
  ax.set_xlabel("ms/step (median; whiskers p10-p90; label: speed-up vs float32)")
  policies = dict.fromkeys(l.entry.summary.policy for l in shown)
  ax.legend(handles=[matplotlib.patches.Patch(color=colours.get(p, "grey"), label=p)
                     for p in policies], fontsize=8, loc="lower right")
  ax.grid(True, axis="x", alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return None
