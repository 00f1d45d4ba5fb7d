"""`--mode=compare`'s own flags: the run folders, and where the table goes."""

import dataclasses

from mpt.config import flag


@dataclasses.dataclass
class CompareOptions:
  """Field names are the command-line flag names (mpt/main.py)."""
  runs: str = flag("", "--mode=compare: run folders to compare, comma-separated; globs "
                     "allowed (`--runs='logs/*'`: what is not a run folder is skipped).")
  out: str = flag("", "--mode=compare: folder for compare.md and compare.png "
                    "(default: the folder holding the runs, their common parent).")
