"""Wing: one training run (`--mode=train`, `--mode=inspect`), start to finish.

prepare.py builds the run (`Run`) before its first step; run.py trains it and maps
its ending; record.py turns it into summary.json; loops.py and steps.py are the two
training paths; callbacks.py orders the callbacks around the one step counter;
model.py builds the model, which dryrun.py (`--mode=inspect`) inspects without
training; keras_fit.py holds every use of Keras/TF internals. Imports the ground
floor only (config, records, machine, measure, models), never another wing.
"""
