"""The diagnosis' own flag: the run or sweep folder to explain."""

import dataclasses

from mpt.config import flag


@dataclasses.dataclass
class DiagnoseOptions:
  """Field names are the command-line flag names (mpt/main.py)."""
  run: str = flag("", "--mode=diagnose: the run or sweep folder (logs/<run>) to "
                    "explain: why mixed precision did or did not speed it up.")
