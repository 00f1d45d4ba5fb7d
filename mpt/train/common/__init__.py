"""Room: what every run is made of, whoever drives it (the command line, a script's
fit, a script's loop). Imports no other room.

model.py      the run's model from its config (the registry, --batchnorm, the policy)
steps.py      the loss, metrics and compiled train/eval steps both loops share
precision.py  the policy set and described, the optimizer (loss scaling), its state
keras_fit.py  every Keras/TensorFlow internal mpt touches, with its versions
numerics.py   when and on which batches a run's numerics are sampled (both entries)
besteffort.py inside a script's training, a failing part is a line, never an error
figures.py    the RunSummary figures of a step timer and an optimizer (both entries)
plan.py       the run's flags resolved once into a typed Plan
learnt.py     BeforeStep1: what a run learnt before step 1, one record for both entries
stepflops.py  the step's FLOPs, counted from the ops of its traced graph
countstep.py  when the step's FLOPs are counted (after step 1, by a callback)
overflow.py   which op made a skipped step overflow (its batch replayed)
ending.py     the one end of every run: summary.json, runs.csv, the diagnosis
"""
