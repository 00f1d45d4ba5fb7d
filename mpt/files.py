"""Files mpt keeps: how it writes the JSON files other tools read, where its cache
lives, and the TensorFlow version that keys the cache's entries.

The ground floor's ground: anything of mpt may import this module, and it imports
nothing of mpt, nor TensorFlow.

- `write_json` writes to a temporary name and renames it into place, so that a
  reader (the diagnosis, a sweep, a second run) never sees half a file.
- `cache_root()` is ~/.cache/mpt, or $MPT_CACHE: the generated synthetic data, the
  microbenchmark's rates and kernel table, the measured step costs (the test suite
  points it at a folder of its own session).
- `tf_version()` is the installed TensorFlow's version, read from its package
  metadata without importing it: a cached measurement is valid for one version only.
"""

import importlib.metadata
import json
import os
import pathlib
from typing import Any


def write_json(path: pathlib.Path, obj: Any) -> None:
  """Writes `obj` as indented, key-sorted JSON to `path`, atomically."""
  tmp = path.with_name(f".{path.name}.tmp")
  tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
  os.replace(tmp, path)


def cache_root() -> pathlib.Path:
  """mpt's cache folder: $MPT_CACHE, else ~/.cache/mpt (not created here)."""
  return pathlib.Path(os.environ.get("MPT_CACHE", "~/.cache/mpt")).expanduser()


def tf_version() -> str:
  """The installed TensorFlow's version, without importing it; "?" if none is."""
  try:
    return importlib.metadata.version("tensorflow")
  except importlib.metadata.PackageNotFoundError:
    return "?"
