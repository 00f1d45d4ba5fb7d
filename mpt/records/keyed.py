"""Records cached by what they are valid for (a model signature, the machine, TF and
its settings: a `key` dict): one file per key under the cache root
(~/.cache/mpt/KIND/, or $MPT_CACHE), read back only for the same key and schema. The
step's cost (mpt/records/cost.py) and the per-layer cost (mpt/records/layers.py) are
cached this way, and `stand_in` reads the variable that stands in for either
($MPT_COST, $MPT_LAYERS: a recorded file, or `none`).
"""

import hashlib
import json
import os
import pathlib
from typing import Any, Callable, TypeVar

from mpt import files

T = TypeVar("T")


def path(kind: str, key: dict[str, Any]) -> pathlib.Path:
  digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
  name = key["model"].replace(":", "_").replace("/", "_")
  return files.cache_root() / kind / f"{name}-{digest}.json"


def read(where: pathlib.Path, schema: int, what: str,
         from_dict: Callable[[dict[str, Any]], T]) -> T:
  """A record file of `schema`; ValueError/OSError if it is not one."""
  data = json.loads(pathlib.Path(where).read_text())
  if not isinstance(data, dict) or data.get("schema") != schema:
    raise ValueError(f"{where}: not a {what} record of schema {schema}")
  return from_dict(data)


def cached(kind: str, key: dict[str, Any], read_one: Callable[[pathlib.Path], T]
           ) -> T | None:
  """The record cached for `key` (its `source` set to the file), or None: missing,
  unreadable, or made for another key."""
  where = path(kind, key)
  try:
    found = read_one(where)
  except (OSError, ValueError, TypeError):
    return None
  if found.key != key:
    return None
  found.source = f"cache: {where}"
  return found


def save(kind: str, record) -> pathlib.Path:
  """Writes `record` (with a `key`) to its cache file, as measured here."""
  where = path(kind, record.key)
  where.parent.mkdir(parents=True, exist_ok=True)
  files.write_json(where, {**record.to_dict(), "source": "measured"})
  return where


def stand_in(env: str, read_one: Callable[[pathlib.Path], T]
             ) -> tuple[bool, T | None, str | None]:
  """(whether $`env` stands in for the measurement, the record it names, its source
  set, or None; a note where that file cannot be read): `none` stands in for no
  measurement at all."""
  value = os.environ.get(env)
  if not value or value == "none":
    return bool(value), None, None
  try:
    found = read_one(pathlib.Path(value))
  except (OSError, ValueError, TypeError) as e:
    return True, None, f"{env}={value} cannot be read ({e}); nothing measured"
  found.source = f"recorded: {value}"
  return True, found, None
