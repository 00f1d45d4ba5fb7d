"""sweep.csv: a sweep's cells, one row each, typed.

`Cell` is the one owner of the file's rows: its fields are the CSV columns in file
order, `from_row()` is the only parser of a row (how a cell's XLA setting or a missing
figure is spelled in the file is decided here, once: mpt/records/csvrow.py) and
`to_row()` the only writer.
The sweep appends a row as each cell finishes (`append_csv`); the sweep's report and
the sweep's diagnosis read them back (`read_csv`). A cell run again appends another
row: readers see the newest row of each cell. A finished cell's figures come from its
run's summary.json (`figures_from_summary`), read through mpt/records/summary.py.
"""

import dataclasses
import pathlib
from typing import Any

from mpt.records import csvrow
from mpt.records import summary as summary_lib


@dataclasses.dataclass
class Cell(csvrow.CsvRow):
  """One sweep cell: what ran (the axes), how it ended, its figures, where."""
  model: str = ""
  image_size: int = 0
  batch_size: int = 0
  policy: str = ""
  loop: str = ""
  jit_compile: bool = False
  # ok, OOM, OOM (predicted), timeout, failed, diverged or interrupted: how the
  # cell's run recorded itself (mpt/sweep/cell.py), else what the sweep saw.
  status: str = ""
  # Figures of an `ok` cell (from its summary.json); None where not measured.
  ms_per_step: float | None = None
  images_per_sec: float | None = None
  peak_rss_mb: float | None = None
  cpu_percent: float | None = None
  val_accuracy: float | None = None
  device: str = ""
  error: str = ""  # Why a cell did not finish: its last error line.
  run_dir: str = ""
  # What the numbers were measured on (mpt/machine/hardware.py's `environment()`).
  tf_version: str = ""
  cpu: str = ""
  cpu_isa: str = ""
  # The machine it ran on, with --launcher=ray (a node's `machine:NAME` resource, or its
  # CPU/GPU model); "" on this machine.
  machine: str = ""
  # What Ray reserved for the cell on its node (--launcher=ray; mpt/sweep/requests.py):
  # None where it reserved none, or on this machine.
  granted_gpus: float | None = None
  granted_memory_mb: float | None = None
  # Added later, so last (a file an older mpt began keeps its columns): --seeds runs
  # each cell once per seed; the final metrics, for accuracy beside speed
  # (mpt/records/spread.py: float32's spread over seeds).
  seed: int = 0
  train_loss: float | None = None
  train_accuracy: float | None = None
  val_loss: float | None = None

  @property
  def id(self) -> str:
    """The cell's name (its run folder under cells/, and sweep.csv's key)."""
    on = "_on_" + "".join(ch if ch.isalnum() or ch in "-." else "-"
                          for ch in self.machine) if self.machine else ""
    return (f"{self.model}_{self.image_size}px_b{self.batch_size}_{self.policy}_"
            f"{self.loop}{'_xla' if self.jit_compile else ''}"
            f"{f'_s{self.seed}' if self.seed else ''}{on}")

  @property
  def label(self) -> str:
    """The cell for a human, in a table."""
    return (f"{self.model} {self.image_size}px b{self.batch_size} {self.policy} "
            f"{self.loop}{' xla' if self.jit_compile else ''}"
            f"{f' seed {self.seed}' if self.seed else ''}"
            f"{' on ' + self.machine if self.machine else ''}")

  @property
  def ms(self) -> float | None:
    """ms/step of a cell that finished; None for any other (an OOM has no figure)."""
    return self.ms_per_step if self.status == "ok" else None

  def to_row(self) -> dict[str, str]:
    """The CSV row: str() of each value (bools True/False), None as empty."""
    return {k: "" if v is None else str(v) for k, v in dataclasses.asdict(self).items()}


COLUMNS = tuple(f.name for f in dataclasses.fields(Cell))


def read_csv(path: pathlib.Path) -> list[Cell]:
  """sweep.csv's cells, the newest row of each, in the order the cells first appear;
  [] if there is no file yet."""
  return list({cell.id: cell for cell in csvrow.read(path, Cell)}.values())


def append_csv(path: pathlib.Path, cell: Cell) -> None:
  """Appends the cell's row (the header first, into a new file), written at once: a
  sweep stopped later keeps it. A file an older mpt began keeps its own columns (a
  sweep resumed there loses the newer ones rather than write ragged rows)."""
  csvrow.append(path, cell.to_row(), COLUMNS, "\r\n")  # csv's own line end, as ever.


def figures_from_summary(path: pathlib.Path) -> dict[str, Any]:
  """A finished cell's figures, from its run's summary.json (Cell fields)."""
  s = summary_lib.read(path)
  rss, cpu = (s.util.rss_mb, s.util.process_cpu_percent) if s.util else (None, None)
  return {**{k: getattr(s, k) for k in ("ms_per_step", "images_per_sec", "val_accuracy",
                                         "train_loss", "train_accuracy", "val_loss")},
          "device": s.device or "", "peak_rss_mb": rss.max if rss else None,
          "cpu_percent": cpu.mean if cpu else None}
