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
  seeds: int = flag(1, "--mode=sweep: runs each cell with N seeds (--seed, --seed+1, "
                      "...): the report gives each policy's final metrics beside "
                      "float32's spread over them.", lower_bound=1)
  cell_timeout: float = flag(0.0, "--mode=sweep: seconds before a cell is killed "
                               "and recorded as `timeout`; 0 = no limit.")
  launcher: str = flag("local", "--mode=sweep: where cells run: `local` (child "
                       "processes of this machine, one at a time) or `ray` (Ray tasks on "
                       "a cluster: pip install -e '.[cluster]'; mpt/sweep/cluster.py).",
                       choices=("local", "ray"))
  ray_address: str = flag("", "--mode=sweep --launcher=ray: the cluster to use "
                          "(`ray start --head` prints it); empty: mpt starts a local "
                          "one on this machine, reachable only from it.")
  machines: str = flag("one", "--mode=sweep --launcher=ray: `all` runs every cell once "
                       "on each distinct machine of the cluster (CPU/GPU model, or a "
                       "node's `machine:NAME` resource); `one`: anywhere.",
                       choices=("one", "all"))
  cell_cpus: int = flag(1, "--mode=sweep --launcher=ray: CPUs a cell asks its node "
                        "for (Ray runs no more cells at once than fit).", lower_bound=1)
  cell_gpus: str = flag("auto", "--mode=sweep --launcher=ray: GPUs a cell asks its node "
                        "for; `auto`: 1 on a machine whose nodes have GPUs, else 0 (a "
                        "cell given none sees none).")
  shared_logdir: bool = flag(False, "--mode=sweep --launcher=ray: --logdir is a path "
                             "every node sees at the same place (NFS, a SLURM scratch): "
                             "cells write their run folders there, nothing is copied back.")
