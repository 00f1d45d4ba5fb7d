"""The sweep's own flags: its axes and the cell timeout (--force is Config's). A cell's run
is a plain Config (mpt/config.py) with one value per axis."""

import dataclasses

from mpt.config import flag


@dataclasses.dataclass
class SweepOptions:
  """Field names are the command-line flag names (mpt/main.py)."""
  batch_sizes: str = flag("", "--mode=sweep: batch sizes, comma-separated "
                            "(default: --batch_size).")
  policies: str = flag("", "--mode=sweep: policies, comma-separated (default: "
                         "--policy).")
  loops: str = flag("", "--mode=sweep: loops, comma-separated (default: --loop).")
  image_sizes: str = flag("", "--mode=sweep: image sizes (default: --image_size).")
  models: str = flag("", "--mode=sweep: model variants (default: --model).")
  jit_compiles: str = flag("", "--mode=sweep: `false,true` runs every cell with and "
                             "without XLA (default: --jit_compile).")
  cell_timeout: float = flag(0.0, "--mode=sweep: seconds before a cell is killed "
                               "and recorded as `timeout`; 0 = no limit.")

