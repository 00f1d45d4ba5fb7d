"""Wing: one training run (`--mode=train`, `--mode=inspect`), start to finish.

run.py wires the run; loops.py and steps.py are the two training paths; callbacks.py
orders the callbacks around the one step counter; keras_fit.py holds every use of
Keras/TF internals. Imports the ground floor only (config, records, machine, measure,
models), never another wing.
"""
