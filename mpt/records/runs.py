"""runs.csv: one line per training run, in the folder that holds the run folders.

`Row` is the one owner of the file's lines: its fields are the columns, `from_summary()`
takes a run's row from its summary.json record (mpt/records/summary.py), `append()` is
the only writer and `read()` the only reader. Every training run appends its row when
it writes summary.json, however it ended (`record()`), so `<logdir>/runs.csv` is the
logbook of everything run there: `column -s, -t < logs/runs.csv`, or a spreadsheet.

Runs started at once share the file (a sweep's cells, runs in several shells): a row
is appended as mpt/records/csvrow.py appends one, under an exclusive `flock`, and a
file written by another mpt version keeps its own header.
"""

import dataclasses
import datetime
import pathlib
import sys

from mpt.records import csvrow
from mpt.records.summary import RunSummary

FILE = "runs.csv"


@dataclasses.dataclass
class Row(csvrow.CsvRow):
  """One training run: when it ended, where, how, what ran, its headline figures."""
  time: str = ""  # When the run ended: ISO 8601, UTC, to the second.
  run_dir: str = ""
  status: str = ""  # completed, interrupted, diverged or failed (summary.json's).
  model: str = ""
  model_opts: str = ""
  policy: str = ""
  loop: str = ""
  batch_size: int | None = None
  image_size: int | None = None
  jit_compile: bool = False
  dataset: str = ""
  device: str = ""
  steps: int | None = None
  wall_s: float | None = None
  ms_per_step: float | None = None
  images_per_sec: float | None = None
  val_accuracy: float | None = None

  @classmethod
  def from_summary(cls, s: RunSummary, time: str | None = None) -> "Row":
    """The row of the run `s` records; `time` defaults to now."""
    values = {f.name: getattr(s, f.name) for f in dataclasses.fields(cls)
              if f.name != "time"}
    values = {k: v for k, v in values.items() if v is not None}  # Else the default.
    time = time or datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds")
    return cls(time=time, **values)

  def to_row(self) -> dict[str, str]:
    """The CSV row: str() of each value, None as empty; a line break (a path could
    hold one) as a space, so that a run is always one line of the file."""
    return {k: "" if v is None else " ".join(str(v).splitlines())
            for k, v in dataclasses.asdict(self).items()}


COLUMNS = tuple(f.name for f in dataclasses.fields(Row))


def append(path: pathlib.Path, row: Row) -> None:
  """Appends `row` to the CSV at `path`, as csvrow.append does."""
  csvrow.append(path, row.to_row(), COLUMNS, "\n")


def read(path: pathlib.Path) -> list[Row]:
  return csvrow.read(path, Row)


def record(summary: RunSummary) -> pathlib.Path | None:
  """Appends the run's row to runs.csv next to its folder (in --logdir, or where a
  resumed run's folder is); returns the file. Never raises: the row is bookkeeping,
  and the run's own files are already complete when it is written."""
  if not summary.run_dir:
    return None
  path = pathlib.Path(summary.run_dir).resolve().parent / FILE
  try:
    append(path, Row.from_summary(summary))
    return path
  except Exception as e:  # pylint: disable=broad-except
    print(f"mpt: could not append to {path}: {e}", file=sys.stderr, flush=True)
    return None
