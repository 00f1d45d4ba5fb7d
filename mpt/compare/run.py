"""`--mode=compare`: finished runs side by side, in one table.

  python -m mpt.main --mode=compare --runs=logs/A,logs/B
  python -m mpt.main --mode=compare --runs='logs/*' --out=reports/today

Prints the table (mpt/compare/report.py) and writes it as `compare.md`, with
`compare.png` (a bar chart of ms/step; matplotlib, optional) next to it, into --out: by
default the folder holding the runs (their common parent, `logs/` for `logs/*`), where
the table's run names are relative to. A folder named in --runs must be a run folder (it
has a summary.json); what a glob matches that is not one (a sweep folder, runs.csv, an
earlier compare.md) is skipped, the folders among it named in one line.
"""

import glob
import os
import pathlib
from typing import Any

from mpt.compare import report
from mpt.compare.options import CompareOptions
from mpt.errors import UserError
from mpt.records import summary as summary_lib

SUMMARY = "summary.json"
GLOB_CHARS = ("*", "?", "[")


def _not_a_run(path: pathlib.Path) -> str:
  if not path.exists():
    return f"--runs: {path} does not exist"
  if (path / "sweep.csv").exists():
    return f"--runs: {path} is a sweep folder; its runs are {path / 'cells'}/*"
  return f"--runs: {path} has no {SUMMARY}: not a run folder"


def find_runs(spec: str) -> tuple[list[pathlib.Path], list[pathlib.Path]]:
  """The run folders --runs names, each once, in the order given (a glob's matches
  sorted); and the folders its globs matched that are not runs."""
  items = [s.strip() for s in spec.split(",") if s.strip()]
  if not items:
    raise UserError("--mode=compare needs --runs=logs/A,logs/B (run folders; globs "
                    "allowed: --runs='logs/*')")
  found, skipped = [], []
  for item in items:
    if any(c in item for c in GLOB_CHARS):
      matches = [pathlib.Path(m) for m in sorted(glob.glob(os.path.expanduser(item)))]
      if not matches:
        raise UserError(f"--runs: {item!r} matched nothing")
      found += [m for m in matches if (m / SUMMARY).is_file()]
      skipped += [m for m in matches if m.is_dir() and not (m / SUMMARY).is_file()]
    else:
      path = pathlib.Path(item).expanduser()
      if not (path / SUMMARY).is_file():
        raise UserError(_not_a_run(path))
      found.append(path)
  unique = list({path.resolve(): path for path in found}.values())  # Each run once.
  if not unique:
    raise UserError(f"--runs={spec!r} matched no run folder (none of the "
                    f"{len(skipped)} folders it matched has a {SUMMARY})")
  return unique, skipped


def common_parent(runs: list[pathlib.Path]) -> pathlib.Path:
  """The deepest folder holding every run (a single run's parent)."""
  resolved = [p.resolve() for p in runs]
  common = pathlib.Path(os.path.commonpath(resolved))
  return common.parent if common in resolved else common


def entries(runs: list[pathlib.Path], parent: pathlib.Path) -> list[report.Entry]:
  """Each run's record (read through mpt/records/summary.py), labelled by its folder
  relative to `parent`."""
  return [report.Entry(os.path.relpath(path.resolve(), parent),
                       summary_lib.read(path / SUMMARY), (path / SUMMARY).stat().st_mtime)
          for path in runs]


def run(opts: CompareOptions) -> dict[str, Any]:
  """`--mode=compare --runs=...`: prints the table, writes compare.md and the chart."""
  runs, skipped = find_runs(opts.runs)
  if skipped:
    names = ", ".join(p.name for p in skipped[:5]) + (", ..." if len(skipped) > 5 else "")
    print(f"mpt: compare: skipped {len(skipped)} folder(s) without {SUMMARY}: {names}")
  parent = common_parent(runs)
  out = pathlib.Path(opts.out).expanduser() if opts.out else parent
  try:
    out.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise UserError(f"cannot create --out={str(out)!r}: {e.strerror or e}") from None
  rows = report.lines(entries(runs, parent))
  print(report.text(rows), end="", flush=True)
  note = "" if out.resolve() == parent else f"Run folders are relative to `{parent}`."
  md = out / "compare.md"
  try:
    md.write_text(report.markdown(rows, note))
  except OSError as e:
    raise UserError(f"cannot write {md}: {e.strerror or e}") from None
  written = [md]
  if skipped_chart := report.plot(rows, out / "compare.png"):
    print(f"mpt: {skipped_chart}")
  else:
    written.append(out / "compare.png")
  print(f"mpt: wrote {', '.join(map(str, written))}", flush=True)
  return {"status": "completed", "run_dir": str(out), "runs": len(rows)}
