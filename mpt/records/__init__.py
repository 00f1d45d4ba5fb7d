"""Ground floor: the files that cross between parts, each with one typed owner.

rundir.py (run folders; atomic JSON is mpt/files.py), summary.py (RunSummary: summary.json),
cells.py (Cell: one sweep.csv row), runs.py (Row: one runs.csv line per training run), csvrow.py (reading
both files' rows back into their types).
"""
