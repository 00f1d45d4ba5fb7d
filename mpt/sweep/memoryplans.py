"""What a sweep knows of memory before it starts a cell: the plan a finished cell of
the same model and image size recorded (summary.json's `memory`), which tells whether
a larger batch will fit, so that a cell that will not is recorded as `OOM (predicted)`
without being started (--force runs it).
"""

import pathlib

from mpt.records import summary as summary_lib
from mpt.records.cells import Cell
from mpt.records.memory import MemoryPlan


def predicted_oom(plans: dict[tuple, MemoryPlan], cell: Cell) -> str | None:
  """Why `cell` will not fit, from the memory estimate a finished cell of the same
  model and image size recorded (summary.json's `memory`: each policy's fixed and
  per-example megabytes, and what was available); None if it fits or is unknown."""
  plan = plans.get((cell.model, cell.image_size))
  line = plan.policies.get(cell.policy) if plan else None
  if not line:
    return None
  from mpt.measure import memory  # psutil only: no TensorFlow here.
  available, where = memory.available_mb()
  if memory.fits(line, cell.batch_size, available):
    return None
  largest = memory.largest_batch(line, available + line.baseline_mb)
  return (f"needs ~{memory.human(line.total_mb(cell.batch_size))}, "
          f"{memory.human(available)} {where}; largest batch that fits ~{largest}")


def learn(plans: dict[tuple, MemoryPlan], cell: Cell) -> None:
  """Keeps the memory plan a completed cell recorded, for the cells after it."""
  path = pathlib.Path(cell.run_dir or "") / "summary.json"
  if cell.status == "ok" and path.exists():
    mem = summary_lib.read(path).memory
    if mem and mem.policies:
      plans[(cell.model, cell.image_size)] = mem
