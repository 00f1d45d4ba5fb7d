"""Wing: `--mode=compare`, finished runs side by side in one table.

run.py finds the run folders (--runs, globs allowed) and writes the outputs; report.py
lays out the table (compare.md, the terminal's text) and the bar chart (compare.png);
options.py holds the mode's own flags. Reads the runs' summary.json through
mpt/records/summary.py; imports the ground floor only, and no TensorFlow.
"""
