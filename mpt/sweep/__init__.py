"""Wing: `--mode=sweep`, a grid of training runs, each a child `python -m mpt.main`.

run.py runs the cells and resumes, cell.py runs one and reads how it ended,
cluster.py and requests.py run them as Ray tasks, memoryplans.py skips a batch
already known not to fit; report.py writes sweep.md and sweep.png; options.py
holds the sweep's own flags. Imports the ground floor only; the diagnosis after a sweep
is started by mpt/main.py.
"""
