"""The diagnosis' own flag: the run, sweep or profile folder(s) to explain."""

import dataclasses

from mpt.config import flag


@dataclasses.dataclass
class DiagnoseOptions:
  """Field names are the command-line flag names (mpt/main.py)."""
  run: str = flag("", "--mode=diagnose: the run or sweep folder (logs/<run>) to "
                    "explain: why mixed precision did or did not speed it up; or any "
                    "folder with a profiler capture (a TensorBoard logdir); several, "
                    "comma-separated, are compared side by side.")
