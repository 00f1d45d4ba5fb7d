"""Wing: `--mode=diagnose`, why mixed precision did or did not speed a run up.

diagnosis.py is the one entry for run and sweep folders; evidence.py reads a run
folder, detectors.py and sweep.py find what holds it back, opstats.py reads the
profiler trace, report.py formats and writes the result. Reads the files the other
wings leave (through mpt/records), never imports them.
"""
