"""A sweep's report: the seed-style Markdown table `sweep.md`, and the optional
`sweep.png`, from the sweep's cells (mpt/records/cells.py owns sweep.csv).

The table is laid out like the seed's: one table per model and image size (and XLA
setting), rows = batch size, columns = ms/step per policy (x loop when there are
several), then each 16-bit policy's step time over float32's (mpt/records/cost.py's
`times`, the one wording of a ratio: above 1 is slower). A cell that did not finish
shows its status (`OOM`, `timeout`, `failed`, ...) instead of a number, as the seed
showed a dash. With --seeds, a cell's figure is the median over its seeds, and a second
table gives each policy's final metrics beside float32's spread over seeds: the
accuracy the seed's table never compared.
"""

import dataclasses
import pathlib

from mpt.records import cost
from mpt.records import spread
from mpt.records.cells import Cell


def markdown(cells: list[Cell]) -> str:
  """The seed-style tables of a sweep's cells (read back from sweep.csv or fresh)."""
  groups: dict[tuple, list[Cell]] = {}
  for c in cells:
    groups.setdefault((c.machine, c.model, c.image_size, c.jit_compile), []).append(c)
  out = []
  for (machine, model, size, jit), group in groups.items():
    loops = list(dict.fromkeys(c.loop for c in group))
    columns = list(dict.fromkeys((c.policy, c.loop) for c in group))
    label = lambda p, l: p if len(loops) == 1 else f"{p} {l}"
    ratios = [(p, l) for p, l in columns if p != "float32" and ("float32", l) in columns]
    cell = _over_seeds(group)
    batches = sorted({b for b, _, _ in cell})
    xla = ", XLA" if jit else ""
    on = f" on {machine}" if machine else ""  # --machines=all: a block per machine.
    header = ["batch"] + [label(p, l) for p, l in columns] + \
        [f"{label(p, l)} time vs float32" for p, l in ratios]
    out += [f"## {model}, {size} px{xla}{on}: ms/step\n",
            "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for b in batches:
      line = [str(b)]
      for p, l in columns:
        c = cell.get((b, p, l))
        line.append("" if c is None else (f"{c.ms:.1f}" if c.ms else c.status))
      for p, l in ratios:
        mine, base = cell.get((b, p, l)), cell.get((b, "float32", l))
        ok = mine and base and mine.ms and base.ms
        line.append(cost.times(mine.ms / base.ms) if ok else "-")
      out.append("| " + " | ".join(line) + " |")
    out.append("")
  return "\n".join(out + accuracy(cells))


def _over_seeds(group: list[Cell]) -> dict[tuple, Cell]:
  """(batch, policy, loop) -> its cell; over several seeds, the first finished one
  with the median ms/step of them all."""
  seeds: dict[tuple, list[Cell]] = {}
  for c in group:
    seeds.setdefault((c.batch_size, c.policy, c.loop), []).append(c)
  found = {}
  for k, cs in seeds.items():
    done = sorted(c.ms for c in cs if c.ms)
    first = next((c for c in cs if c.ms), cs[0])
    found[k] = dataclasses.replace(first, ms_per_step=done[len(done) // 2]) if done \
        else first
  return found


def _key(c: Cell) -> tuple:
  return (c.machine, c.model, c.image_size, c.jit_compile, c.batch_size, c.loop)


def accuracy(cells: list[Cell]) -> list[str]:
  """Accuracy beside speed: each policy's final metrics over seeds, and whether every
  seed stayed within float32's spread (mpt/records/spread.py)."""
  rows = spread.across_seeds([c for c in cells if c.status == "ok"], _key)
  if not any(r.values for r in rows):
    return []
  out = ["## Accuracy beside speed: final metrics over seeds", "",
         "| model | batch | policy | seeds | final metrics | within float32's spread |",
         "|---|---|---|---|---|---|"]
  for r in rows:
    (machine, model, size, jit, batch, loop) = r.key
    where = ("-" if r.policy == "float32" else
             "not judged (needs float32 over 2+ seeds)" if r.within is None else
             "yes" if r.within else "no: " + "; ".join(
                 j.describe() for j in r.judged if not j.within))
    out.append(f"| {model} {size} px{' XLA' if jit else ''} {loop}"
               f"{' on ' + machine if machine else ''} | {batch} | {r.policy} | "
               f"{r.seeds} | {r.describe()} | {where} |")
  return out + [""]


def plot(cells: list[Cell], path: pathlib.Path) -> str:
  """ms/step and images/s vs batch size, a line per policy/loop, a row of panels per
  machine (--machines=all); optional matplotlib."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
  except ImportError:
    return "plot skipped: matplotlib is not installed (pip install matplotlib)"
  done = [c for c in cells if c.ms]
  if not done:
    return "plot skipped: no finished cell"
  machines = list(dict.fromkeys(c.machine for c in done))  # A row of panels each.
  fig, axes = plt.subplots(len(machines), 2, figsize=(11, 4 * len(machines)),
                           squeeze=False)
  for (ax1, ax2), machine in zip(axes, machines):
    _panel(ax1, ax2, [c for c in done if c.machine == machine], machine,
           matplotlib.ticker.ScalarFormatter)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path.name


def _panel(ax1, ax2, done: list[Cell], machine: str, formatter) -> None:
  """One machine's ms/step and images/s against the batch size, a line per
  policy/loop."""
  lines: dict[str, list] = {}
  for c in done:
    key = f"{c.model} {c.image_size}px {c.policy} {c.loop}"
    lines.setdefault(key, []).append((c.batch_size, c.ms, c.images_per_sec))
  for i, (ax, ylabel) in enumerate(((ax1, "ms/step"), (ax2, "images/s")), start=1):
    for key, points in lines.items():
      ax.plot([p[0] for p in sorted(points)], [p[i] for p in sorted(points)], "o-",
              label=key)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(formatter())
    ax.set_xlabel("batch size")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if machine:
      ax.set_title(machine, fontsize=9)
  ax1.legend(fontsize=7)
