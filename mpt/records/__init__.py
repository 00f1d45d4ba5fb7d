"""Ground floor: the files that cross between parts, each with one typed owner.

rundir.py (run folders; atomic JSON is mpt/files.py), summary.py (RunSummary:
summary.json), cells.py (Cell: one sweep.csv row), runs.py (Row: one runs.csv line per
training run), csvrow.py (both files' rows read and appended); what summary.json
holds: program.py (a script's fits), cost.py (the step's cost per policy, and how a
ratio is said), verdict.py (the policy verdict and --policy=auto's candidates),
layers.py (the per-layer cost), memory.py (the memory plan), numerics.py
(numerics.json), machine.py (hardware and utilisation), gpu.py (a GPU capture),
spread.py (accuracy beside float32's spread); keyed.py (the cache by key) and typed.py
(reading any record back).
"""
