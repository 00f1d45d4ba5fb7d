"""Reading a typed CSV row back: the one parser of the dataclass rows of sweep.csv
(cells.py) and runs.csv (runs.py). A column's text becomes its field's type (bool,
int, float or str, each possibly `| None`); a missing or empty column takes the
field's default. Bools are written True/False; a hand-edited file may say true or 1
(mpt/flagvalues.py's `parse_bool`, leniently: any other text is false).
"""

import dataclasses
import types
import typing
from typing import Any

from mpt import flagvalues


def _kind(annotation) -> type:
  """`int | None` -> int; a plain type as it is."""
  if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
    return next(a for a in typing.get_args(annotation) if a is not type(None))
  return annotation


def parse(cls, row: dict[str, str]) -> Any:
  """An instance of the dataclass `cls` from a CSV row of strings."""
  values: dict[str, Any] = {}
  for f in dataclasses.fields(cls):
    text = row.get(f.name)
    if text in ("", None):
      continue
    kind = _kind(f.type)
    values[f.name] = (flagvalues.parse_bool(text, lenient=True) if kind is bool
                      else kind(text))
  return cls(**values)
