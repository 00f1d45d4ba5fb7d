"""Typed CSV rows: the one parser, reader and appender of the dataclass rows of
sweep.csv (cells.py) and runs.csv (runs.py). A column's text becomes its field's type
(bool, int, float or str, each possibly `| None`); a missing or empty column takes the
field's default. Bools are written True/False; a hand-edited file may say true or 1
(mpt/flagvalues.py's `parse_bool`, leniently: any other text is false).

Processes started at once share a file (a sweep's cells, runs in several shells), so a
row is written under an exclusive `flock` on the file, as one `write` of the whole
line (and of the header too, when the file was empty). A file written by another mpt
version keeps its own header: a row is written in that header's column order, with a
column this version does not have left empty (and one that header lacks left out,
rather than write ragged rows).
"""

import csv
import dataclasses
import fcntl
import io
import os
import pathlib
import typing
from typing import Any

from mpt import flagvalues


def parse(cls, row: dict[str, str]) -> Any:
  """An instance of the dataclass `cls` from a CSV row of strings."""
  values: dict[str, Any] = {}
  for f in dataclasses.fields(cls):
    text = row.get(f.name)
    if text in ("", None):
      continue
    # `int | None` -> int; a plain type as it is.
    kind = next((a for a in typing.get_args(f.type) if a is not type(None)), f.type)
    values[f.name] = (flagvalues.parse_bool(text, lenient=True) if kind is bool
                      else kind(text))
  return cls(**values)


class CsvRow:
  """A dataclass whose fields are a CSV file's columns."""

  @classmethod
  def from_row(cls, row: dict[str, str]):
    """A CSV row (strings; a missing or empty column takes the default)."""
    return parse(cls, row)


def read(path: pathlib.Path, cls) -> list:
  """Every row of the file as a `cls`, in file order; [] if there is no file yet."""
  path = pathlib.Path(path)
  if not path.exists():
    return []
  with path.open(newline="") as f:
    return [parse(cls, row) for row in csv.DictReader(f)]


def _line(values, end: str) -> str:
  out = io.StringIO()
  csv.writer(out, lineterminator=end).writerow(values)
  return out.getvalue()


def append(path: pathlib.Path, values: dict[str, str], columns: tuple[str, ...],
           end: str) -> None:
  """Appends a row of `values` (the header `columns` first into a new or empty file;
  each line ended by `end`), safely while other processes append to it too."""
  path = pathlib.Path(path)
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)  # Released when fd is closed.
    if os.fstat(fd).st_size == 0:
      data = _line(columns, end) + _line((values[c] for c in columns), end)
    else:
      with path.open(newline="") as f:
        header = next(csv.reader(f), None) or list(columns)
      data = _line((values.get(c, "") for c in header), end)
    data = data.encode()
    # One write: with O_APPEND it lands at the end whole; a short one means the disk
    # is full, an error like any other.
    if os.write(fd, data) != len(data):
      raise OSError(f"{path}: short write (disk full?)")
  finally:
    os.close(fd)
