"""What a sweep cell asks its Ray node for (mpt/sweep/cluster.py): CPUs (--cell_cpus),
GPUs (--cell_gpus) and memory, the preflight's estimate of its peak.

GPUs: `auto` asks for one where the machine's nodes have GPUs (one cell per GPU at a
time: two sharing one would spoil each other's step times), none elsewhere (a cell
given none sees none: mpt/sweep/cluster.py). A cell that asks for more GPUs than any
node of its machine has fails at once, in one line.

Memory: a cell's own preflight estimates a step's peak for every policy before step
1 and records it (summary.json's `memory`: a line in the batch size per policy). The
first cell of each machine, model and image size runs as a pilot, asking for no
memory (its own preflight checks its node); the others of that group wait for it and
then ask Ray for their estimate, so that a node runs no more cells at once than its
memory holds. A cell whose estimate exceeds the `memory` resource of every node of its
machine is recorded as `OOM (predicted)` without being started (Ray would hold it,
infeasible, for ever). `--force` asks for no memory and predicts nothing.
"""

import collections
import dataclasses

from mpt.errors import UserError
from mpt.records.cells import Cell
from mpt.records.memory import MemoryPlan
from mpt.sweep import memoryplans

MB = 2 ** 20


@dataclasses.dataclass
class Place:
  """Where a machine's cells go: the task options that put them there, and what the
  machine's nodes offer."""
  options: dict
  memory_mb: float = 0.0  # The largest Ray `memory` resource of its nodes.
  gpus: float = 0.0  # The fewest GPUs of its nodes.
  nodes: tuple[str, ...] = ()  # Their Ray node ids.
  most_gpus: float = 0.0  # The most GPUs of one of its nodes.


def place(nodes: list[dict], options: dict) -> Place:
  """The Place of `nodes` (ray.nodes() entries) reached with `options`."""
  return Place(options, max((n["Resources"].get("memory", 0) / MB for n in nodes),
                            default=0.0),
               min((n["Resources"].get("GPU", 0) for n in nodes), default=0.0),
               tuple(n.get("NodeID", "") for n in nodes),
               max((n["Resources"].get("GPU", 0) for n in nodes), default=0.0))


def parse_gpus(flag: str) -> float | None:
  """--cell_gpus: None for `auto`, else a number of GPUs; UserError if neither."""
  if flag.strip() == "auto":
    return None
  try:
    gpus = float(flag)
  except ValueError:
    gpus = -1.0
  if gpus < 0:
    raise UserError(f"--cell_gpus: {flag!r} is neither `auto` nor a number of GPUs >= 0")
  return gpus


class Planner:
  """Each cell's task options, learnt as the sweep goes: `take` a cell to submit it,
  tell `ended` of each cell that ended, and take the cells it releases."""

  def __init__(self, cell_cpus: int, cell_gpus: str, force: bool,
               places: dict[str, Place]):
    self.cpus, self.gpus, self.force = cell_cpus, parse_gpus(cell_gpus), force
    self.places = places
    self.plans: dict[str, dict[tuple, MemoryPlan]] = collections.defaultdict(dict)
    self.pilots: dict[tuple, str] = {}  # Group -> the id of the cell piloting it.
    self.held: dict[tuple, list[Cell]] = collections.defaultdict(list)
    self.unplanned: set[tuple] = set()  # Groups whose pilot recorded no plan.

  def take(self, cell: Cell) -> dict | Cell | None:
    """The task options to submit `cell` with; or the cell, ended `OOM (predicted)`
    (or `failed`: more GPUs than its nodes have); or None: held until its group's
    pilot ends (`ended` gives it back)."""
    where = self.places[cell.machine]
    gpus = self.gpus if self.gpus is not None else min(where.gpus, 1.0)
    options = {"num_cpus": self.cpus, "num_gpus": gpus, **where.options}
    if gpus > where.most_gpus:  # Ray would hold it, infeasible, for ever.
      return dataclasses.replace(cell, status="failed", error=(
          f"--cell_gpus: asks for {gpus:g} GPU(s); no node of "
          f"{cell.machine or 'the cluster'} has more than {where.most_gpus:g}"))
    group = (cell.machine, cell.model, cell.image_size)
    plan = self.plans[cell.machine].get(group[1:])
    if self.force or where.memory_mb <= 0 or group in self.unplanned:
      return options
    if plan is None:
      if group in self.pilots:
        self.held[group].append(cell)
        return None
      self.pilots[group] = cell.id
      return options
    line = plan.policies.get(cell.policy)
    if line is None:
      return options
    need = line.total_mb(cell.batch_size)
    if need > where.memory_mb:
      from mpt.measure import memory  # psutil only: no TensorFlow here.
      return dataclasses.replace(cell, status="OOM (predicted)", error=(
          f"needs ~{memory.human(need)} (the preflight's estimate); no node of "
          f"{cell.machine or 'the cluster'} offers more than "
          f"{memory.human(where.memory_mb)} of Ray memory"))
    return {**options, "memory": int(need * MB)}

  def ended(self, cell: Cell) -> list[Cell]:
    """Learns the memory plan `cell` recorded; the cells its end releases."""
    memoryplans.learn(self.plans[cell.machine], cell)
    group = (cell.machine, cell.model, cell.image_size)
    if self.pilots.get(group) != cell.id:
      return []
    del self.pilots[group]
    if group[1:] not in self.plans[cell.machine]:  # Failed: the rest ask for none.
      self.unplanned.add(group)
    return self.held.pop(group, [])
