"""Wing: one training run (`--mode=train`, `--mode=inspect`), start to finish.

prepare.py builds the run (`Run`) before its first step; run.py trains it and maps
its ending; record.py turns it into summary.json; loops.py and steps.py are the two
training paths; callbacks.py orders the callbacks around the one step counter;
model.py builds the model, which dryrun.py (`--mode=inspect`) inspects without
training; keras_fit.py holds every use of Keras/TF internals. cost.py times the step
per policy before step 1 (the one timer, `time_candidates`), for the command line's
model and, through scriptcost.py, for a script's (library.py, tracker.py). Imports the ground
floor only (config, records, machine, measure, models), never another wing.
"""
