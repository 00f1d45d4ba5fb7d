"""Wing: `--mode=diagnose`, why mixed precision did or did not speed a run up.

diagnosis.py is the one entry for run, sweep and profile folders; evidence.py reads
a run folder, detectors/ and sweep.py find what holds it back, opstats.py reads the
profiler trace's op statistics, gpu_evidence.py a GPU capture and mixed_float16's
bound on it, profile.py diagnoses a folder with only a capture (and several side by
side), report.py formats and writes the result; findings.py words the findings,
thresholds.py holds every cut-off, options.py the mode's flags. Reads the files the other
wings leave (through mpt/records), never imports them.
"""
