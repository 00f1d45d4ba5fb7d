"""Run folders: one fresh folder per run under the logs root.

A run never overwrites an earlier one: the folder is created with `mkdir` (atomic, so
two runs started at once cannot share it) and gets a `-1`, `-2`, ... suffix when the
name is taken. The files in it that other tools read (summary.json) are written
atomically by mpt/files.py's `write_json`.
"""

import datetime
import os
import pathlib
import re
from typing import Callable

from mpt.config import Config
from mpt.errors import UserError

# What mpt/main.py hands a wing to run on a finished run or sweep folder (the
# diagnosis, which no wing imports): its Markdown for the run's TensorBoard text, or
# None.
AfterRun = Callable[[pathlib.Path], str | None]


def default_name(cfg: Config, mode: str = "train") -> str:
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  if mode == "microbench":  # Measures the machine, not a model or a policy.
    return f"{stamp}_microbench"
  what = cfg.loop if mode == "train" else mode
  # `keras:ResNet50` -> keras-ResNet50, `my.nets:tiny` -> my.nets-tiny: a folder name.
  model = re.sub(r"[^\w.-]+", "-", cfg.model)
  return f"{stamp}_{model}_{cfg.policy}_{what}"


def check_root(cfg: Config) -> None:
  """Fails fast, before any data is loaded, if no run folder can be made under logdir."""
  root = pathlib.Path(cfg.logdir).expanduser()
  try:
    root.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise UserError(f"cannot create --logdir={str(root)!r}: {e.strerror or e}") from None
  if not os.access(root, os.W_OK | os.X_OK):
    raise UserError(f"--logdir={str(root)!r} is not writable")


def create(cfg: Config, mode: str = "train") -> pathlib.Path:
  """Creates and returns a new, empty run folder for a `mode` run (named after it
  unless --run_name says); UserError if the root is unusable."""
  root = pathlib.Path(cfg.logdir).expanduser()
  name = cfg.run_name or default_name(cfg, mode)
  if "/" in name or name in (".", ".."):
    raise UserError(f"--run_name={name!r} must be a plain folder name")
  try:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(10_000):
      path = root / (name if i == 0 else f"{name}-{i}")
      try:
        path.mkdir()
        return path
      except FileExistsError:
        continue
  except OSError as e:
    raise UserError(f"cannot create a run folder under --logdir={str(root)!r}: "
                    f"{e.strerror or e}") from None
  raise UserError(f"too many runs named {name!r} under {root}")
