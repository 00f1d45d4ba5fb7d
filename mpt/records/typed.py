"""Reading a record back into its type: one rule for every dataclass in mpt/records/.

`from_dict(cls, data)` builds `cls` from a JSON object, recursively: a field typed as
a dataclass (or `X | None`, `list[X]`, `dict[str, X]` of one) is built from its part of
the object the same way. A key the type does not know is dropped, so that a file a
newer mpt wrote still reads (a record's `DERIVED` names the keys it writes
for readers but computes from its fields); `unknown`, when given, collects each such key by its path
("policy_verdict.ratio"), which is how the tests prove that the files mpt writes and
the recorded ones read back without losing a field: a renamed field shows there, and
reading it as an attribute fails, where a dict's `.get()` would have read None.
"""

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def _value(hint, value, unknown: list[str] | None, path: str):
  """`value` as `hint` reads it: a record (or `X | None`, `list[X]`, `dict[str, X]` of
  one) built by `from_dict`; anything else as it is."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if value is None:
    return value
  if dataclasses.is_dataclass(hint):
    return value if isinstance(value, hint) else from_dict(hint, value, unknown, path)
  if origin in (typing.Union, types.UnionType):
    found = [a for a in args if a is not type(None)]
    return _value(found[0], value, unknown, path) if len(found) == 1 else value
  if origin is list and args and dataclasses.is_dataclass(args[0]):
    return [_value(args[0], v, unknown, f"{path}[{i}]") for i, v in enumerate(value)]
  if origin is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
    return {k: _value(args[1], v, unknown, f"{path}.{k}") for k, v in value.items()}
  return value


def from_dict(cls: type[T], data: dict[str, Any], unknown: list[str] | None = None,
              path: str = "") -> T:
  """`cls` from `data`; keys `cls` has no field for are dropped (and listed in
  `unknown`, by path); fields `data` lacks take their defaults. ValueError, naming
  the record by its path, when `data` is no such record (not an object, or without
  a field that has no default)."""
  if not isinstance(data, dict):
    raise ValueError(f"{path or cls.__name__}: not a JSON object")
  hints = _hints(cls)
  fields = {f.name for f in dataclasses.fields(cls) if f.init}
  derived = getattr(cls, "DERIVED", ())  # Written for readers, computed on reading.
  values = {}
  for key, value in data.items():
    where = f"{path}.{key}" if path else key
    if key in fields:
      values[key] = _value(hints[key], value, unknown, where)
    elif unknown is not None and key not in derived:
      unknown.append(where)
  try:
    return cls(**values)
  except TypeError as e:  # A required field is missing.
    raise ValueError(f"{path or cls.__name__}: {e}") from None


def to_dict(record) -> dict[str, Any]:
  """`record` as a JSON object, recursively; a nested record that writes itself
  (its own `to_dict`, e.g. with derived figures for readers) does so."""
  return {f.name: _plain(getattr(record, f.name)) for f in dataclasses.fields(record)}


def _plain(value):
  if dataclasses.is_dataclass(value):
    own = getattr(type(value), "to_dict", None)
    return own(value) if own is not None else to_dict(value)
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  if isinstance(value, dict):
    return {k: _plain(v) for k, v in value.items()}
  return value


class Record:
  """A record that is a file of its own (cost.json, layers.json, numerics.json, the
  oneDNN choice): written as its fields, read back by `from_dict` above."""

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, data: dict[str, Any]):
    return from_dict(cls, data)
