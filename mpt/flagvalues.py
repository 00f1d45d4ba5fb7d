"""The small languages of flag values, read in one place: comma-separated lists
(`--batch_sizes=16,32`, `--microbench_dtypes=...`, step windows `A,B`), key=value
options (`--model_opts=depth=10,width=32`), per-layer policies
(`--layer_policy=DepthwiseConv2D=float32`) and booleans spelled in flag values and in
mpt's CSV files.

Each reader raises UserError (mpt/errors.py) in the words of the flag it reads; the
caller says what the items are (`what`, `empty`), so that every flag keeps its own
message. Imports nothing of mpt but errors.py: config.py and every mode read flags
through it.
"""

import re
from typing import Any, Callable, Iterator

from mpt.errors import UserError


def parse_bool(text: str, lenient: bool = False) -> bool:
  """`true` / `false`, in any case -> bool; ValueError for any other text, unless
  `lenient` (a file a person may have edited): then `1` is also true, the rest false."""
  word = text.lower()
  if word in ("true", "false") or lenient:
    return word in ("true", "1")
  raise ValueError(f"{text!r} is neither true nor false")


def parse_list(spec: str, flag: str, kind: Callable[[str], Any] = str,
               what: str = "values", empty: str = "must be a comma-separated list",
               unique: bool = True) -> list:
  """`--flag="a, b,c"` -> [kind("a"), kind("b"), kind("c")]; UserError `--flag=SPEC
  <empty>` for an empty item (`""` is one), `must list <what>` for an item `kind`
  refuses (ValueError/KeyError), `lists a value twice` (when `unique`)."""
  items = [s.strip() for s in spec.split(",")]
  if "" in items:
    raise UserError(f"--{flag}={spec!r} {empty}")
  try:
    values = [kind(s) for s in items]
  except (ValueError, KeyError):
    raise UserError(f"--{flag}={spec!r} must list {what}") from None
  if unique and len(set(values)) != len(values):
    raise UserError(f"--{flag}={spec!r} lists a value twice")
  return values


def parse_kv(spec: str, flag: str) -> Iterator[tuple[str, str]]:
  """`--flag="a=1, b = x"` -> ("a", "1"), ("b", "x"), in order, stripped; UserError
  on reaching an item that is not key=value."""
  for item in spec.split(","):
    key, eq, value = (s.strip() for s in item.partition("="))
    if not eq or not key:
      raise UserError(f"--{flag}={spec!r}: {item!r} is not key=value")
    yield key, value


def parse_patterns(spec: str, flag: str, valid: tuple[str, ...]) -> list[tuple[str, str]]:
  """`--flag=PATTERN=VALUE,...` -> [(pattern, value)] in order; each VALUE one of
  `valid`, each PATTERN a regular expression (a plain name is one)."""
  found = []
  for item in filter(None, (i.strip() for i in spec.split(","))):
    pattern, eq, value = item.rpartition("=")
    if not eq or not pattern:
      raise UserError(f"--{flag}: {item!r} is not PATTERN=POLICY")
    if value not in valid:
      raise UserError(f"--{flag}: unknown policy {value!r} in {item!r}; "
                      f"valid: {', '.join(valid)}")
    try:
      re.compile(pattern)
    except re.error as e:
      raise UserError(f"--{flag}: {pattern!r} is not a regular expression "
                      f"({e})") from None
    found.append((pattern, value))
  return found


def parse_steps(spec: str, flag: str) -> tuple[int, int] | None:
  """A step window flag, `"A,B"` -> (A, B) with 1 <= A <= B; `""` -> None."""
  if not spec:
    return None
  try:
    first, last = parse_list(spec, flag, int, unique=False)
  except (UserError, ValueError):  # One message for any fault.
    raise UserError(f"--{flag}={spec!r} must be two step numbers A,B") from None
  if first > last:
    raise UserError(f"--{flag}={spec}: the window is reversed ({first} > {last})")
  if first < 1:
    raise UserError(f"--{flag}={spec}: steps count from 1")
  return first, last
